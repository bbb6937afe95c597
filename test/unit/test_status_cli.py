"""status and the CLI surface: help, usage errors, JSON."""

from __future__ import annotations

import json

import pytest
from conftest import Project

from xpu_series.cli import main
from xpu_series.commands import VERBS


def test_status_lists_applied_patches_and_edits(three_patches: Project) -> None:
    assert three_patches.run("apply").code == 0
    (three_patches.tree / "python/sglang/srt/other.py").write_text("# wip\n")
    data = json.loads(three_patches.run("status", "--json").out)
    assert data["exists"] is True
    assert data["upstream"]["version"] == "0.0.1"
    assert [p["status"] for p in data["patches"]] == ["applied"] * 3
    assert any("other.py" in line for line in data["local_edits"])
    assert data["ok"] is False


def test_status_before_apply_says_what_to_run(project: Project, tmp_path) -> None:
    result = project.run("status", "--tree", str(tmp_path / "none"))
    assert result.code == 0 and "run 'xpu-series apply'" in result.out


def test_status_sees_a_series_change(three_patches: Project) -> None:
    three_patches.run("apply")
    series = three_patches.patches / "series"
    series.write_text(series.read_text().replace("0003-raise-the-limit.patch\n", ""))
    (three_patches.patches / "0003-raise-the-limit.patch").unlink()
    data = json.loads(three_patches.run("status", "--json").out)
    assert data["series_changed"] is True


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([verb, "--help"])
    assert exc.value.code == 0
    assert "--json" in capsys.readouterr().out


def test_unknown_verb_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2


def test_outside_a_project_is_a_usage_error(tmp_path, capsys) -> None:
    code = main(["-C", str(tmp_path), "status"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no patches/upstream.toml" in err and "hint:" in err


def test_errors_in_json_mode_are_json(project: Project) -> None:
    result = project.run("fetch", "--wheel", "/nonexistent.whl", "--json")
    assert result.code != 0
    assert json.loads(result.out)["ok"] is False
