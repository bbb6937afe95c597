"""What a maintainer needs to move a series for real: a plan that retires or drops
any patch, resolutions recorded once and replayed, patches/ edits that survive the
write-out, older releases served with the retired patches they still need, and a
status that tells the truth while a rebase is stopped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import Project, git
from test_rebase import _conflicting_release, newer

from xpu_series.stack.operation import snapshot


def _stop_at_0002(project: Project, wheel: Path) -> None:
    """Start a rebase onto `wheel` that stops at 0002's conflict."""
    assert project.run("rebase", "--onto", "0.0.2", "--wheel", str(wheel)).code == 3


def _resolve_0002(project: Project, body: str = "return 42") -> None:
    """Resolve 0002's conflict by hand and stage it, as the hint says."""
    other = project.tree / "python/sglang/srt/other.py"
    other.write_text(f"def answer():\n    {body}\n")
    git(project.tree, "add", "-A")


def _plan(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "move.plan"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plan_retires_a_patch_that_still_applies_with_its_release_and_reason(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = newer(tmp_path, version="0.0.3")
    plan = _plan(tmp_path, "retire 0003 0.0.2 upstream raised the limit its own way")
    result = three_patches.run(
        "rebase", "--onto", "0.0.3", "--wheel", str(wheel), "--plan", str(plan),
        "--json",
    )  # fmt: skip
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert [p["status"] for p in data["patches"]] == ["applied", "applied", "absorbed"]
    retired = (
        three_patches.patches / "upstreamed/0003-raise-the-limit.patch"
    ).read_text()
    assert "Applied-Upstream: 0.0.2\n" in retired
    assert (
        "Upstream-Status: Inappropriate [not needed from 0.0.2: upstream raised the "
        "limit its own way]\n" in retired
    )
    assert "Upstream-Status: Pending" not in retired
    recorded = (three_patches.patches / "moves/0.0.1-to-0.0.3.plan").read_text()
    assert "retire 0003-raise-the-limit.patch 0.0.2 upstream raised" in recorded
    assert "0003" not in (three_patches.patches / "series").read_text()
    assert three_patches.run("check").code == 0


def test_plan_drops_a_patch_and_bad_plans_are_refused_before_anything_changes(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = newer(tmp_path)
    before = snapshot(three_patches.patches)
    for lines, words in (
        (["retire 0009 0.0.2 gone"], "not a patch of the series"),
        (["retire 0001 0.0.9 later"], "the rebase goes onto 0.0.2"),
        (["retire 0001 soon because"], "not a release version"),
        (["drop 0001"], "needs a reason"),
        (["squash 0001 x"], "unknown action"),
        (["drop 0001 a", "drop 0001 b"], "decided twice"),
    ):
        plan = _plan(tmp_path, *lines)
        result = three_patches.run(
            "rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--plan", str(plan)
        )
        assert result.code == 2 and words in result.err, (lines, result.err)
        assert snapshot(three_patches.patches) == before
        assert not (three_patches.root / "build/operation").exists()
    plan = _plan(tmp_path, "# why", "pick 0001", "drop 0002 upstream reworked it")
    result = three_patches.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--plan", str(plan)
    )
    assert result.code == 0, result.err
    dropped = (three_patches.patches / "dropped/0002-fix-the-answer.patch").read_text()
    assert "Dropped: 0.0.2: upstream reworked it" in dropped


def test_skip_upstreamed_records_since_and_reason_in_the_header(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    _stop_at_0002(three_patches, wheel)
    late = three_patches.run(
        "rebase", "--skip", "--upstreamed", "--since", "0.0.5", "--reason", "x"
    )
    assert late.code == 2 and "the rebase goes onto 0.0.2" in late.err
    result = three_patches.run(
        "rebase", "--skip", "--upstreamed", "--since", "0.0.2",
        "--reason", "upstream answers 40 now",
    )  # fmt: skip
    assert result.code == 0, result.err
    text = (three_patches.patches / "upstreamed/0002-fix-the-answer.patch").read_text()
    assert "Applied-Upstream: 0.0.2\n" in text
    assert "upstream answers 40 now]" in text
    plan = (three_patches.patches / "moves/0.0.1-to-0.0.2.plan").read_text()
    assert "retire 0002-fix-the-answer.patch 0.0.2 upstream answers 40 now" in plan


def test_a_file_written_under_patches_while_stopped_survives_the_write_out(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    _stop_at_0002(three_patches, wheel)
    notes = three_patches.patches / "NOTES.md"
    notes.write_text("why 0002 conflicts\n")
    # An edit of a file the write-out rewrites too is kept aside, not lost.
    mine = three_patches.patches / "0002-fix-the-answer.patch"
    my_edit = mine.read_text().replace("Fix the answer", "Fix the answer (mine)")
    mine.write_text(my_edit)
    _resolve_0002(three_patches)
    result = three_patches.run("rebase", "--continue")
    assert result.code == 0, result.err
    assert notes.read_text() == "why 0002 conflicts\n"
    assert "kept your change to patches/NOTES.md" in result.out + result.err
    kept = list(
        (three_patches.root / "build").glob("rebase-kept-*/0002-fix-the-answer.patch")
    )
    assert [p.read_text() for p in kept] == [my_edit]
    assert "your copy is in" in result.out + result.err


def test_a_hand_resolution_is_recorded_and_replayed_byte_for_byte(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = _conflicting_release(tmp_path)
    old_patches = tmp_path / "old-patches"
    shutil.copytree(three_patches.patches, old_patches)
    _stop_at_0002(three_patches, wheel)
    _resolve_0002(three_patches, "return 42  # resolved")
    first = three_patches.run("rebase", "--continue", "--json")
    assert first.code == 0, first.err
    moved = snapshot(three_patches.patches)
    records = [k for k in moved if k.startswith("resolutions/0002-fix-the-answer/")]
    assert len(records) == 1 and records[0].split("/")[-1].startswith("0.0.2-")
    # Replay: the old series plus the recorded resolutions and plans, moved again.
    shutil.rmtree(three_patches.patches)
    shutil.copytree(old_patches, three_patches.patches)
    for rel in moved:
        if rel.startswith(("resolutions/", "moves/")):
            (three_patches.patches / rel).parent.mkdir(parents=True, exist_ok=True)
            (three_patches.patches / rel).write_bytes(moved[rel])
    assert three_patches.run("apply", "--force").code == 0
    plan = three_patches.patches / "moves/0.0.1-to-0.0.2.plan"
    again = three_patches.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--plan", str(plan),
        "--json",
    )  # fmt: skip
    assert again.code == 0, again.err
    data = json.loads(again.out)
    assert (
        "resolved as recorded in patches/resolutions/" in data["patches"][1]["detail"]
    )
    assert snapshot(three_patches.patches) == moved


def test_status_while_stopped_tells_each_patch_and_every_way_on(
    three_patches: Project, tmp_path: Path
) -> None:
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "series")):
        git(three_patches.root, *args)
    wheel = _conflicting_release(tmp_path)
    _stop_at_0002(three_patches, wheel)
    status = three_patches.run("status", "--json")
    rows = {p["name"]: p["status"] for p in json.loads(status.out)["patches"]}
    assert rows == {
        "0001-raise-value.patch": "applied",
        "0002-fix-the-answer.patch": "stopped (conflict)",
        "0003-raise-the-limit.patch": "to do",
    }
    text = three_patches.run("status").out
    assert "--skip --reason TEXT" in text and "--continue" in text
    assert "patches/ is rewritten only when the rebase finishes" in text
    diff = three_patches.run("range-diff")
    assert "patches/ is rewritten only when it finishes" in diff.err
    refused = three_patches.run("apply")
    assert (
        "a rebase onto sglang 0.0.2" in refused.err and "an rebase" not in refused.err
    )
    # A hand resolution is what the rebase's own table calls it: merged.
    _resolve_0002(three_patches)
    assert three_patches.run("rebase", "--continue").code == 0
    rows = {
        p["name"]: p["status"]
        for p in json.loads(three_patches.run("status", "--json").out)["patches"]
    }
    assert rows["0002-fix-the-answer.patch"] == "merged"


def test_abort_keeps_a_hand_resolution_on_a_named_branch(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = newer(tmp_path, other="def answer():\n    return 40\n", third="LIMIT = 9\n")
    _stop_at_0002(three_patches, wheel)
    _resolve_0002(three_patches, "return 42  # by hand")
    assert three_patches.run("rebase", "--continue").code == 3  # stops at 0003 now
    aborted = three_patches.run("rebase", "--abort")
    assert aborted.code == 0, aborted.err
    assert "your resolution of 0002-fix-the-answer.patch is kept on branch" in (
        aborted.out
    )
    branch = aborted.out.split("kept on branch ", 1)[1].split()[0]
    shown = git(three_patches.tree, "show", f"{branch}:python/sglang/srt/other.py")
    assert "# by hand" in shown


def test_an_older_release_gets_the_retired_patches_it_still_needs(
    three_patches: Project, tmp_path: Path
) -> None:
    """After a move to 0.0.3 that retired 0001 from 0.0.3, applying onto 0.0.2
    carries 0001 again (in series order); 0.0.3 itself does not."""
    w2 = newer(tmp_path, version="0.0.2")
    w3 = newer(tmp_path, version="0.0.3", flags="VALUE = 2\nNAME = 'upstream'\n")
    assert (
        three_patches.run("fetch", "--upstream", "0.0.2", "--wheel", str(w2)).code == 0
    )
    plan = _plan(tmp_path, "retire 0001 0.0.3 upstream raised VALUE")
    moved = three_patches.run(
        "rebase", "--onto", "0.0.3", "--wheel", str(w3), "--plan", str(plan)
    )
    assert moved.code == 0, moved.err
    older = three_patches.run("apply", "--upstream", "0.0.2", "--json")
    assert older.code == 0, older.err
    data = json.loads(older.out)
    assert [p["name"] for p in data["patches"]] == [
        "0001-raise-value.patch",
        "0002-fix-the-answer.patch",
        "0003-raise-the-limit.patch",
    ]
    assert {p["status"] for p in data["patches"]} == {"applied"}
    assert any(
        "also gets the retired 0001-raise-value.patch" in n for n in data["notes"]
    ), data["notes"]
    flags = (three_patches.tree / "python/sglang/srt/flags.py").read_text()
    assert flags.startswith("VALUE = 2")
    status = three_patches.run("status", "--json")
    assert json.loads(status.out)["ok"] is True, status.out
    pinned = three_patches.run("apply", "--json")
    assert pinned.code == 0, pinned.err
    names = [p["name"] for p in json.loads(pinned.out)["patches"]]
    assert names == ["0002-fix-the-answer.patch", "0003-raise-the-limit.patch"]


def test_status_says_when_this_python_imports_another_checkouts_tree(
    project: Project, tmp_path: Path, monkeypatch
) -> None:
    import sysconfig

    site = tmp_path / "site"
    site.mkdir()
    other = tmp_path / "other-clone" / "build" / "sglang" / "python"
    (site / "xpu-series-tree.pth").write_text(f"{other}\n")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(site)})
    text = project.run("status").out
    assert f"imports sglang from {other}, not {project.tree}" in text
    (site / "xpu-series-tree.pth").write_text(f"{project.tree / 'python'}\n")
    assert "imports sglang from" not in project.run("status").out


def test_drift_separates_what_changed_from_what_the_environment_violates(
    three_patches: Project, tmp_path: Path
) -> None:
    from conftest import BASE_FILES, build_wheel, wheel_name

    (three_patches.root / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.optional-dependencies]\n'
        'test = ["torch==2.14.1", "openai==3.0.0", "regex==1.0"]\n'
    )
    build_wheel(
        tmp_path / "rebuilt.whl", BASE_FILES, requires=("openai==2.6.1", "regex")
    )
    new = tmp_path / "wheels" / wheel_name("0.0.2")
    new.parent.mkdir()
    build_wheel(
        new, BASE_FILES, version="0.0.2",
        requires=("openai==2.8.0", "regex==2.0", "torch==2.14.1"),
    )  # fmt: skip
    from xpu_series.rebase.plan import (
        dependency_drift,
        environment_violations,
        pinned_test_env,
        requires_dist,
    )

    reqs = requires_dist(tmp_path / "rebuilt.whl"), requires_dist(new)
    pins = pinned_test_env(three_patches.root / "pyproject.toml")
    drift = {r.name: r.action for r in dependency_drift(*reqs, pins)}
    assert drift["openai"] == "openai==3.0.0 did not satisfy the old release either"
    assert drift["regex"].startswith("change pyproject.toml: regex==1.0")
    assert drift["torch"] == "the pinned version still satisfies it"
    since = {r.name: r.action for r in environment_violations(*reqs, pins)}
    assert since == {
        "openai": "unmet by the old release too",
        "regex": "unmet from this release",
    }


def test_unregister_follows_the_rebase_hint_and_records_why(
    three_patches: Project, tmp_path: Path
) -> None:
    tests = three_patches.root / "test"
    tests.mkdir()
    (tests / "test_value.py").write_text(
        "from sglang.srt import flags\n\n\ndef test():\n    assert flags.VALUE == 2\n"
    )
    first = three_patches.patches / "0001-raise-value.patch"
    first.write_text(
        first.read_text().replace("---\n", "Tests: test/test_value.py\n---\n", 1)
    )
    wheel = newer(tmp_path)
    plan = _plan(tmp_path, "retire 0001 0.0.2 upstream reverted VALUE on purpose")
    result = three_patches.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--plan", str(plan)
    )
    assert result.code == 0, result.err
    assert "running the tests of 1 retired patches on the new base" in result.err
    hint = "xpu-series unregister 0001-raise-value.patch --reason TEXT"
    assert hint in result.out
    carried = three_patches.run("unregister", "0002", "--reason", "x")
    assert carried.code == 2 and "carried by the series" in carried.err
    no_reason = three_patches.run("unregister", "0001-raise-value.patch")
    assert no_reason.code == 2 and "--reason" in no_reason.err
    done = three_patches.run(
        "unregister", "0001-raise-value.patch", "--reason", "upstream reverted it"
    )
    assert done.code == 0, done.err
    assert not (tests / "test_value.py").exists()
    retired = (three_patches.patches / "upstreamed/0001-raise-value.patch").read_text()
    assert "Tests-Removed: test/test_value.py (upstream reverted it)\n" in retired
    assert "\nTests:" not in retired
    assert three_patches.run("check").code == 0
    again = three_patches.run("unregister", "0001", "--reason", "again")
    assert again.code == 2 and "names no Tests" in again.err


def test_plan_edit_stops_after_a_patch_and_the_amended_commit_is_carried(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = newer(tmp_path)
    plan = _plan(tmp_path, "edit 0003")
    stopped = three_patches.run(
        "rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--plan", str(plan)
    )
    assert stopped.code == 3, stopped.err
    assert "stopped after 0003-raise-the-limit.patch so you can edit it" in stopped.err
    third = three_patches.tree / "python/sglang/srt/third.py"
    assert third.read_text() == "LIMIT = 20\n"
    third.write_text("LIMIT = 30\n")
    dirty = three_patches.run("rebase", "--continue")
    assert dirty.code == 1 and "commit --amend" in dirty.err
    git(three_patches.tree, "commit", "-q", "-a", "--amend", "--no-edit")
    done = three_patches.run("rebase", "--continue", "--json")
    assert done.code == 0, done.err
    statuses = [p["status"] for p in json.loads(done.out)["patches"]]
    assert statuses == ["applied", "applied", "merged"]
    text = (three_patches.patches / "0003-raise-the-limit.patch").read_text()
    assert "+LIMIT = 30" in text
    recorded = [
        rel
        for rel in snapshot(three_patches.patches)
        if rel.startswith("resolutions/0003-raise-the-limit/")
    ]
    assert len(recorded) == 1
    assert (
        "edit 0003-raise-the-limit.patch"
        in (three_patches.patches / "moves/0.0.1-to-0.0.2.plan").read_text()
    )


def test_a_dropped_commit_at_an_edit_stop_follows_the_skip_hint(
    three_patches: Project, tmp_path: Path
) -> None:
    wheel = newer(tmp_path)
    plan = _plan(tmp_path, "edit 0003")
    stop = ("rebase", "--onto", "0.0.2", "--wheel", str(wheel), "--plan", str(plan))
    assert three_patches.run(*stop).code == 3
    git(three_patches.tree, "reset", "-q", "--hard", "HEAD~1")
    refused = three_patches.run("rebase", "--continue")
    assert refused.code == 1 and "has no commit" in refused.err
    hint = "xpu-series rebase --skip --reason TEXT"
    assert hint in refused.err
    done = three_patches.run("rebase", "--skip", "--reason", "not wanted after all")
    assert done.code == 0, done.err
    dropped = three_patches.patches / "dropped/0003-raise-the-limit.patch"
    assert "Dropped: 0.0.2: not wanted after all" in dropped.read_text()
    assert three_patches.run("check").code == 0
