"""apply: one commit per patch, all problems reported, the tree never half-done."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import BASE_FILES, Project, build_wheel, git, wheel_name, write_pin

from xpu_series.lock import lock_path
from xpu_series.stack import engine


def subjects(tree: Path) -> list[str]:
    return git(tree, "log", "--format=%s", "upstream..HEAD").splitlines()[::-1]


def test_apply_makes_one_commit_per_patch(three_patches: Project) -> None:
    result = three_patches.run("apply", "--json")
    data = json.loads(result.out)
    assert result.code == 0 and data["ok"] is True
    assert [p["status"] for p in data["patches"]] == ["applied"] * 3
    assert data["upstream"] == {
        "version": "0.0.1",
        "sha256": three_patches.sha,
        "pinned": True,
        "source": "wheel",
    }
    assert subjects(three_patches.tree) == [
        "[XPU] Raise VALUE",
        "[XPU] Fix the answer",
        "[XPU] Raise the limit",
    ]
    assert git(three_patches.tree, "describe", "--tags", "--exact", "upstream")


def test_table_lists_every_patch(three_patches: Project) -> None:
    out = three_patches.run("apply").out
    for name in ("0001-raise-value.patch", "0002-fix-the-answer.patch"):
        assert name in out
    assert "applied" in out and "srt/flags.py" in out


def test_base_is_deterministic_and_executable_bits_survive(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other-tree"
    assert project.run("apply", "--tree", str(other)).code == 0
    # A second, cold materialization from the same wheel in a separate cache.
    monkeypatch.setenv("XPU_SERIES_CACHE", str(tmp_path / "cold-cache"))
    cold = tmp_path / "cold-tree"
    result = project.run("apply", "--tree", str(cold), "--wheel", str(project.wheel))
    assert result.code == 0, result.err
    trees = [git(t, "ls-tree", "-r", "upstream") for t in (project.tree, other, cold)]
    assert trees[0] == trees[1] == trees[2]
    assert "100755 blob" in trees[0] and "python/sglang/bin/tool.sh" in trees[0]
    assert len({git(t, "rev-parse", "upstream") for t in (project.tree, cold)}) == 1


def test_second_apply_reuses_the_cached_base(three_patches: Project) -> None:
    data = json.loads(three_patches.run("apply", "--json").out)
    assert any("base from tree" in n for n in data["notes"])
    fresh = three_patches.root / "build" / "fresh"
    data = json.loads(three_patches.run("apply", "--tree", str(fresh), "--json").out)
    assert any("base from cache" in n for n in data["notes"])


def test_patch_applies_to_a_plain_git_checkout(
    three_patches: Project, tmp_path: Path
) -> None:
    checkout = tmp_path / "upstream-checkout"
    for name, text in BASE_FILES.items():
        path = checkout / "python" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (checkout / "README.md").write_text("upstream repo files the wheel lacks\n")
    git(checkout, "init", "-q")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-q", "-m", "v0.0.1")
    result = three_patches.run("apply", "--tree", str(checkout), "--json")
    data = json.loads(result.out)
    assert result.code == 0, result.err
    assert [p["status"] for p in data["patches"]] == ["applied"] * 3
    assert data["upstream"]["source"] == "checkout"
    assert (checkout / "python/sglang/srt/flags.py").read_text().startswith("VALUE = 2")


def test_dirty_tree_is_refused_without_force(three_patches: Project) -> None:
    three_patches.run("apply")
    edited = three_patches.tree / "python/sglang/srt/other.py"
    edited.write_text("# my local experiment\n")
    result = three_patches.run("apply")
    assert result.code == 1
    assert "local edits" in result.err and "--force" in result.err
    assert edited.read_text() == "# my local experiment\n"


def test_force_keeps_edits_in_a_stash_and_commits_on_a_branch(
    three_patches: Project,
) -> None:
    three_patches.run("apply")
    three_patches.commit_change(
        "python/sglang/srt/new.py", "X = 1\n", "[XPU] Unexported work"
    )
    (three_patches.tree / "python/sglang/srt/other.py").write_text("# wip\n")
    result = three_patches.run("apply", "--force", "--json")
    data = json.loads(result.out)
    assert result.code == 0
    notes = " ".join(data["notes"])
    assert "stash" in notes and "xpu-series/backup-" in notes
    stash = git(three_patches.tree, "stash", "show", "-p", "stash@{0}")
    assert "# wip" in stash
    branch = next(w for w in notes.split() if w.startswith("xpu-series/backup-"))
    assert git(three_patches.tree, "log", "-1", "--format=%s", branch) == (
        "[XPU] Unexported work"
    )


def _write_patch(project: Project, name: str, target: str) -> None:
    text = (project.patches / "0001-raise-value.patch").read_text()
    text = text.replace("python/sglang/srt/flags.py", target)
    (project.patches / name).write_text(text)
    series = project.patches / "series"
    series.write_text(series.read_text() + name + "\n")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("/etc/passwd", "absolute path"),
        ("python/sglang/../../escape.py", "contains '..'"),
    ],
)
def test_unsafe_paths_are_rejected_before_anything_applies(
    three_patches: Project, target: str, message: str
) -> None:
    three_patches.run("apply")
    before = git(three_patches.tree, "rev-parse", "HEAD")
    _write_patch(three_patches, "0004-evil.patch", target)
    result = three_patches.run("apply", "--force")
    assert result.code == 1
    assert message in result.err and "0004-evil.patch" in result.err
    assert git(three_patches.tree, "rev-parse", "HEAD") == before


def test_symlink_out_of_the_tree_is_rejected(
    three_patches: Project, tmp_path: Path
) -> None:
    three_patches.run("apply")
    outside = tmp_path / "outside"
    outside.mkdir()
    link = three_patches.tree / "python/sglang/link"
    link.symlink_to(outside)
    git(three_patches.tree, "add", "-A")
    git(three_patches.tree, "commit", "-q", "-m", "symlink")
    git(three_patches.tree, "tag", "-f", "upstream")
    git(three_patches.tree, "update-ref", "refs/xpu-series/applied", "HEAD")
    _write_patch(three_patches, "0004-through-link.patch", "python/sglang/link/x.py")
    result = three_patches.run("apply", "--json")
    data = json.loads(result.out)
    assert result.code == 1
    assert any("through a symlink" in p for p in data["problems"])
    assert all(p["status"] in ("skipped", "missing") for p in data["patches"])
    assert not (outside / "x.py").exists()
    assert git(three_patches.tree, "rev-parse", "HEAD") == git(
        three_patches.tree, "rev-parse", "upstream"
    )


def _conflicting_series(project: Project) -> None:
    """Patch 2 fails; patch 3 is independent; patch 4 shares the file of patch 2."""
    p2 = project.patches / "0002-fix-the-answer.patch"
    p2.write_text(p2.read_text().replace("-    return 41", "-    return 40"))
    text = (project.patches / "0003-raise-the-limit.patch").read_text()
    text = text.replace("third.py", "other.py").replace(
        "[XPU] Raise the limit", "[XPU] Four"
    )
    (project.patches / "0004-four.patch").write_text(text)
    series = project.patches / "series"
    series.write_text(series.read_text() + "0004-four.patch\n")


def _three_way_conflict(project: Project) -> None:
    """A fourth patch made against upstream that changes 0002's line otherwise."""
    text = (project.patches / "0002-fix-the-answer.patch").read_text()
    text = text.replace("+    return 42", "+    return 43").replace(
        "[XPU] Fix the answer", "[XPU] Other answer"
    )
    (project.patches / "0004-other-answer.patch").write_text(text)
    series = project.patches / "series"
    series.write_text(series.read_text() + "0004-other-answer.patch\n")


def test_three_way_conflict_leaves_markers_and_continue_finishes(
    three_patches: Project,
) -> None:
    _three_way_conflict(three_patches)
    result = three_patches.run("apply")
    assert result.code == 3
    assert "conflict markers in python/sglang/srt/other.py" in result.err
    other = three_patches.tree / "python/sglang/srt/other.py"
    assert "<<<<<<<" in other.read_text()
    refused = three_patches.run("apply", "--continue")
    assert refused.code == 3 and "conflict markers in" in refused.err
    other.write_text("def answer():\n    return 43\n")
    git(three_patches.tree, "add", "-A")
    done = three_patches.run("apply", "--continue")
    assert done.code == 0, done.err
    assert subjects(three_patches.tree)[-1] == "[XPU] Other answer"


def test_conflict_reports_every_patch_and_stops_at_the_conflict(
    three_patches: Project,
) -> None:
    three_patches.run("apply")
    _conflicting_series(three_patches)
    result = three_patches.run("apply", "--json")
    data = json.loads(result.out)
    assert result.code == 3
    statuses = {p["name"]: p["status"] for p in data["patches"]}
    assert statuses == {
        "0001-raise-value.patch": "applied",
        "0002-fix-the-answer.patch": "conflict",
        "0003-raise-the-limit.patch": "applied",
        "0004-four.patch": "skipped",
    }
    assert data["stopped"] == "0002-fix-the-answer.patch"
    third = next(p for p in data["patches"] if p["name"].startswith("0003"))
    assert "checked only" in third["detail"]
    assert subjects(three_patches.tree) == ["[XPU] Raise VALUE"]
    # The conflicting patch is left in progress for a human; with no base blob
    # to merge from, git leaves no markers and the message says to apply it by
    # hand.
    assert (three_patches.tree / ".git" / "rebase-apply").exists()
    assert "by hand" in result.err


def test_conflict_hint_continue_followed_literally(three_patches: Project) -> None:
    three_patches.run("apply")
    p2 = three_patches.patches / "0002-fix-the-answer.patch"
    p2.write_text(p2.read_text().replace("-    return 41", "-    return 40"))
    before = {p.name: p.read_bytes() for p in three_patches.patches.iterdir()}
    result = three_patches.run("apply")
    assert "error: 0002-fix-the-answer.patch does not apply" in result.err
    assert "'xpu-series apply --continue'" in result.err
    # Continuing before the change is made is refused, and changes nothing.
    refused = three_patches.run("apply", "--continue")
    assert refused.code == 1 and "nothing is staged" in refused.err
    # Resolve, git add, continue: every patch is committed, patches/ untouched.
    other = three_patches.tree / "python/sglang/srt/other.py"
    other.write_text("def answer():\n    return 42\n")
    git(three_patches.tree, "add", "python/sglang/srt/other.py")
    done = three_patches.run("apply", "--continue")
    assert done.code == 0, done.err
    assert "xpu-series refresh" in done.err
    assert subjects(three_patches.tree) == [
        "[XPU] Raise VALUE",
        "[XPU] Fix the answer",
        "[XPU] Raise the limit",
    ]
    assert {p.name: p.read_bytes() for p in three_patches.patches.iterdir()} == before
    # The hint after --continue: refresh writes the resolution, keeps every file.
    refreshed = three_patches.run("refresh")
    assert refreshed.code == 0, refreshed.err
    assert sorted(p.name for p in three_patches.patches.glob("*.patch")) == sorted(
        n for n in before if n.endswith(".patch")
    )
    assert (
        "-    return 41"
        in (three_patches.patches / "0002-fix-the-answer.patch").read_text()
    )


def test_conflict_hint_abort_followed_literally(three_patches: Project) -> None:
    three_patches.run("apply")
    head = git(three_patches.tree, "rev-parse", "HEAD")
    record = (three_patches.tree / ".git/xpu-series.json").read_bytes()
    _conflicting_series(three_patches)
    assert three_patches.run("apply").code == 3
    result = three_patches.run("apply", "--abort")
    assert result.code == 0, result.err
    assert git(three_patches.tree, "rev-parse", "HEAD") == head
    assert git(three_patches.tree, "status", "--porcelain") == ""
    assert (three_patches.tree / ".git/xpu-series.json").read_bytes() == record
    assert not (three_patches.tree / ".git" / "rebase-apply").exists()
    assert three_patches.run("apply", "--abort").code == 2  # nothing in progress


def test_apply_refuses_while_stopped_and_says_how_to_go_on(
    three_patches: Project,
) -> None:
    _conflicting_series(three_patches)
    assert three_patches.run("apply").code == 3
    again = three_patches.run("apply")
    assert again.code == 1
    assert "--continue" in again.err and "--abort" in again.err
    assert three_patches.run("refresh").code == 1


def test_an_apply_still_running_is_not_called_interrupted(
    three_patches: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    three_patches.run("apply")
    real_commit = engine.commit_patch

    def interrupted(git_, patch, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "commit_patch", interrupted)
    assert three_patches.run("apply").code == 1
    monkeypatch.setattr(engine, "commit_patch", real_commit)
    # Another process of this host holds the tree, as a running apply does
    # (this one: alive).
    lock = lock_path(three_patches.tree)
    lock.write_text(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(),
        "command": "xpu-series apply", "since": "2026-12-04 10:00:00",
    }))  # fmt: skip
    busy = three_patches.run("refresh")
    assert busy.code == 1
    assert "an apply onto sglang" in busy.err and "is running (pid" in busy.err
    assert f"pid {os.getpid()}" in busy.err and "interrupted" not in busy.err
    # Its hint is to wait: no --abort of a running apply.
    hint = "wait for it to finish, then run 'xpu-series refresh' again"
    assert "--abort" not in busy.err and hint in busy.err
    # Were its process gone, it was interrupted: continue or abort.
    lock.write_text(json.dumps({"pid": 2**22 + 1, "host": socket.gethostname()}))
    gone = three_patches.run("refresh")
    assert gone.code == 1 and "interrupted" in gone.err and "--abort" in gone.err
    # The hint, followed: the apply finishes (as its process would, holding the
    # tree until it is done), then 'xpu-series refresh' runs again and succeeds.
    lock.unlink()
    assert three_patches.run("apply", "--continue").code == 0
    again = three_patches.run("refresh")
    assert again.code == 0, again.err
    assert three_patches.run("refresh", "--check").code == 0


def test_interrupt_leaves_the_tree_at_the_last_applied_patch(
    three_patches: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    three_patches.run("apply")
    real_commit = engine.commit_patch
    calls = []

    def interrupted_second(git_, patch, **kwargs):
        calls.append(patch.name)
        if len(calls) == 2:
            # Ctrl-C lands while git am is writing the second patch.
            real_commit(git_, patch, **kwargs)
            raise KeyboardInterrupt
        return real_commit(git_, patch, **kwargs)

    monkeypatch.setattr(engine, "commit_patch", interrupted_second)
    result = three_patches.run("apply")
    assert result.code == 1
    assert "interrupted" in result.err and "--continue" in result.err
    assert subjects(three_patches.tree) == ["[XPU] Raise VALUE"]
    assert git(three_patches.tree, "status", "--porcelain") == ""
    assert not lock_path(three_patches.tree).exists()
    monkeypatch.setattr(engine, "commit_patch", real_commit)
    # The hint, followed: --continue finishes the same three commits.
    done = three_patches.run("apply", "--continue")
    assert done.code == 0, done.err
    assert len(subjects(three_patches.tree)) == 3


def test_second_apply_on_a_locked_tree_names_the_holder(
    three_patches: Project,
) -> None:
    holder = subprocess.Popen(["sleep", "30"])
    try:
        lock = lock_path(three_patches.tree)
        lock.write_text(
            json.dumps(
                {
                    "pid": holder.pid,
                    "host": socket.gethostname(),
                    "command": "xpu-series apply",
                    "since": "now",
                }
            )
        )
        result = three_patches.run("apply")
        assert result.code == 1
        assert f"locked by pid {holder.pid}" in result.err
        assert "xpu-series apply" in result.err
    finally:
        holder.kill()
        holder.wait()
    # Once the holder is gone the stale lock is taken over.
    assert three_patches.run("apply").code == 0
    assert not lock.exists()


def test_other_upstream_reports_absorbed_patches(
    three_patches: Project, tmp_path: Path
) -> None:
    newer_files = dict(BASE_FILES)
    newer_files["sglang/srt/flags.py"] = "VALUE = 2\nNAME = 'upstream'\n"
    newer = tmp_path / wheel_name("0.0.2")
    build_wheel(newer, newer_files, version="0.0.2")
    result = three_patches.run(
        "check", "--upstream", "0.0.2", "--wheel", str(newer), "--json"
    )
    data = json.loads(result.out)
    assert result.code == 0
    assert [p["status"] for p in data["patches"]] == ["absorbed", "applied", "applied"]
    assert data["upstream"]["pinned"] is False
    # check never touches the user's tree
    assert (
        git(three_patches.tree, "log", "-1", "--format=%s") == "[XPU] Raise the limit"
    )


def _newer_wheel(tmp_path: Path, **changes: str) -> Path:
    files = dict(BASE_FILES)
    files.update({f"sglang/srt/{name}.py": text for name, text in changes.items()})
    newer = tmp_path / wheel_name("0.0.2")
    build_wheel(newer, files, version="0.0.2")
    return newer


def test_patch_whose_context_changed_upstream_is_merged(
    project: Project, tmp_path: Path
) -> None:
    lines = [f"LINE_{i} = {i}\n" for i in range(1, 13)]
    patched = list(lines)
    patched[7] = "LINE_8 = 800\n"
    project.add_patch(
        "python/sglang/srt/long.py", "".join(patched), "[XPU] Change line 8"
    )
    upstream = list(lines)
    upstream[4] = "LINE_5 = 'changed upstream'\n"  # inside the patch's context
    newer = _newer_wheel(tmp_path, long="".join(upstream))
    result = project.run(
        "check", "--upstream", "0.0.2", "--wheel", str(newer), "--json"
    )
    data = json.loads(result.out)
    assert result.code == 0, result.err
    assert data["patches"][0]["status"] == "merged"


def test_applied_upstream_field_marks_a_reworded_backport_absorbed(
    project: Project, tmp_path: Path
) -> None:
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2  # ours\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Applied_Upstream="0.0.2",
    )
    # Upstream made the same change in its own words: the diff cannot apply,
    # and it does not reverse-apply either.
    newer = _newer_wheel(tmp_path, flags="VALUE = 2  # theirs\nNAME = 'upstream'\n")
    result = project.run(
        "check", "--upstream", "0.0.2", "--wheel", str(newer), "--json"
    )
    data = json.loads(result.out)
    assert result.code == 0
    (outcome,) = data["patches"]
    assert outcome["status"] == "absorbed"
    assert "Applied-Upstream: 0.0.2" in outcome["detail"]
    # On a release before the one named, the same text is a plain conflict.
    older = tmp_path / "older" / wheel_name("0.0.1")
    older.parent.mkdir()
    files = dict(BASE_FILES, **{"sglang/srt/flags.py": "VALUE = 3\nNAME = 'x'\n"})
    build_wheel(older, files, version="0.0.1")
    write_pin(project.root, "0.0.1", build_wheel(older, files, version="0.0.1"))
    result = project.run("check", "--wheel", str(older), "--json")
    assert json.loads(result.out)["patches"][0]["status"] == "conflict"


def test_apply_tells_a_line_per_patch_off_a_terminal(three_patches, tmp_path) -> None:
    tree = tmp_path / "fresh-tree"
    result = three_patches.run("apply", "--tree", str(tree))
    assert result.code == 0, result.err
    lines = [line for line in result.err.splitlines() if line.startswith("[")]
    assert [line.split(" (")[0] for line in lines] == [
        "[1/3] 0001-raise-value.patch",
        "[2/3] 0002-fix-the-answer.patch",
        "[3/3] 0003-raise-the-limit.patch",
    ]
    # --json: the result only, on stdout; no progress on stderr.
    quiet = three_patches.run("apply", "--tree", str(tmp_path / "other"), "--json")
    assert quiet.code == 0 and "[1/3]" not in quiet.err


def test_a_tree_on_another_upstream_borrows_only_blobs_of_the_base(
    project: Project, tmp_path: Path
) -> None:
    from xpu_series.git import Git
    from xpu_series.stack.tree import PIN_BASE_REF, borrow_blobs

    (cache_repo,) = (project.root / "build/cache/bases").glob("*.git")
    other = Git(tmp_path / "other")
    git(tmp_path, "init", "-q", "other")
    known = git(project.tree, "rev-parse", "upstream:python/sglang/srt/flags.py")
    # A blob a lower patch made is not in the base: it is left out, not an error.
    made = "0" * 40
    assert borrow_blobs(other, cache_repo, {known, made}) == 1
    assert (
        other.out("cat-file", "-p", known) == BASE_FILES["sglang/srt/flags.py"].strip()
    )
    # Kept by the ref, so no gc takes it while the tree is merged into.
    assert other.out("ls-tree", "-r", "--name-only", PIN_BASE_REF) == (
        f"{known[:2]}/{known[2:]}"
    )
    assert borrow_blobs(other, cache_repo, {made}) == 0


def _other_filesystem(than: Path) -> Path | None:
    """A folder on another filesystem than `than` (a tmpfs, or the checkout's
    build/ when the tests run on one), or None."""
    here = os.stat(than).st_dev
    for place in (Path("/dev/shm"), Path(__file__).resolve().parents[2] / "build"):
        if place.is_dir() and os.access(place, os.W_OK):
            if os.stat(place).st_dev != here:
                return place
    return None


def test_a_tree_on_another_filesystem_than_the_cache_is_built(
    three_patches: Project,
) -> None:
    place = _other_filesystem(three_patches.root)
    if place is None:
        pytest.skip("no writable folder on another filesystem than the tests'")
    folder = Path(tempfile.mkdtemp(prefix="xpu-apply-", dir=place))
    try:
        tree = folder / "sglang"
        result = three_patches.run("apply", "--tree", str(tree), "--json")
        assert result.code == 0, result.out + result.err
        assert subjects(tree) == [
            "[XPU] Raise VALUE",
            "[XPU] Fix the answer",
            "[XPU] Raise the limit",
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
