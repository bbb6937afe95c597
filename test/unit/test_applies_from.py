"""Applies-From: a patch that fixes code older served releases lack starts at a
release; apply --upstream, check, the matrix, the overlay export and rebase
honour it."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Project
from test_rebase import newer

NEW_CODE = "def reclaim():\n    return 'cuda'\n"


def moved_with_a_new_module(project: Project, tmp_path: Path) -> Path:
    """The series moved to 0.0.2, which adds srt/fresh.py; 0.0.1 is still served,
    and a patch fixing fresh.py starts at 0.0.2. Returns the 0.0.1 wheel."""
    wheel = newer(tmp_path, fresh=NEW_CODE)
    assert project.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel)).code == 0
    toml = project.patches / "upstream.toml"
    toml.write_text(
        toml.read_text().replace("[upstream]\n", '[upstream]\nserves-from = "0.0.1"\n')
    )
    project.add_patch(
        "python/sglang/srt/fresh.py",
        NEW_CODE.replace("'cuda'", "'xpu'"),
        "[XPU] Reclaim on the active device",
        Applies_From="0.0.2",
    )
    return project.wheel


def test_a_patch_that_starts_at_the_pin_is_left_out_below_it(
    three_patches: Project, tmp_path: Path
) -> None:
    old_wheel = moved_with_a_new_module(three_patches, tmp_path)
    name = "0004-reclaim-on-the-active-device.patch"
    assert "Applies-From: 0.0.2" in (three_patches.patches / name).read_text()
    # On the pin it applies; on 0.0.1 it is not part of the series at all.
    pin = json.loads(three_patches.run("check", "--json").out)
    assert name in [p["name"] for p in pin["patches"]]
    old = three_patches.run("check", "--upstream", "0.0.1", "--wheel", str(old_wheel))
    assert old.code == 0, old.err
    assert name not in old.out
    tree = tmp_path / "old-tree"
    applied = three_patches.run(
        "apply", "--upstream", "0.0.1", "--wheel", str(old_wheel), "--tree", str(tree)
    )
    assert applied.code == 0, applied.err
    assert not (tree / "python/sglang/srt/fresh.py").exists()
    # The matrix shows it on the pin and nothing on the older release.
    matrix = json.loads(three_patches.run("matrix", "0.0.1", "0.0.2", "--json").out)
    (row,) = [r for r in matrix["patches"] if r["name"] == name]
    assert row["text"] == {"0.0.1": "-", "0.0.2": "applied"}
    # The older release's overlay diff is exported without it.
    assert three_patches.run("overlay", "--export", "0.0.1").code == 0
    diff = (three_patches.patches / "overlay" / "0.0.1.diff").read_text()
    assert "fresh.py" not in diff and "other.py" in diff


def test_applies_from_above_the_pin_or_not_a_release_is_a_problem(
    three_patches: Project, tmp_path: Path
) -> None:
    moved_with_a_new_module(three_patches, tmp_path)
    path = three_patches.patches / "0004-reclaim-on-the-active-device.patch"
    path.write_text(
        path.read_text().replace("Applies-From: 0.0.2", "Applies-From: 0.0.3")
    )
    result = three_patches.run("check")
    assert result.code == 1
    assert "says Applies-From 0.0.3, above the pin 0.0.2" in result.err
    path.write_text(
        path.read_text().replace("Applies-From: 0.0.3", "Applies-From: soon")
    )
    assert "'soon', which is not a release number" in three_patches.run("check").err


def test_rebase_carries_a_patch_that_starts_at_the_old_pin(
    three_patches: Project, tmp_path: Path
) -> None:
    moved_with_a_new_module(three_patches, tmp_path)
    wheel = newer(tmp_path, version="0.0.3", fresh=NEW_CODE)
    result = three_patches.run("rebase", "--onto", "0.0.3", "--wheel", str(wheel))
    assert result.code == 0, result.err
    series = (three_patches.patches / "series").read_text()
    assert "0004-reclaim-on-the-active-device.patch" in series
