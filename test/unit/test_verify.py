"""verify: each patch's tests must fail at prefix k-1 and pass at prefix k."""

from __future__ import annotations

import json
import os
import re
import socket

import pytest
from conftest import Project


def _write_test(project: Project, name: str, body: str) -> str:
    path = project.root / "test" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(body)
    return f"test/{name}"


@pytest.fixture
def verified(project: Project) -> Project:
    value = _write_test(
        project,
        "test_value.py",
        "from sglang.srt.flags import VALUE\n\n"
        "def test_value():\n    assert VALUE == 2\n\n"
        "def test_name_unchanged():\n    from sglang.srt.flags import NAME\n"
        "    assert NAME == 'upstream'\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=value,
    )
    return project


def test_proven_series_passes(verified: Project) -> None:
    result = verified.run("verify", "--json")
    data = json.loads(result.out)
    assert result.code == 0, result.out
    (proof,) = data["patches"]
    assert proof["verdict"] == "proven"
    assert proof["without"] == {"passed": 1, "failed": 1, "skipped": 0, "errors": 0}
    assert proof["with"] == {"passed": 2, "failed": 0, "skipped": 0, "errors": 0}
    # A line per finished run, off a terminal too: what ran where, and how long.
    assert re.search(
        r"^prefix-0: 1 failed, 1 passed in \d+s \[\d/2 runs", result.err, re.M
    )
    assert re.search(r"^prefix-1: 2 passed in \d+s \[\d/2 runs", result.err, re.M)


def test_a_few_runs_share_one_worker_and_more_take_every_lane(
    verified: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xpu_series.proofs import proof

    def proven(result) -> list[tuple]:
        assert result.code == 0, result.err
        rows = json.loads(result.out)["patches"]
        return [(p["verdict"], p["without"], p["with"]) for p in rows]

    # Two runs: a second worker would cost more than it saves.
    few = verified.run("verify", "-j", "2", "--fresh", "--json")
    assert "2 test run(s), 1 at a time" in few.err
    # Where each lane gets a run's worth of work, -j lanes run side by side and
    # prove the same.
    monkeypatch.setattr(proof, "RUNS_PER_LANE", 1)
    more = verified.run("verify", "-j", "2", "--fresh", "--json")
    assert "2 test run(s), 2 at a time" in more.err
    assert proven(more) == proven(few)


def test_vacuous_broken_and_untested_patches_fail(verified: Project) -> None:
    always = _write_test(
        verified,
        "test_always.py",
        "from sglang.srt.other import answer\n\n"
        "def test_any_answer():\n    assert answer() in (41, 42)\n",
    )
    verified.add_patch(
        "python/sglang/srt/other.py",
        "def answer():\n    return 42\n",
        "[XPU] Fix the answer",
        Tests=always,
    )
    wrong = _write_test(
        verified,
        "test_wrong.py",
        "from sglang.srt.third import LIMIT\n\n"
        "def test_limit():\n    assert LIMIT == 30\n",
    )
    verified.add_patch(
        "python/sglang/srt/third.py", "LIMIT = 20\n", "[XPU] Raise LIMIT", Tests=wrong
    )
    verified.add_patch(
        "python/sglang/srt/fourth.py", "X = 1\n", "[XPU] Add a module without tests"
    )
    result = verified.run("verify", "--json")
    data = json.loads(result.out)
    assert result.code == 1
    verdicts = [p["verdict"] for p in data["patches"]]
    assert verdicts == ["proven", "vacuous", "tests-need-porting", "untested"]
    text = verified.run("verify").out
    assert "vacuous" in text and "tests-need-porting" in text


def test_missing_test_file_is_named(verified: Project) -> None:
    (verified.root / "test" / "test_value.py").unlink()
    result = verified.run("verify")
    assert result.code == 1
    assert "names tests that do not exist: test/test_value.py" in result.err


def test_a_run_with_no_outcomes_is_an_error_not_a_verdict(verified: Project) -> None:
    # The test kills its own interpreter at prefix 1 (without the patch): pytest
    # writes no outcomes at all, which must never read as "nothing failed".
    crash = _write_test(
        verified,
        "test_crash.py",
        "import os\nfrom sglang.srt.flags import NAME\n\n"
        "def test_crash():\n    if NAME == 'upstream':\n        os._exit(3)\n",
    )
    verified.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'crash'\n",
        "[XPU] Crash without it",
        Tests=crash,
    )
    result = verified.run("verify", "2", "--json")
    data = json.loads(result.out)
    assert result.code == 1
    (proof,) = data["patches"]
    assert proof["verdict"] == "error"
    assert "produced no outcome" in data["errors"][0]
    assert "prefix 1" in data["errors"][0]


def test_verify_proves_a_subset_and_labels_import_errors(verified: Project) -> None:
    importing = _write_test(
        verified,
        "test_import.py",
        "from sglang.srt.newmod import X\n\ndef test_x():\n    assert X == 1\n",
    )
    verified.add_patch(
        "python/sglang/srt/newmod.py", "X = 1\n", "[XPU] New module", Tests=importing
    )
    result = verified.run("verify", "0002", "--json")
    data = json.loads(result.out)
    assert result.code == 0, result.out
    (proof,) = data["patches"]
    assert proof["name"].startswith("0002") and proof["verdict"] == "proven"
    assert proof["only_errors"] is True and proof["without"]["errors"] == 1
    assert "by errors only" in verified.run("verify", "0002").out
    assert verified.run("verify", "0009").code == 2


def test_outcomes_are_cached_by_tree_and_tests(verified: Project) -> None:
    first = verified.run("verify", "-v")
    assert first.code == 0 and "(outcomes from the cache)" not in first.out
    again = verified.run("verify", "-v")
    assert again.code == 0 and "(outcomes from the cache)" in again.out
    # A changed test file is a new key: run again, and now it is vacuous.
    test = verified.root / "test" / "test_value.py"
    test.write_text(test.read_text().replace("VALUE == 2", "VALUE in (1, 2)"))
    changed = verified.run("verify", "-v", "--json")
    assert changed.code == 1
    assert json.loads(changed.out)["patches"][0]["verdict"] == "vacuous"


def test_mutants_of_added_lines_must_be_killed(verified: Project) -> None:
    weak = _write_test(
        verified,
        "test_weak.py",
        "from sglang.srt.other import answer\n\n"
        "def test_any_answer():\n    assert answer() in (41, 42, 43)\n",
    )
    verified.add_patch(
        "python/sglang/srt/other.py",
        "def answer():\n    return 42\n",
        "[XPU] Fix the answer",
        Tests=weak,
    )
    result = verified.run("verify", "--mutants", "--json")
    assert result.code == 1, result.err
    data = {p["name"]: p for p in json.loads(result.out)["patches"]}
    strong, loose = data["0001-raise-value.patch"], data["0002-fix-the-answer.patch"]
    # VALUE = 2 -> 3, -> 1 and a deleted statement: the test sees each.
    assert strong["made"] >= 3 and strong["killed"] == strong["made"]
    assert strong["ok"] is True
    # return 42 -> 43 passes `in (41, 42, 43)`: a survivor, shown with its diff.
    survivors = {s["diff"]: s for s in loose["survived"]}
    diff = "python/sglang/srt/other.py:2: -return 42 +return 43"
    assert diff in survivors and loose["ok"] is False
    text = verified.run("verify", "--mutants", "0002")
    mutant = survivors[diff]["id"]
    assert f"survived {mutant}" in text.out
    assert f"xpu-series verify --mutants 0002 --mutant {mutant}" in text.out
    # The reproduce line, followed, runs that one mutant.
    one = verified.run("verify", "--mutants", "0002", "--mutant", mutant, "--json")
    assert one.code == 1
    (only,) = json.loads(one.out)["patches"]
    assert only["made"] == 1 and only["survived"][0]["id"] == mutant
    # Accepted with a reason in the one reviewed file, it no longer fails the run.
    (verified.root / "test" / "accepted_mutants.toml").write_text(
        f'[[mutant]]\npatch = "0002-fix-the-answer.patch"\nid = "{mutant}"\n'
        f'diff = "{diff}"\nreason = "43 is as good an answer for this test"\n'
    )
    accepted = verified.run("verify", "--mutants", "0002", "--mutant", mutant)
    assert accepted.code == 0, accepted.out


def test_mutant_outcomes_are_cached_and_progress_is_told(verified: Project) -> None:
    first = verified.run("verify", "--mutants", "--json")
    assert first.code == 0, first.err
    (patch,) = json.loads(first.out)["patches"]
    assert patch["cached"] is False and patch["killed"] == patch["made"] >= 3
    # One line per finished patch, with counts and time, even off a terminal.
    assert f"0001-raise-value.patch: {patch['made']} mutants, " in first.err
    assert "[1/1 patches, " in first.err
    again = verified.run("verify", "--mutants", "--json")
    (cached,) = json.loads(again.out)["patches"]
    assert again.code == 0 and cached["cached"] is True
    assert cached["killed"] == patch["killed"]
    assert "outcomes from the cache" in again.err
    # A weaker test is another key: the mutants run again, and one survives.
    test = verified.root / "test" / "test_value.py"
    test.write_text(test.read_text().replace("VALUE == 2", "VALUE in (2, 3)"))
    weaker = verified.run("verify", "--mutants", "--json")
    (rerun,) = json.loads(weaker.out)["patches"]
    assert weaker.code == 1 and rerun["cached"] is False and rerun["survived"]
    # --fresh runs them even when nothing changed.
    fresh = verified.run("verify", "--mutants", "--fresh", "--json")
    assert json.loads(fresh.out)["patches"][0]["cached"] is False


def test_the_runs_load_only_the_pytest_plugins_the_project_names(
    project: Project,
) -> None:
    # Two pytest plugins are installed here by entry point (anyio's and
    # hypothesis'); the project's pytest settings name one of them.
    (project.root / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "-p anyio.pytest_plugin"\n'
    )
    test = _write_test(
        project,
        "test_plugins.py",
        "import sys\n\nfrom sglang.srt.flags import VALUE\n\n"
        "def test_value_with_the_named_plugin_only():\n"
        "    assert VALUE == 2\n"
        "    assert 'anyio.pytest_plugin' in sys.modules\n"
        "    assert '_hypothesis_pytestplugin' not in sys.modules\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=test,
    )
    # Both kinds of run: a prefix worker's (verify) and a mutant worker's.
    proven = project.run("verify", "--json")
    assert proven.code == 0, proven.out + proven.err
    (proof,) = json.loads(proven.out)["patches"]
    assert proof["verdict"] == "proven" and proof["with"]["passed"] == 1
    killed = project.run("verify", "--mutants", "--json")
    assert killed.code == 0, killed.out + killed.err
    (patch,) = json.loads(killed.out)["patches"]
    assert patch["killed"] == patch["made"] >= 1


def test_a_mutant_writes_in_a_scratch_folder_not_the_checkout(
    verified: Project,
) -> None:
    # The test writes a file named by the patched value: relative to where it runs.
    _write_test(
        verified,
        "test_value.py",
        "from pathlib import Path\nfrom sglang.srt.flags import VALUE\n\n"
        "def test_value():\n    Path(f'stray-{VALUE}').write_text('x')\n"
        "    assert VALUE == 2\n",
    )
    result = verified.run("verify", "--mutants", "--fresh")
    assert result.code == 0, result.out + result.err
    assert not list(verified.root.glob("stray-*"))


def test_a_mutant_that_hangs_a_test_is_stopped_and_killed(project: Project) -> None:
    # PAUSE = 0 -> 1 makes the test sleep for an hour: it is stopped at its own
    # limit (a multiple of its unmutated time), and the mutant counts as killed.
    hangs = _write_test(
        project,
        "test_pause.py",
        "import time\nfrom sglang.srt.pause import PAUSE\n\n"
        "def test_pause():\n    time.sleep(PAUSE * 3600)\n    assert PAUSE == 0\n",
    )
    project.add_patch(
        "python/sglang/srt/pause.py", "PAUSE = 0\n", "[XPU] No pause", Tests=hangs
    )
    result = project.run("verify", "--mutants", "--json")
    assert result.code == 0, result.err
    (patch,) = json.loads(result.out)["patches"]
    assert patch["killed"] == patch["made"] and patch["timeouts"] >= 1


def test_a_mutant_hidden_by_a_stale_import_is_confirmed_afresh(
    project: Project,
) -> None:
    # user.py copies VALUE at import: an int has no module to trace it by, so a
    # fork that re-imports only flags.py would still see 2 there and the mutant
    # VALUE = 3 would look like a survivor. It is run again with all of sglang
    # imported afresh before it may be called one.
    project.add_patch(
        "python/sglang/srt/user.py",
        "from sglang.srt.flags import VALUE as V\n\nUSES = V\n",
        "[XPU] Use VALUE",
    )
    uses = _write_test(
        project,
        "test_uses.py",
        "from sglang.srt.user import USES\n\ndef test_uses():\n    assert USES == 2\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=uses,
    )
    result = project.run("verify", "--mutants", "0002", "--json", "--fresh")
    (patch,) = json.loads(result.out)["patches"]
    assert result.code == 0, result.out
    assert patch["made"] >= 3 and patch["killed"] == patch["made"]


def test_a_file_whose_import_has_side_effects_is_imported_with_all_of_sglang(
    project: Project,
) -> None:
    # plugin.py registers itself at import: imported again alone, it registers
    # twice, and every mutant would look killed. The unmutated tests fail that
    # way, so its mutants run with all of sglang afresh: 2 -> 3 survives, as it
    # must for a test that accepts 3.
    project.add_patch("python/sglang/srt/registry.py", "SEEN = []\n", "[XPU] Registry")
    plugin = _write_test(
        project,
        "test_plugin.py",
        "from sglang.srt import plugin\nfrom sglang.srt.registry import SEEN\n\n"
        "def test_registered_once():\n"
        "    assert SEEN == [1] and plugin.VALUE in (2, 3)\n",
    )
    project.add_patch(
        "python/sglang/srt/plugin.py",
        "from sglang.srt.registry import SEEN\n\nSEEN.append(1)\nVALUE = 2\n",
        "[XPU] Plugin",
        Tests=plugin,
    )
    result = project.run("verify", "--mutants", "0002", "--json", "--fresh")
    (patch,) = json.loads(result.out)["patches"]
    assert result.code == 1
    survivors = [s["diff"] for s in patch["survived"]]
    assert "python/sglang/srt/plugin.py:4: -VALUE = 2 +VALUE = 3" in survivors


def test_a_mutant_meets_the_quickest_tests_first(project: Project) -> None:
    # Under -x a mutant is killed by the first test that fails: the quick test
    # runs before the slow one (the baseline timed both), so no mutant of VALUE
    # waits for the slow test. Each test says in ran.log that it ran.
    ran = project.root / "ran.log"
    tests = _write_test(
        project,
        "test_order.py",
        "import time\nfrom sglang.srt.flags import VALUE\n\n"
        f"def note(name):\n    open({str(ran)!r}, 'a').write(name + '\\n')\n\n"
        "def test_a_slow():\n    time.sleep(0.5)\n    note('slow')\n"
        "    assert VALUE == 2\n\n"
        "def test_b_quick():\n    note('quick')\n    assert VALUE == 2\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=tests,
    )
    ran.unlink(missing_ok=True)  # what verify's own runs wrote
    result = project.run("verify", "--mutants", "--json", "--fresh")
    assert result.code == 0, result.out
    (patch,) = json.loads(result.out)["patches"]
    assert patch["made"] >= 3 and patch["killed"] == patch["made"]
    lines = ran.read_text().split()
    # The baseline in the tests' own order, the unmutated check quickest first,
    # then only the quick test for each mutant that imports at all.
    assert lines[:4] == ["slow", "quick", "quick", "slow"], lines
    assert lines[4:] and set(lines[4:]) == {"quick"}, lines


def test_what_the_tests_import_as_they_run_is_imported_once_for_all_mutants(
    project: Project,
) -> None:
    # The test imports heavy.py in its body (as a test that sweeps every model
    # module does). The worker imports it too once the baseline ran, so no
    # mutant's fork imports it again: heavy.py holds nothing of flags.py, which
    # the mutants change. Each import of heavy.py writes a line to imports.log.
    log = project.root / "imports.log"
    project.add_patch(
        "python/sglang/srt/heavy.py",
        f"open({str(log)!r}, 'a').write('imported\\n')\n",
        "[XPU] Heavy",
    )
    tests = _write_test(
        project,
        "test_lazy.py",
        "import importlib\n\n"
        "def test_value():\n    importlib.import_module('sglang.srt.heavy')\n"
        "    from sglang.srt.flags import VALUE\n    assert VALUE == 2\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=tests,
    )
    log.unlink(missing_ok=True)  # what add_patch's imports wrote
    result = project.run("verify", "--mutants", "0002", "--json", "--fresh")
    assert result.code == 0, result.out
    (patch,) = json.loads(result.out)["patches"]
    assert patch["made"] >= 2 and patch["killed"] == patch["made"]
    # The baseline's fork, then the worker itself: not once per mutant.
    assert log.read_text().split() == ["imported", "imported"]


def test_tests_that_depend_on_their_order_keep_it(project: Project) -> None:
    # test_b needs what the slower test_a sets: quickest first, it would fail
    # unmutated, and every mutant would look killed. The unmutated check sees
    # that, so the mutants run in the tests' own order: 2 -> 3 survives, as it
    # must for a test that accepts 3.
    tests = _write_test(
        project,
        "test_state.py",
        "import time\nfrom sglang.srt.flags import VALUE\n\nSTATE = []\n\n"
        "def test_a_sets():\n    time.sleep(0.5)\n    STATE.append(1)\n\n"
        "def test_b_uses():\n    assert STATE == [1] and VALUE in (2, 3)\n",
    )
    project.add_patch(
        "python/sglang/srt/flags.py",
        "VALUE = 2\nNAME = 'upstream'\n",
        "[XPU] Raise VALUE",
        Tests=tests,
    )
    result = project.run("verify", "--mutants", "--json", "--fresh")
    assert result.code == 1, result.out
    (patch,) = json.loads(result.out)["patches"]
    survivors = [s["diff"] for s in patch["survived"]]
    assert "python/sglang/srt/flags.py:1: -VALUE = 2 +VALUE = 3" in survivors


def test_a_second_verify_beside_a_running_one_is_refused_and_the_hint_works(
    verified: Project,
) -> None:
    # A live process (this one: its pid is alive) holds build/verify/: a second
    # proof would share its worktrees. A mutant run has build/mutants/ and runs.
    lock = verified.root / "build" / ".verify.xpu-series.lock"
    lock.write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                    "command": "xpu-series verify", "since": "now"})
    )  # fmt: skip
    result = verified.run("verify")
    assert result.code != 0
    assert "is locked by pid" in result.err and "'xpu-series verify'" in result.err
    assert verified.run("verify", "--mutants").code == 0
    # The hint, followed: that process is gone, so the lock file goes.
    assert f"remove {lock}" in result.err
    lock.unlink()
    assert verified.run("verify").code == 0
    assert not lock.exists()
    # And the other way round: a held mutants folder refuses a second mutant run.
    held = verified.root / "build" / ".mutants.xpu-series.lock"
    held.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    assert "is locked by pid" in verified.run("verify", "--mutants").err
