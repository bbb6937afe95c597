"""refresh: patches are exported canonically and byte-stable across round trips."""

from __future__ import annotations

import json

from conftest import Project, git

from xpu_series.stack.header import parse_header


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
    assert header.concern == "raise-value"


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


def test_range_diff_names_the_changed_patch_and_file(three_patches: Project) -> None:
    root = three_patches.root
    git(root, "init", "-q")
    git(root, "add", "patches")
    git(root, "commit", "-q", "-m", "series")
    tree = three_patches.tree
    (tree / "python/sglang/srt/third.py").write_text("LIMIT = 30\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    assert three_patches.run("refresh").code == 0
    result = three_patches.run("range-diff", "--json")
    assert result.code == 0, result.err
    changes = {c["subject"]: c for c in json.loads(result.out)["patches"]}
    assert changes["[XPU] Raise the limit"]["change"] == "changed"
    assert changes["[XPU] Raise the limit"]["files"] == ["python/sglang/srt/third.py"]
    assert changes["[XPU] Raise VALUE"]["change"] == "unchanged"
    text = three_patches.run("range-diff").out
    assert "changed" in text and "srt/third.py" in text
    bad = three_patches.run("range-diff", "no-such-rev")
    assert bad.code == 2 and "is not a revision" in bad.err


def test_refresh_never_deletes_patches_the_tree_lacks(three_patches: Project) -> None:
    before = _snapshot(three_patches)
    git(three_patches.tree, "reset", "-q", "--hard", "HEAD~2")
    result = three_patches.run("refresh")
    assert result.code == 1 and "--prune" in result.err
    assert _snapshot(three_patches) == before
    # A reworded subject keeps its file name: identity is the series position.
    git(three_patches.tree, "reset", "-q", "--hard", "refs/xpu-series/applied")
    git(three_patches.tree, "commit", "-q", "--amend", "-m",
        "[XPU] Raise the limit further\n\nWhy.\n\nUpstream-Status: Pending\n"
        "Concern: raise-the-limit\nOrigin: other, test\n")  # fmt: skip
    assert three_patches.run("refresh").code == 0
    assert sorted(p.name for p in three_patches.patches.glob("*.patch")) == sorted(
        n for n in before if n.endswith(".patch")
    )
    assert (
        "further" in (three_patches.patches / "0003-raise-the-limit.patch").read_text()
    )
    check = three_patches.run("refresh", "--check")
    assert check.code == 0
    (three_patches.patches / "0001-raise-value.patch").write_text("hand edit\n")
    check = three_patches.run("refresh", "--check")
    assert check.code == 1 and "0001-raise-value.patch differs" in check.err


def test_refresh_prune_hint_followed_drops_only_what_the_tree_lacks(
    three_patches: Project,
) -> None:
    git(three_patches.tree, "reset", "-q", "--hard", "HEAD~2")
    refused = three_patches.run("refresh")
    assert "--prune" in refused.err
    result = three_patches.run("refresh", "--prune")
    assert result.code == 0, result.err
    assert sorted(p.name for p in three_patches.patches.glob("*.patch")) == [
        "0001-raise-value.patch"
    ]
    lines = (three_patches.patches / "series").read_text().splitlines()
    assert lines == ["# test series", "0001-raise-value.patch"]
    assert three_patches.run("refresh", "--check").code == 0


def test_a_new_patch_is_numbered_after_the_retired_ones(
    three_patches: Project,
) -> None:
    """A retired 0007 still applies by its number on older releases; a new patch
    must not take a number a retired one holds."""
    retired = three_patches.patches / "upstreamed"
    retired.mkdir()
    (retired / "0007-old-fix.patch").write_text("Subject: [XPU] Old fix\n")
    three_patches.add_patch(
        "python/sglang/srt/long.py", "LINE_1 = 3\n", "[XPU] Shorten long"
    )
    names = [p.name for p in three_patches.patches.glob("*.patch")]
    assert "0008-shorten-long.patch" in names, names
