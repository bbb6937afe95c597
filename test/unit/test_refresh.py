"""refresh: patches are exported canonically and byte-stable across round trips."""

from __future__ import annotations

from conftest import Project, git

from xpu_series.header import parse_header


def _snapshot(project: Project) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(project.patches.iterdir())}


def test_refresh_twice_changes_no_byte(three_patches: Project) -> None:
    before = _snapshot(three_patches)
    result = three_patches.run("refresh")
    assert result.code == 0 and "3 unchanged, 0 written" in result.out
    assert _snapshot(three_patches) == before


def test_apply_then_refresh_round_trips(three_patches: Project) -> None:
    before = _snapshot(three_patches)
    assert three_patches.run("apply").code == 0
    assert three_patches.run("refresh").code == 0
    assert _snapshot(three_patches) == before


def test_export_is_canonical(three_patches: Project) -> None:
    text = (three_patches.patches / "0001-raise-value.patch").read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [XPU] Raise VALUE\n" in text
    assert "[PATCH" not in text
    assert "\n-- \n" not in text, "no version signature"
    index = next(line for line in text.splitlines() if line.startswith("index "))
    assert len(index.split()[1].split("..")[0]) == 40, "full blob ids for am -3"
    header = parse_header(text)
    assert header.get("Upstream-Status") == "Pending"
    assert header.concern == "device-gates"


def test_series_lists_the_exported_patches_in_order(three_patches: Project) -> None:
    lines = (three_patches.patches / "series").read_text().splitlines()
    assert lines == [
        "# test series",
        "0001-raise-value.patch",
        "0002-fix-the-answer.patch",
        "0003-raise-the-limit.patch",
    ]


def test_amended_commit_rewrites_only_its_patch(three_patches: Project) -> None:
    before = _snapshot(three_patches)
    tree = three_patches.tree
    (tree / "python/sglang/srt/third.py").write_text("LIMIT = 30\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    result = three_patches.run("refresh")
    assert "wrote 0003-raise-the-limit.patch" in result.out
    after = _snapshot(three_patches)
    changed = [name for name in before if before[name] != after[name]]
    assert changed == ["0003-raise-the-limit.patch"]


def test_refresh_refuses_uncommitted_edits(three_patches: Project) -> None:
    (three_patches.tree / "python/sglang/srt/third.py").write_text("LIMIT = 99\n")
    result = three_patches.run("refresh")
    assert result.code == 1
    assert "uncommitted edits" in result.err and "hint:" in result.err
