"""rebase: one transaction onto a newer release; a conflict or an interrupt stops the
rebase, never the user's work; --continue, --skip and --abort follow their hints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    BASE_FILES,
    Project,
    build_wheel,
    git,
    interrupt,
    local_index,
    wheel_name,
)

from xpu_series.stack.operation import snapshot


def newer(tmp_path: Path, version: str = "0.0.2", **changes: str | None) -> Path:
    """A synthetic upstream release: BASE_FILES with srt/<name>.py changed
    (None removes the file)."""
    files = dict(BASE_FILES)
    for name, text in changes.items():
        key = f"sglang/srt/{name.replace('__', '/')}.py"
        if text is None:
            files.pop(key)
        else:
            files[key] = text
    path = tmp_path / "wheels" / wheel_name(version)
    path.parent.mkdir(exist_ok=True)
    build_wheel(path, files, version=version, requires=("torch==2.14.1",))
    return path


def state(project: Project) -> dict[str, object]:
    """Everything --abort must restore byte for byte."""
    tree = project.tree
    return {
        "patches": snapshot(project.patches),
        "head": git(tree, "rev-parse", "HEAD"),
        "upstream": git(tree, "rev-parse", "upstream"),
        "branch": git(tree, "symbolic-ref", "--short", "HEAD"),
        "record": (tree / ".git/xpu-series.json").read_bytes(),
        "status": git(tree, "status", "--porcelain"),
    }


@pytest.fixture
def absorbed_first(three_patches: Project, tmp_path: Path) -> Path:
    """0.0.2 already has 0001's change; the others apply."""
    (three_patches.root / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.optional-dependencies]\n'
        'test = ["torch==2.13.0"]\n'
    )
    return newer(tmp_path, flags="VALUE = 2\nNAME = 'upstream'\n")


def test_rebase_retires_absorbed_and_rewrites_the_pin(
    three_patches: Project, absorbed_first: Path
) -> None:
    result = three_patches.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(absorbed_first), "--json"
    )
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["finished"] is True
    assert [p["status"] for p in data["patches"]] == ["absorbed", "applied", "applied"]
    pin = (three_patches.patches / "upstream.toml").read_text()
    assert 'version = "0.0.2"' in pin and data["onto"]["sha256"] in pin
    assert wheel_name("0.0.2") in pin and 'git-tag = "v0.0.2"' in pin
    series = (three_patches.patches / "series").read_text().splitlines()
    assert series[1:] == ["0002-fix-the-answer.patch", "0003-raise-the-limit.patch"]
    retired = three_patches.patches / "upstreamed" / "0001-raise-value.patch"
    assert "Applied-Upstream: 0.0.2\n" in retired.read_text()
    assert not (three_patches.patches / "0001-raise-value.patch").exists()
    (drift,) = data["dependency_drift"]
    assert drift["name"] == "torch" and drift["pinned"] == "2.13.0"
    assert "change pyproject.toml" in drift["action"]
    assert Path(data["report"]).is_file()
    assert "xpu-series verify" in result.err
    # The tree is the new series, and a check on the new pin agrees.
    assert git(three_patches.tree, "log", "--format=%s", "upstream..").splitlines() == [
        "[XPU] Raise the limit",
        "[XPU] Fix the answer",
    ]
    assert three_patches.run("check").code == 0
    assert three_patches.run("refresh", "--check").code == 0


def _conflicting_release(tmp_path: Path) -> Path:
    # Upstream changed the very line 0002 changes: a real 3-way conflict.
    return newer(tmp_path, other="def answer():\n    return 40\n")


def test_conflict_stops_with_markers_and_abort_restores_byte_for_byte(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    before = state(three_patches)
    result = three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel))
    assert result.code == 3
    assert "0002-fix-the-answer.patch does not apply on sglang 0.0.2" in result.err
    assert "conflict markers in python/sglang/srt/other.py" in result.err
    for step in ("rebase --continue", "rebase --skip", "rebase --abort", "git -C"):
        assert step in result.err
    assert "<<<<<<<" in (three_patches.tree / "python/sglang/srt/other.py").read_text()
    # Nothing of the user's was written while stopped.
    assert snapshot(three_patches.patches) == before["patches"]
    # Other verbs refuse and point at the operation.
    for verb in (("apply",), ("refresh",), ("rebase", "--onto", "0.0.3")):
        refused = three_patches.run(*verb)
        assert refused.code == 1 and "rebase --abort" in refused.err, verb
    status = three_patches.run("status")
    assert "in progress: rebase onto sglang 0.0.2 stopped at 0002" in status.out
    refused = three_patches.run("rebase", "--continue")
    assert refused.code == 3 and "conflict markers" in refused.err
    aborted = three_patches.run("rebase", "--abort")
    assert aborted.code == 0, aborted.err
    assert state(three_patches) == before
    assert not (three_patches.root / "build" / "operation").exists()


def test_continue_with_markers_left_is_a_conflict_and_its_hint_finishes(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    assert (
        three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel)).code == 3
    )
    other = three_patches.tree / "python/sglang/srt/other.py"
    marked = other.read_bytes()
    # Staged, markers and all: git no longer calls it unmerged, the tool must.
    git(three_patches.tree, "add", "-A")
    refused = three_patches.run("rebase", "--continue")
    assert refused.code == 3, "a conflict needing a human, not a failure"
    assert "0002-fix-the-answer.patch is not resolved yet" in refused.err
    assert "conflict markers in python/sglang/srt/other.py" in refused.err
    # The refusal changed nothing: still stopped there, markers in place.
    assert other.read_bytes() == marked
    status = three_patches.run("status")
    assert "in progress: rebase onto sglang 0.0.2 stopped at 0002" in status.out
    # The hint, followed literally: edit in the tree it names, git add, continue.
    (hint,) = [line for line in refused.err.splitlines() if line.startswith("hint:")]
    assert f"edit the files in {three_patches.tree}" in hint
    add = f"'git -C {three_patches.tree} add'"
    assert add in hint and "'xpu-series rebase --continue'" in hint
    other.write_text("def answer():\n    return 42\n")
    git(three_patches.tree, "add", "python/sglang/srt/other.py")
    done = three_patches.run("rebase", "--continue", "--json")
    assert done.code == 0, done.err
    statuses = [p["status"] for p in json.loads(done.out)["patches"]]
    assert statuses == ["applied", "merged", "applied"]
    assert (
        "-    return 40"
        in (three_patches.patches / "0002-fix-the-answer.patch").read_text()
    )


def test_continue_after_resolving_finishes_and_keeps_the_names(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    assert (
        three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel)).code == 3
    )
    other = three_patches.tree / "python/sglang/srt/other.py"
    other.write_text("def answer():\n    return 42\n")
    git(three_patches.tree, "add", "-A")
    result = three_patches.run("rebase", "--continue", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert [p["status"] for p in data["patches"]] == ["applied", "merged", "applied"]
    names = sorted(p.name for p in three_patches.patches.glob("*.patch"))
    assert names == [
        "0001-raise-value.patch",
        "0002-fix-the-answer.patch",
        "0003-raise-the-limit.patch",
    ]
    text = (three_patches.patches / "0002-fix-the-answer.patch").read_text()
    assert "Subject: [XPU] Fix the answer" in text, "am -k keeps the [XPU] prefix"
    assert "-    return 40" in text
    assert three_patches.run("check").code == 0


def test_skip_asks_why_and_keeps_the_patch_in_dropped(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    assert (
        three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel)).code == 3
    )
    no_reason = three_patches.run("rebase", "--skip")
    assert no_reason.code == 2 and "--reason" in no_reason.err
    result = three_patches.run(
        "rebase", "--skip", "--reason", "upstream reworked the answer", "--json"
    )
    assert result.code == 0, result.err
    dropped = three_patches.patches / "dropped" / "0002-fix-the-answer.patch"
    assert "Dropped: 0.0.2: upstream reworked the answer" in dropped.read_text()
    assert three_patches.run("check").code == 0
    # A test only the dropped patch names, still on disk, is flagged by check.
    (three_patches.root / "test").mkdir()
    (three_patches.root / "test" / "test_answer.py").write_text("def test(): pass\n")
    dropped.write_text(
        dropped.read_text().replace("---\n", "Tests: test/test_answer.py\n---\n", 1)
    )
    check = three_patches.run("check")
    assert check.code == 1
    assert "only the dropped patch 0002-fix-the-answer.patch names it" in check.err
    series = (three_patches.patches / "series").read_text()
    assert "0002" not in series and "0003-raise-the-limit.patch" in series


def test_upstream_rename_is_followed_and_reported(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = newer(tmp_path, third=None, limits="LIMIT = 10\n")
    result = three_patches.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--json"
    )
    assert result.code == 0, result.err
    data = json.loads(result.out)
    third = data["patches"][2]
    assert third["status"] == "merged"
    assert "followed rename python/sglang/srt/third.py -> " in third["detail"]
    assert "limits.py" in third["detail"]
    text = (three_patches.patches / "0003-raise-the-limit.patch").read_text()
    assert "python/sglang/srt/limits.py" in text and "third.py" not in text


def test_bad_input_is_refused_with_a_clear_message(
    three_patches: Project, tmp_path: Path
) -> None:
    for verb in ("--continue", "--skip", "--abort"):
        result = three_patches.run("rebase", verb, "--reason", "x")
        if verb != "--skip":
            result = three_patches.run("rebase", verb)
        assert result.code == 2 and "no rebase is in progress" in result.err
    assert three_patches.run("rebase").code == 2
    same = three_patches.run("rebase", "--onto", "0.0.1")
    assert same.code == 2 and "already on sglang 0.0.1" in same.err
    not_sglang = tmp_path / "wheels" / wheel_name("0.0.2")
    not_sglang.parent.mkdir()
    build_wheel(not_sglang, {"other/__init__.py": ""}, version="0.0.2")
    before = snapshot(three_patches.patches)
    result = three_patches.run("rebase", "--onto", "0.0.2", "--wheel", str(not_sglang))
    assert result.code == 4 and "is not an sglang wheel" in result.err
    assert snapshot(three_patches.patches) == before
    assert not (three_patches.root / "build" / "operation").exists()


def test_a_release_that_does_not_exist_names_the_newest(
    three_patches: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_index(tmp_path / "index", monkeypatch, ("0.0.1", "0.0.2"))
    result = three_patches.run("rebase", "--onto", "0.0.9")
    assert result.code == 1
    assert "sglang 0.0.9 does not exist on the package index" in result.err
    assert "the newest release is 0.0.2" in result.err
    assert not (three_patches.root / "build" / "operation").exists()
    # The same index serves a release that exists: rebase fetches it itself.
    result = three_patches.run("rebase", "--onto", "0.0.2")
    assert result.code == 0, result.err


# -- interrupts: a real SIGINT (or SIGKILL) delivered to a child at each phase --


@pytest.mark.parametrize(
    ("where", "sig"),
    [
        ("fetch", "SIGINT"),
        ("base", "SIGINT"),
        ("patch1", "SIGINT"),
        ("patch2", "SIGKILL"),
        ("write", "SIGKILL"),
    ],
)
def test_interrupt_at_each_phase_can_be_aborted_or_continued(
    three_patches: Project, absorbed_first: Path, where: str, sig: str
) -> None:
    before = state(three_patches)
    args = ("rebase", "--onto", "0.0.2", "--wheel", str(absorbed_first))
    assert interrupt(three_patches, where, *args, sig=sig).returncode != 0
    assert (three_patches.root / "build/operation/state.json").exists()
    # --abort restores everything byte for byte...
    aborted = three_patches.run("rebase", "--abort")
    assert aborted.code == 0, aborted.err
    assert state(three_patches) == before
    # ...and after the same interrupt again, --continue finishes the rebase.
    interrupt(three_patches, where, *args, sig=sig)
    done = three_patches.run("rebase", "--continue", "--json")
    assert done.code == 0, done.err
    assert 'version = "0.0.2"' in (three_patches.patches / "upstream.toml").read_text()
    assert (three_patches.patches / "upstreamed" / "0001-raise-value.patch").exists()
    assert git(three_patches.tree, "status", "--porcelain") == ""
    assert three_patches.run("refresh", "--check").code == 0


def test_retired_patch_tests_are_run_on_the_new_base(
    project: Project, tmp_path: Path
) -> None:
    tests = project.root / "test"
    tests.mkdir()
    (tests / "test_value.py").write_text(
        "from sglang.srt.flags import VALUE\n\ndef test_value():\n"
        "    assert VALUE == 2\n"
    )
    (tests / "test_limit.py").write_text(
        "from sglang.srt.third import LIMIT\n\ndef test_limit():\n"
        "    assert LIMIT == 20\n"
    )
    project.add_patch(
        "python/sglang/srt/flags.py", "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE", Tests="test/test_value.py",
    )  # fmt: skip
    project.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise the limit",
        Tests="test/test_limit.py", Applied_Upstream="0.0.2",
    )  # fmt: skip
    # 0.0.2 has VALUE = 2 (the first patch reverse-applies) and a limit of its own
    # (the second is retired by its Applied-Upstream field, yet its test fails).
    wheel = newer(
        tmp_path, flags="VALUE = 2\nNAME = 'upstream'\n", third="LIMIT = 30\n"
    )
    result = project.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--json")
    assert result.code == 0, result.err
    retired = json.loads(result.out)["retired"]
    verdicts = {r["name"]: r["tests_on_new_base"] for r in retired}
    assert verdicts["0001-raise-value.patch"].startswith("pass on the new base")
    assert verdicts["0002-raise-the-limit.patch"].startswith("fail on the new base")


def test_applied_upstream_retires_a_patch_that_still_applies(
    project: Project, tmp_path: Path
) -> None:
    # A stop-gap for one release (say, refusing what the next release supports)
    # still applies there; its Applied-Upstream field is what retires it.
    project.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise the limit",
        Applied_Upstream="0.0.2",
    )  # fmt: skip
    result = project.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(newer(tmp_path)), "--json"
    )
    assert result.code == 0, result.err
    (outcome,) = json.loads(result.out)["patches"]
    assert outcome["status"] == "absorbed"
    assert "its header retires it" in outcome["detail"]
    assert (project.patches / "upstreamed" / "0001-raise-the-limit.patch").is_file()
    assert git(project.tree, "rev-parse", "HEAD") == git(
        project.tree, "rev-parse", "upstream"
    )
