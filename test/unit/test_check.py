"""check: static problems are all reported in one run; the dry run never touches
the user's tree."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from conftest import Project, git, local_index

from xpu_series.proofs.record import sample


def test_clean_series_checks_ok(three_patches: Project) -> None:
    result = three_patches.run("check", "--json")
    data = json.loads(result.out)
    assert result.code == 0 and data["ok"] is True
    assert [p["status"] for p in data["patches"]] == ["applied"] * 3


def test_every_static_problem_is_reported_at_once(three_patches: Project) -> None:
    series = three_patches.patches / "series"
    series.write_text(
        series.read_text()
        + "0002-fix-the-answer.patch\n"  # listed twice
        + "0009-gone.patch\n"  # listed, no file
    )
    (three_patches.patches / "0010-stray.patch").write_text("not listed\n")
    bad = three_patches.patches / "0003-raise-the-limit.patch"
    bad.write_text(bad.read_text().replace("Upstream-Status: Pending\n", ""))
    result = three_patches.run("check", "--json")
    data = json.loads(result.out)
    assert result.code == 1 and data["ok"] is False
    problems = "\n".join(data["problems"])
    assert "lists 0002-fix-the-answer.patch more than once" in problems
    assert "lists 0009-gone.patch, which does not exist" in problems
    assert "0010-stray.patch is not listed" in problems
    assert "0003-raise-the-limit.patch has no Upstream-Status field" in problems
    statuses = {p["name"]: p["status"] for p in data["patches"]}
    assert statuses["0009-gone.patch"] == "missing"


def test_subject_without_xpu_prefix_is_malformed(three_patches: Project) -> None:
    patch = three_patches.patches / "0001-raise-value.patch"
    patch.write_text(patch.read_text().replace("[XPU] Raise VALUE", "Raise VALUE"))
    result = three_patches.run("check")
    assert result.code == 1
    assert "does not start with '[XPU] '" in result.err


def test_patch_outside_python_sglang_is_refused(three_patches: Project) -> None:
    patch = three_patches.patches / "0003-raise-the-limit.patch"
    patch.write_text(
        patch.read_text().replace("python/sglang/srt/third.py", "setup.py")
    )
    result = three_patches.run("check")
    assert result.code == 1
    assert "setup.py is outside python/sglang/" in result.err


def test_check_does_not_touch_the_users_tree(three_patches: Project) -> None:
    (three_patches.tree / "python/sglang/srt/other.py").write_text("# mine\n")
    head = git(three_patches.tree, "rev-parse", "HEAD")
    assert three_patches.run("check").code == 0
    assert git(three_patches.tree, "rev-parse", "HEAD") == head
    assert (three_patches.tree / "python/sglang/srt/other.py").read_text() == "# mine\n"


def test_conflict_in_check_exits_1_not_3(three_patches: Project) -> None:
    p2 = three_patches.patches / "0002-fix-the-answer.patch"
    p2.write_text(p2.read_text().replace("-    return 41", "-    return 40"))
    result = three_patches.run("check", "--json")
    assert result.code == 1
    statuses = [p["status"] for p in json.loads(result.out)["patches"]]
    assert statuses == ["applied", "conflict", "applied"]


def test_repeated_checks_reuse_a_clean_scratch_tree(three_patches: Project) -> None:
    assert three_patches.run("check").code == 0
    scratch = three_patches.root / "build" / "check" / "0.0.1"
    (scratch / "python/sglang/srt/leftover.py").write_text("x = 1\n")
    result = three_patches.run("check", "--json")
    assert result.code == 0
    assert not (scratch / "python/sglang/srt/leftover.py").exists()
    assert git(scratch, "stash", "list") == ""
    assert "xpu-series/backup" not in git(scratch, "branch", "--list")


def test_matrix_shows_each_patch_on_each_release(
    three_patches: Project, tmp_path
) -> None:
    from conftest import BASE_FILES, build_wheel, wheel_name

    files = dict(BASE_FILES, **{"sglang/srt/third.py": "LIMIT = 20\n"})
    newer = tmp_path / wheel_name("0.0.2")
    build_wheel(newer, files, version="0.0.2")
    result = three_patches.run("matrix", "--wheel", str(newer))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == ["patch", "0.0.1", "0.0.2"]
    assert lines[3].split() == ["0003-raise-the-limit.patch", "applied", "absorbed"]
    data = json.loads(three_patches.run("matrix", "--wheel", str(newer), "--json").out)
    assert set(data["versions"]) == {"0.0.1", "0.0.2"}


def test_metadata_is_checked_against_reality(three_patches: Project) -> None:
    def edit(name: str, old: str, new: str) -> None:
        path = three_patches.patches / name
        path.write_text(path.read_text().replace(old, new, 1))

    assert three_patches.run("check").code == 0
    edit("0001-raise-value.patch", "Origin: other, written for the tool tests\n", "")
    edit("0002-fix-the-answer.patch", "Concern: fix-the-answer", "Concern: raise-value")
    edit(
        "0003-raise-the-limit.patch",
        "Upstream-Status: Pending",
        "Upstream-Status: Backport [0.0.1]\nApplied-Upstream: 0.0.1",
    )
    result = three_patches.run("check", "--json")
    assert result.code == 1
    problems = "\n".join(json.loads(result.out)["problems"])
    assert "0001-raise-value.patch has no Origin field" in problems
    assert "0002-fix-the-answer.patch and 0001-raise-value.patch share Concern" in (
        problems
    )
    assert "says Applied-Upstream 0.0.1, at or below the pin 0.0.1" in problems
    assert "says Upstream-Status: Backport 0.0.1, at or below the pin" in problems
    edit(
        "0002-fix-the-answer.patch", "Upstream-Status: Pending", "Upstream-Status: Soon"
    )
    assert "'Soon' is not one of" in three_patches.run("check").err


def _three_patches_and_a_newer_release(project: Project, tmp_path) -> Path:
    """Three tested patches on the pin 0.0.1, and the wheel of 0.0.2, where
    upstream has the first, the second still applies and is needed, and the
    third applies but its test imports a module 0.0.2 no longer has."""
    from conftest import BASE_FILES, build_wheel, wheel_name

    tests = project.root / "test"
    tests.mkdir()
    cases = {
        "value": ("flags", "VALUE", "2"),
        "answer": ("other", "answer()", "42"),
        "limit": ("third", "LIMIT", "20"),
    }
    for name, (module, symbol, value) in cases.items():
        imported = symbol.rstrip("()")
        helper = "from sglang.srt.long import LINE_1  # upstream moves it\n"
        (tests / f"test_{name}.py").write_text(
            (helper if name == "limit" else "")
            + f"from sglang.srt.{module} import {imported}\n\n"
            f"def test_{name}():\n    assert {symbol} == {value}\n"
        )
    project.add_patch("python/sglang/srt/flags.py", "VALUE = 2\nNAME = 'upstream'\n",
                      "[XPU] Raise VALUE", Tests="test/test_value.py")  # fmt: skip
    project.add_patch("python/sglang/srt/other.py", "def answer():\n    return 42\n",
                      "[XPU] Fix the answer", Tests="test/test_answer.py")  # fmt: skip
    project.add_patch("python/sglang/srt/third.py", "LIMIT = 20\n",
                      "[XPU] Raise the limit", Tests="test/test_limit.py")  # fmt: skip
    # 0.0.2: upstream has VALUE = 2; other.py unchanged; long.py (a helper only
    # 0003's test uses) is gone, so 0003 still applies but its test needs porting.
    files = dict(BASE_FILES)
    files["sglang/srt/flags.py"] = "VALUE = 2\nNAME = 'upstream'\n"
    files["sglang/srt/long1.py"] = files.pop("sglang/srt/long.py")
    newer = tmp_path / wheel_name("0.0.2")
    build_wheel(newer, files, version="0.0.2")
    return newer


def _verdicts(result) -> dict[str, dict[str, str]]:  # noqa: ANN001
    return {p["name"]: p["behaviour"] for p in json.loads(result.out)["patches"]}


def test_behavioural_matrix_says_which_release_still_needs_each_patch(
    project: Project, tmp_path
) -> None:
    newer = _three_patches_and_a_newer_release(project, tmp_path)
    result = project.run("matrix", "--wheel", str(newer), "--behaviour", "--json")
    assert result.code == 0, result.err
    # Progress: a line per test run (its release and commit) and per release.
    assert re.search(
        r"^matrix 0\.0\.2 [0-9a-f]{12}: .* passed in \d+s", result.err, re.M
    )
    assert re.search(r"^matrix 0\.0\.2: 2/3 patches apply in \d+s", result.err, re.M)
    assert re.search(r"^matrix 0\.0\.2: \d test runs to make$", result.err, re.M)
    data = json.loads(result.out)
    assert data["versions"] == ["0.0.1", "0.0.2"]
    rows = {p["name"]: p for p in data["patches"]}
    assert rows["0001-raise-value.patch"]["behaviour"] == {
        "0.0.1": "needed", "0.0.2": "upstream-has-it",
    }  # fmt: skip
    assert rows["0001-raise-value.patch"]["no_longer_needed"]["version"] == "0.0.2"
    assert rows["0002-fix-the-answer.patch"]["behaviour"]["0.0.2"] == "needed"
    assert rows["0002-fix-the-answer.patch"]["no_longer_needed"] == {}
    assert rows["0003-raise-the-limit.patch"]["behaviour"]["0.0.2"] == (
        "tests-need-porting"
    )
    markdown = project.run("matrix", "--wheel", str(newer), "--behaviour", "--markdown")
    assert "| 0001-raise-value | applied / needed | absorbed / upstream-has-it |" in (
        markdown.out
    )


def test_one_worker_runs_every_release_from_its_own_tree(
    project: Project, tmp_path, monkeypatch
) -> None:
    # One lane: the same worker interpreter runs both releases' tests, each
    # fork importing sglang from its own release's worktree. A fork that kept
    # the first release's sglang would call 0001 needed on 0.0.2 as well.
    newer = _three_patches_and_a_newer_release(project, tmp_path)
    args = ("matrix", "--wheel", str(newer), "--behaviour", "--json")
    one = project.run(*args, "--jobs", "1")
    assert one.code == 0, one.err
    assert _verdicts(one)["0001-raise-value.patch"] == {
        "0.0.1": "needed", "0.0.2": "upstream-has-it",
    }  # fmt: skip
    assert _verdicts(one)["0002-fix-the-answer.patch"]["0.0.2"] == "needed"
    assert _verdicts(one)["0003-raise-the-limit.patch"]["0.0.2"] == (
        "tests-need-porting"
    )
    # Each release says when its runs are in, and none came from a cache.
    assert re.search(
        r"^matrix 0\.0\.2: \d test runs \(0 from the cache\) done", one.err, re.M
    )
    # Two lanes (runs in either order, from a fresh cache) measure the same.
    shutil.rmtree(project.root / "build" / "cache" / "outcomes")
    from xpu_series.proofs import proof

    monkeypatch.setattr(proof, "RUNS_PER_LANE", 1)  # two lanes, however few runs
    two = project.run(*args, "--jobs", "2")
    assert "2 at a time" in two.err
    assert _verdicts(two) == _verdicts(one)


def test_matrix_asks_the_index_for_newer_releases(
    three_patches: Project, tmp_path, monkeypatch
) -> None:
    versions = ("0.0.0", "0.0.1", "0.0.2", "0.0.3rc1")
    local_index(tmp_path / "index", monkeypatch, versions)
    result = three_patches.run("matrix", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["versions"] == ["0.0.1", "0.0.2"]
    # --releases names them without running anything (CI keys the step on it).
    listed = three_patches.run("matrix", "--releases")
    assert (listed.code, listed.out.split()) == (0, ["0.0.1", "0.0.2"])
    # Serving 0.0.0 too: the default adds it, --newer (the scheduled workflow's
    # question) leaves the served older releases out.
    pin = three_patches.root / "patches" / "upstream.toml"
    pin.write_text(
        pin.read_text().replace("[layout]", 'serves-from = "0.0.0"\n\n[layout]')
    )
    served = three_patches.run("matrix", "--json")
    assert json.loads(served.out)["versions"] == ["0.0.0", "0.0.1", "0.0.2"]
    newer = three_patches.run("matrix", "--newer", "--json")
    assert json.loads(newer.out)["versions"] == ["0.0.1", "0.0.2"]
    releases = json.loads(three_patches.run("matrix", "--releases", "--json").out)
    assert releases == {"releases": ["0.0.0", "0.0.1", "0.0.2"]}
    # One line per finished release, with the time it took.
    assert "matrix 0.0.2: 3/3 patches apply in " in newer.err
    assert "[2/2 releases, " in newer.err
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    offline = three_patches.run("matrix")
    assert offline.code == 1
    assert "could not reach the package index to list sglang releases" in offline.err
    assert three_patches.run("matrix", "--releases").code == 1


def test_an_unchanged_scratch_tree_answers_from_its_record(
    three_patches: Project,
) -> None:
    first = json.loads(three_patches.run("check", "--json").out)
    again = json.loads(three_patches.run("check", "--json").out)
    assert "unchanged since the last run" in " ".join(again["notes"])
    assert again["patches"] == first["patches"]
    # Any change to the series is a new question: applied again, new answer.
    p2 = three_patches.patches / "0002-fix-the-answer.patch"
    p2.write_text(p2.read_text().replace("-    return 41", "-    return 40"))
    changed = json.loads(three_patches.run("check", "--json").out)
    assert "unchanged since the last run" not in " ".join(changed["notes"])
    assert changed["patches"][1]["status"] == "conflict"


def test_the_matrix_reads_its_fast_tests_off_what_verify_ran_on_the_same_tree(
    project: Project,
) -> None:
    tests = project.root / "test"
    tests.mkdir()
    (tests / "test_value.py").write_text(
        "from sglang.srt.flags import VALUE\n\n"
        "def test_value():\n    assert VALUE == 2\n\n"
        "def test_slow_twin():\n    assert VALUE == 2\n"
    )
    project.add_patch(
        "python/sglang/srt/flags.py", "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE", Tests="test/test_value.py",
        Fast_Tests="test/test_value.py::test_value",
    )  # fmt: skip
    assert project.run("verify").code == 0
    # The pin's column: both trees (without, with) were run by verify, with more
    # tests than the matrix asks for; their outcomes are read, not run again.
    result = project.run("matrix", "0.0.1", "--behaviour", "--json")
    assert result.code == 0, result.err
    assert "2 test runs (2 from the cache)" in result.err
    (row,) = json.loads(result.out)["patches"]
    assert row["behaviour"] == {"0.0.1": "needed"}
    # Only the Fast-Tests are counted, as if the matrix had run them itself.
    assert row["detail"]["0.0.1"] == (
        "without: 0 passed, 1 failed; with: 1 passed, 0 failed"
    )
    # A test file that changed since is a new question: its outcomes are run.
    (tests / "test_value.py").write_text(
        (tests / "test_value.py").read_text() + "\n# changed\n"
    )
    again = project.run("matrix", "0.0.1", "--behaviour", "--json")
    assert "2 test runs (0 from the cache)" in again.err


def _hinted_command(err: str) -> list[str]:
    """The command a `hint: run '...'` line names, without the program name."""
    (line,) = [x for x in err.splitlines() if x.startswith("hint: run '")]
    return line.split("'")[1].split()[1:]


def test_the_matrix_record_stands_for_unchanged_cells_of_served_releases(
    project: Project, tmp_path, monkeypatch
) -> None:
    _three_patches_and_a_newer_release(project, tmp_path)
    local_index(tmp_path / "index", monkeypatch, ("0.0.0", "0.0.1"))
    pin = project.root / "patches" / "upstream.toml"
    pin.write_text(
        pin.read_text().replace("[layout]", 'serves-from = "0.0.0"\n\n[layout]')
    )
    for name in ("CI", "XPU_SERIES_PROVE_ALL", "XPU_SERIES_PROOF_SAMPLE"):
        monkeypatch.delenv(name, raising=False)
    record = project.root / "patches" / "matrix-record.json"
    args = ("matrix", "--behaviour", "--json")
    first = project.run(*args)
    assert first.code == 0, first.err
    assert "matrix record:" not in first.err and not record.exists()
    assert _verdicts(first)["0001-raise-value.patch"]["0.0.0"] == "needed"

    written = project.run(*args, "--record")
    assert written.code == 0 and f"matrix record: wrote {record}" in written.err
    cells = json.loads(record.read_text())["releases"]
    assert list(cells) == ["0.0.0"]  # the pin's column is verify's to record
    assert sorted(cells["0.0.0"]) == sorted(_verdicts(first))
    assert {"release", "status", "tests", "trees", "patch", "below"} <= set(
        cells["0.0.0"]["0001-raise-value.patch"]["inputs"]
    )

    # A fresh clone (no outcome cached) with no sample: every 0.0.0 cell is the
    # record's, none is run, and the verdicts are the measured ones.
    shutil.rmtree(project.root / "build" / "cache" / "outcomes")
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    trusted = project.run(*args)
    assert trusted.code == 0, trusted.err
    assert (
        "matrix record: 3 of 3 cells from patches/matrix-record.json; "
        "re-measuring none" in trusted.err
    )
    assert re.search(
        r"^matrix 0\.0\.0: 0 test runs to make \(3 patches from the matrix "
        r"record\)$",
        trusted.err,
        re.M,
    )
    assert _verdicts(trusted) == _verdicts(first)
    row = json.loads(trusted.out)["patches"][0]
    assert row["detail"]["0.0.0"].endswith("(matrix record)")

    # Each cell keeps how long its runs took, and the sample passes over a
    # costly later pick (proofs/record.py: sample) as verify's does: with a seed
    # that draws a costly cell first, it is taken, the other is passed over.
    original = record.read_text()
    timed = json.loads(original)
    cells = timed["releases"]["0.0.0"]
    assert all(isinstance(c["result"]["seconds"], int) for c in cells.values())
    labels = [f"0.0.0 {name}" for name in sorted(cells)]
    planted = dict(zip(labels, (900, 900, 1), strict=True))
    seed = next(
        k for k in range(1, 5000) if sample(k, labels, 1, planted, 30) == labels[:1]
    )
    ranked = labels
    for label, seconds in planted.items():
        cells[label.split(" ", 1)[1]]["result"]["seconds"] = seconds
    record.write_text(json.dumps(timed))
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "2")
    monkeypatch.setenv("XPU_SERIES_PROOF_SEED", str(seed))
    bounded = project.run(*args)
    assert bounded.code == 0, bounded.err
    again = re.search(rf"re-measuring (.*) \(seed {seed};", bounded.err)
    assert again and sorted(again[1].split(", ")) == sorted([ranked[0], ranked[2]])
    monkeypatch.setenv("XPU_SERIES_PROOF_SAMPLE", "0")
    monkeypatch.delenv("XPU_SERIES_PROOF_SEED")
    record.write_text(original)

    # Every cell re-measured (the weekly run): one the record tells wrong fails.
    kept = record.read_text()
    bad = json.loads(kept)
    bad["releases"]["0.0.0"]["0001-raise-value.patch"]["result"]["without"][
        "failed"
    ] = 0
    record.write_text(json.dumps(bad))
    monkeypatch.setenv("XPU_SERIES_PROVE_ALL", "1")
    wrong = project.run(*args)
    assert wrong.code == 1
    assert "0.0.0: 0001-raise-value.patch: re-measured, its tests count" in wrong.err
    monkeypatch.delenv("XPU_SERIES_PROVE_ALL")
    record.write_text(kept)

    # A changed test file: its cell is measured in full, and CI fails on the
    # stale record until the command its hint names writes it again.
    test_file = project.root / "test" / "test_value.py"
    test_file.write_text(test_file.read_text() + "\n# changed\n")
    monkeypatch.setenv("CI", "true")
    stale = project.run(*args)
    assert stale.code == 1
    assert "0.0.0 0001-raise-value.patch (changed: tests)" in stale.err
    assert "0.0.0 0002" not in stale.err
    assert _verdicts(stale) == _verdicts(first)
    followed = project.run(*_hinted_command(stale.err))
    assert followed.code == 0, followed.err
    assert project.run(*args).code == 0
