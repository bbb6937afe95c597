#!/usr/bin/env python3
"""The steps of scripts/test: which run, in which lane, how long each took.

    scripts/test                 every step (what CI runs)
    scripts/test --list          the steps and their lanes
    scripts/test lint verify     only these steps (after bootstrap)
    scripts/test --serial        one step at a time (lanes one after another)
    scripts/test -j 3            three cores' worth of steps (default: the
                                 cores), and one step more (not at -j 1)
    scripts/test --keep-going    every step, even after one failed (to time them)

After bootstrap and the lints, six lanes share the cores (step_lanes.py says
when each step starts): the tool's own checks (its tests, the mutants, the
audit), the proofs on the patched tree and across releases (verify, the matrix,
the registered tests, the replay), the real servers of the stand-in, the
installs (overlay, wheel, image), the upstream export with the benchmarks, and
the tool's tests of its proofs. A lane runs its steps in order, one at a time
(they share folders); a free core goes to the lane with the most work left
(each step's `cost_s`). One step more than the cores runs at a time (-j N to
change the cores): each step waits part of its time (step_lanes.py says why).
verify and its mutants have a folder each under build/ (each locks its own), so
they may run side by side. Each step runs under `--reap` (a child subreaper):
what it starts is waited for and counted in its CPU, and nothing it leaves
behind outlives it. Every line a step prints is
relayed live with its step's tag; each step's full output is also kept in
build/reports/steps/. The summary table and build/reports/steps.json name each
step's duration and CPU (steps.json also its system time, and the run's proof
seed, which every step gets as XPU_SERIES_PROOF_SEED).

Standard library only: it runs before .venv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Its sibling, wherever this file is loaded from (scripts/test, the tests).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_lanes  # noqa: E402
import step_tmp  # noqa: E402
from step_processes import reap, stop_group, wait_counted  # noqa: E402
from step_report import clock as _clock  # noqa: E402
from step_report import failed_ends, markdown, summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "build" / "reports"
PY = ".venv/bin/python"
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]

# The matrix: a newer release that needs work is information; only our own
# errors fail it (and an index that cannot be reached is said, not failed).
MATRIX = """
mkdir -p build/reports
set +e
# Its stderr (the progress lines) streams to the log as it goes, and is kept in
# matrix.err for the check below; stdout (the table) goes straight through.
{ .venv/bin/xpu-series matrix --behaviour --save build/reports 2>&1 1>&3 3>&- |
    tee build/reports/matrix.err >&2; } 3>&1
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  if grep -q "could not reach the package index" build/reports/matrix.err; then
    echo "skipped: the package index cannot be reached: the newer releases are unknown"
  else
    exit "$rc"
  fi
fi
"""


# The audit's tests on real releases: only the audit step runs them (after it
# fetches 0.5.19); the tool's tests leave them out, not to pay 40 s twice.
AUDIT_TESTS = "test/unit/test_audit_releases.py"

# The audit's static part and AUDIT_TESTS (0.5.19 holds the host-pool bug the
# series once fixed; without the index its test skips).
AUDIT = f"""
mkdir -p build/reports
.venv/bin/xpu-series fetch --upstream 0.5.19 >/dev/null 2>&1 ||
  echo "note: sglang 0.5.19 cannot be fetched: its audit test skips"
.venv/bin/python -m pytest -q -p no:cacheprovider -rs {AUDIT_TESTS}
.venv/bin/xpu-series audit --pristine --markdown >build/reports/audit-pristine.md
.venv/bin/xpu-series audit --pristine | head -25
.venv/bin/xpu-series audit --check --sarif build/reports/audit.sarif
.venv/bin/xpu-series audit --markdown >build/reports/audit.md
"""


@dataclass(frozen=True)
class Step:
    """One check: a tag for the log, what it proves, its command, its lane."""

    tag: str
    title: str
    command: tuple[str, ...]
    lane: str  # "first" runs alone before the lanes; then LANES side by side
    env: tuple[tuple[str, str], ...] = ()
    # A step that runs longer is stopped and fails: a hang must not eat CI.
    limit_s: int = 1200
    # A pass is remembered by the content of every file of the checkout (see
    # inputs_digest): the same inputs are not checked twice.
    cached: bool = True
    # What the step reads from outside the checkout, as a command whose output
    # joins its key: the releases the package index lists, for the matrix (a
    # newer release appears without any change here). When the command fails,
    # the step runs and its pass is not remembered.
    key_from: tuple[str, ...] = ()
    # Seconds the step held its slot in a cold run on two cores (the mean
    # "seconds" of build/reports/steps.json of two clean clones at 72b05c6):
    # only the order in which lanes get a slot depends on it. Wall time, not
    # CPU: a step that waits (servers, pip, buildah) holds its slot longer than
    # its CPU says. `bench_ci.py --replay` replays runs' step times through the
    # scheduler (it gives those two runs' wall clocks to the second with the
    # costs before): with these, they end in 556 s and 494 s, not 569 s and
    # 518 s. Costs measured at an older commit (registered 172 s where it now
    # holds its slot for 67 s) had the install lane's image step end the run
    # alone on one core.
    cost_s: int = 60


# The lanes that run side by side once the "first" steps are done.
LANES = ("tool", "proof", "serve", "install", "upstream", "unit")

# The tool's tests of its proofs (verify, its record, the matrix, the upstream
# export): a step of their own in the "unit" lane, so the tool's tests are two
# halves of about two minutes of CPU each, not one lane's four minutes.
PROOF_TESTS = tuple(
    f"test/unit/{name}.py"
    for name in (
        "test_proof_record", "test_verify", "test_check", "test_prefix_worker",
        "test_upstream", "test_upstream_bundle", "test_upstream_lint",
    )
)  # fmt: skip


# The registered tests against their record (xpu_series/registered/):
# the cheap files and the changed ones run, a seeded few of the costly
# unchanged ones re-check the record, and in CI a stale record fails the step.
REGISTERED_RECORD = (
    "-p", "xpu_series.registered.plugin",
    "--registered-record=patches/registered.json",
)  # fmt: skip


def sh(script: str) -> tuple[str, ...]:
    return ("bash", "-euo", "pipefail", "-c", script)


STEPS: tuple[Step, ...] = (
    Step("bootstrap", "bootstrap: environment and patched tree",
         ("scripts/bootstrap",), "first", cached=False),
    Step("lint", "lint: ruff format --check, ruff check",
         sh(".venv/bin/ruff format --check python test scripts\n"
            ".venv/bin/ruff check python test scripts"), "first"),
    Step("hadolint", "hadolint: docker/Dockerfile",
         (".venv/bin/hadolint", "docker/Dockerfile"), "first"),
    Step("actionlint", "actionlint: .github/workflows",
         ("scripts/actionlint",), "first"),
    # The tool lane.
    Step("tool-tests",
         "tool tests (test/unit but its proofs' and the audit's) and doctests",
         (*PYTEST, "--durations=10", "--doctest-modules", "python/xpu_series",
          "test/unit", *(f"--ignore={t}" for t in (*PROOF_TESTS, AUDIT_TESTS))),
         "tool", cost_s=85),
    Step("proof-tool-tests",
         "tool tests of the proofs (verify, records, matrix, upstream export)",
         (*PYTEST, "--durations=10", *PROOF_TESTS), "unit", cost_s=192),
    Step("script-tests",
         "script tests (test/scripts): serving scripts, probe, chunked-prefill tools",
         (*PYTEST, "test/scripts"), "proof", cost_s=89),
    Step("registration",
         "registration: every registered file is registered; nothing under test/manual",
         (PY, "scripts/check_registration.py"), "tool", cost_s=0),
    Step("refresh-check",
         "refresh --check: patches/ is byte for byte what refresh writes from the tree",
         (".venv/bin/xpu-series", "refresh", "--check"), "tool", cost_s=1),
    Step("verify", "verify: every patch is proven",
         (".venv/bin/xpu-series", "verify"), "proof", cost_s=27),
    # After verify in its lane: the pin's runs come from verify's outcomes.
    Step("matrix",
         "behavioural matrix: each served release (serves-from..pin) and every newer "
         "one (build/reports/)",
         sh(MATRIX), "proof", cost_s=74,
         key_from=(".venv/bin/xpu-series", "matrix", "--releases")),
    Step("mutants",
         "verify --mutants: each patch's tests kill every mutant of the lines it adds",
         (".venv/bin/xpu-series", "verify", "--mutants"), "tool", cost_s=41),
    Step("registered",
         "registered CPU tests on the patched tree (test/registered/unit) against "
         "patches/registered.json: changed and cheap files, a seeded costly one",
         (*PYTEST, *REGISTERED_RECORD, "--durations=8", "test/registered/unit"),
         "proof", cost_s=67),
    Step("audit",
         "audit: no exposed CUDA-only finding on the patched tree (--check); the "
         "pristine pin's report; SARIF; the known bugs found in real releases",
         sh(AUDIT), "tool", cost_s=43),
    # The serving lane: real servers of the stand-in.
    Step("standin-suite",
         "XPU chunked-prefill suite on the CPU stand-in (real SGLang servers; see "
         "its README)",
         (*PYTEST, "-rs", "--durations=8", "test/manual/chunked_prefill"), "serve",
         env=(("SGLANG_XPU_STANDIN", "cpu"),), cost_s=102),
    Step("xpu-suites",
         "XPU suites (test/manual, test/registered/e2e): import, collect, skip "
         "with reasons",
         # One run: a file that does not import or collect fails it (exit 2) as
         # a separate --collect-only did, which imported sglang a second time.
         (*PYTEST, "-rs", "test/manual", "test/registered/e2e"), "serve", cost_s=18),
    Step("standin-scripts",
         "measurement and serving scripts against real servers on the CPU stand-in "
         "(test/standin)",
         (*PYTEST, "-rs", "--durations=5", "test/standin"), "serve", cost_s=158),
    # The install lane: real pip installs and images of real releases.
    Step("overlay",
         "overlay: the fork installed into a real pip install of each served release "
         "(docker/install-fork.sh)",
         (PY, "scripts/check_overlay.py"), "install", cost_s=104),
    Step("wheel",
         "wheel: the patched sglang as a pip wheel (built twice, byte-identical), "
         "installed in a fresh venv and over the stock release, the patches' fast "
         "tests on the install, uninstall leaves nothing",
         (PY, "scripts/check_wheel.py"), "install", cost_s=57),
    Step("replay",
         "replay the last move (patches/moves/, patches/resolutions/) from git "
         "history: byte for byte",
         (PY, "scripts/replay_move.py"), "proof", cost_s=21),
    Step("image",
         "image: docker/Dockerfile built with buildah as xpu-serve --fork builds it, "
         "on a stand-in for the official XPU image (overlay: pin and oldest served "
         "release; wheel: the pin); "
         "a broken base must fail it",
         (PY, "scripts/check_image.py"), "install", cost_s=84),
    Step("upstream-check",
         "upstream --check: each carried patch and declared bundle exports as an "
         "upstream pull request "
         "that fails without it, passes with it, registers and lints clean",
         # One invocation: one test interpreter for every patch (torch and
         # sglang's imports load once, not twice per patch).
         (".venv/bin/xpu-series", "upstream", "--all", "--check"), "upstream",
         cost_s=76),
    # After upstream-check in its lane: bench_upstream reads its outcomes. Its
    # quick mode of bench_ci reads the steps the run has timed so far.
    Step("benchmarks", "benchmarks, quick mode: every scripts/bench_*.py still runs",
         (PY, "scripts/bench_ci.py", "--quick-all"), "upstream", cost_s=123),
)  # fmt: skip


def inputs_digest() -> str:
    """What a step can read from this checkout: every file git tracks or would
    track (the tool, the tests, the patches, the pin, pyproject.toml which pins
    .venv), by content, and the interpreter that runs it. build/ and .venv are
    made from these, so they are not hashed themselves."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    h = hashlib.sha256(f"{sys.version}\0{CACHE_FORMAT}\0".encode())
    for name in sorted(n for n in listed if n):
        path = ROOT / os.fsdecode(name)
        h.update(name + b"\0")
        if path.is_file() and not path.is_symlink():
            h.update(hashlib.sha256(path.read_bytes()).digest())
        elif path.is_symlink():
            h.update(os.readlink(path).encode())
    return h.hexdigest()


# The seed of the proofs' sample (xpu_series/proofs/record.py): one per run,
# the same for verify and its mutants, so both re-prove the same patches.
SEED_ENV = "XPU_SERIES_PROOF_SEED"
# One more step than the cores runs at a time, so a torch process that splits
# each op over every core (a stand-in server's scheduler, most of all) spends the
# second thread spinning at a barrier while another step holds that core. One
# thread each: the stand-in suite's CPU beside one busy core, 41.4 -> 31.8 s
# (docs/design.md). A value the caller exported is kept.
THREADS = {"OMP_NUM_THREADS": "1"}


def proof_seed() -> int:
    """The run's seed, from the environment or drawn now (run_step passes it
    to every step)."""
    text = os.environ.get(SEED_ENV, "").strip()
    return int(text) if text.isdigit() else random.SystemRandom().randrange(1, 10**9)


CACHE_FORMAT = "1"
CACHE = Path("build") / "cache" / "steps"


def step_key(digest: str, step: Step) -> str:
    text = json.dumps([digest, step.tag, step.command, step.env])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Outcome:
    step: Step
    seconds: float = 0.0
    # When it started, in seconds after the run did: with `seconds`, the run's
    # timeline (where a core sat idle).
    started_s: float | None = None
    # CPU seconds (user + system) of the step and every process it started (see
    # reap): on two cores the lanes share, this is what a step really costs.
    cpu_s: float = 0.0
    # Of those, the system's (forks, page faults, file creation, copies).
    sys_s: float = 0.0
    code: int | None = None  # None: not run
    note: str = ""


@dataclass
class Run:
    """Shared state of one run: the print lock, the outcomes, the stop flag."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # steps.json is written by both lanes: one writer at a time.
    saving: threading.Lock = field(default_factory=threading.Lock)
    failed: threading.Event = field(default_factory=threading.Event)
    procs: set[subprocess.Popen[bytes]] = field(default_factory=set)
    start: float = field(default_factory=time.monotonic)
    digest: str = ""  # inputs_digest(), or "" to run every step (--fresh)
    seed: int = 0  # the proofs' sample (XPU_SERIES_PROOF_SEED), told at the start
    keep_going: bool = False  # a failed step does not stop the others
    tmp: dict[str, str] = field(default_factory=dict)  # TMPDIR, on a tmpfs

    def say(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def save(self) -> None:
        """build/reports/steps.json after every step: a killed run still says
        where its time went."""
        REPORTS.mkdir(parents=True, exist_ok=True)
        data = {
            "wall_s": round(time.monotonic() - self.start, 1),
            "seed": self.seed,
            "steps": [
                {
                    "tag": o.step.tag,
                    "title": o.step.title,
                    "lane": o.step.lane,
                    "started_s": None if o.started_s is None else round(o.started_s, 1),
                    "seconds": round(o.seconds, 1),
                    "cpu_s": round(o.cpu_s, 1),
                    "sys_s": round(o.sys_s, 1),
                    "code": o.code,
                    "note": o.note,
                }
                for o in self.outcomes.values()
            ],
        }
        with self.saving:
            tmp = REPORTS / ".steps.json.tmp"
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, REPORTS / "steps.json")


def run_step(run: Run, step: Step) -> bool:
    outcome = run.outcomes[step.tag]
    if run.failed.is_set() and not run.keep_going:
        outcome.note = "not run: an earlier step failed"
        return False
    logs = REPORTS / "steps"
    logs.mkdir(parents=True, exist_ok=True)
    run.say(f"\n==> [{step.tag}] {step.title}")
    key = step_key(run.digest, step) if run.digest and step.cached else ""
    if key and step.key_from:
        outside = _read_outside(step)
        if outside is None:
            run.say(f"[{step.tag}] not remembered: {' '.join(step.key_from)} failed")
            key = ""
        else:
            key = hashlib.sha256(f"{key}\0{outside}".encode()).hexdigest()
    passed = ROOT / CACHE / f"{key}.json"
    if key and passed.is_file():
        before = json.loads(passed.read_text())
        outcome.code, outcome.note = 0, "ok (cached)"
        run.say(
            f"<== [{step.tag}] ok: passed on these same inputs at {before['when']} "
            f"(in {_clock(before['seconds'])}); 'scripts/test --fresh' runs it again"
        )
        run.save()
        return True
    env = {
        **THREADS, **os.environ, **run.tmp, SEED_ENV: str(run.seed), **dict(step.env)
    }  # fmt: skip
    missing = _missing(step.command[0])
    if missing:
        outcome.code, outcome.note = 127, f"cannot run {step.command[0]}: {missing}"
        run.say(f"<== [{step.tag}] FAILED: {outcome.note}")
        run.failed.set()
        run.save()
        return False
    return _run_process(run, step, outcome, key, env)


def _read_outside(step: Step) -> str | None:
    """The output of the step's key_from command, or None when it fails."""
    try:
        done = subprocess.run(
            step.key_from, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _missing(program: str) -> str:
    """Why `program` cannot be run from the checkout ("" when it can)."""
    if "/" in program:
        path = ROOT / program
        if not path.is_file():
            return os.strerror(2)
        return "" if os.access(path, os.X_OK) else os.strerror(13)
    return "" if shutil.which(program) else os.strerror(2)


def _run_process(
    run: Run, step: Step, outcome: Outcome, key: str, env: dict[str, str]
) -> bool:
    passed = ROOT / CACHE / f"{key}.json"
    logs = REPORTS / "steps"
    start = time.monotonic()
    outcome.started_s = start - run.start
    # Its own process group: a step past its limit is stopped with its children.
    # Under reap: what it leaves behind is waited for, and counted.
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--reap", *step.command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with run.lock:
        run.procs.add(proc)
    stopped = threading.Event()

    def past_limit() -> None:
        stopped.set()
        stop_group(proc)

    timer = threading.Timer(step.limit_s, past_limit)
    timer.start()
    assert proc.stdout is not None
    with (logs / f"{step.tag}.log").open("wb") as log:
        for raw in proc.stdout:
            log.write(raw)
            run.say(f"[{step.tag}] {raw.decode(errors='replace').rstrip()}")
    code, outcome.cpu_s, outcome.sys_s = wait_counted(proc)
    timer.cancel()
    with run.lock:
        run.procs.discard(proc)
    outcome.seconds = time.monotonic() - start
    outcome.code = code
    if stopped.is_set():
        outcome.note = f"stopped after its limit of {step.limit_s} s"
    verdict = "ok" if code == 0 else f"FAILED (exit {code})"
    run.say(f"<== [{step.tag}] {verdict} in {_clock(outcome.seconds)}")
    if code == 0 and key:
        passed.parent.mkdir(parents=True, exist_ok=True)
        tmp = passed.with_suffix(".tmp")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        tmp.write_text(json.dumps({"seconds": outcome.seconds, "when": when}))
        os.replace(tmp, passed)
    run.save()
    if code != 0:
        run.failed.set()
    return code == 0


def run_lanes(run: Run, lanes: list[list[Step]], jobs: int) -> None:
    """The lanes' steps, as step_lanes.run_lanes schedules them. A fault of this
    runner fails the run, loudly."""

    def work(step: Step) -> None:
        try:
            run_step(run, step)
        except Exception as exc:  # noqa: BLE001 - reported, and the run fails
            run.failed.set()
            outcome = run.outcomes[step.tag]
            outcome.code = outcome.code if outcome.code not in (None, 0) else 1
            outcome.note = f"the step runner failed here: {exc!r}"
            run.say(f"error: the step runner failed: {exc!r}")

    step_lanes.run_lanes(lanes, jobs, work)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--reap"]:
        return reap(argv[1:])
    parser = argparse.ArgumentParser(
        prog="scripts/test", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("steps", nargs="*", metavar="STEP", help="only these steps")
    parser.add_argument("--list", action="store_true", help="list the steps")
    parser.add_argument(
        "--serial", action="store_true", help="run the lanes one after another"
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="run every step, even one that passed on the same inputs before",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run every step even after one failed (the run still fails)",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="the cores the steps share (default: this machine's); with two or "
        "more, one step more than that runs at once",
    )
    args = parser.parse_args(argv)
    if args.list:
        for step in STEPS:
            print(f"{step.tag:16} {step.lane:6} {step.title}")
        return 0
    known = {s.tag for s in STEPS}
    unknown = [s for s in args.steps if s not in known]
    if unknown:
        print(f"error: no step called {', '.join(unknown)}", file=sys.stderr)
        print("hint: run 'scripts/test --list' to see the steps", file=sys.stderr)
        return 2
    # Bootstrap always runs: every other step needs .venv and the patched tree.
    chosen = [
        s
        for s in STEPS
        if not args.steps or s.tag in args.steps or s.tag == "bootstrap"
    ]
    run = Run(outcomes={s.tag: Outcome(s) for s in chosen})
    run.keep_going = args.keep_going
    fresh = args.fresh or os.environ.get("XPU_SERIES_FRESH") == "1"
    run.digest = "" if fresh else inputs_digest()
    run.seed = proof_seed()
    run.say(
        f"proofs: this run re-proves a sample of the unchanged patches, seed "
        f"{run.seed} ({SEED_ENV}={run.seed} scripts/test repeats it)"
    )
    scratch = step_tmp.scratch_dir(os.environ)
    if scratch is not None:
        run.tmp = {"TMPDIR": str(scratch)}
        run.say(f"temporary files: {scratch} (a tmpfs, removed at the end)")
    try:
        return _run_all(run, chosen, args)
    finally:
        step_tmp.remove(scratch)


def lanes_of(steps: list[Step]) -> list[list[Step]]:
    """The steps after the "first" ones, lane by lane in LANES' order."""
    lanes = [[s for s in steps if s.lane == lane] for lane in LANES]
    return [lane for lane in lanes if lane]


def _run_all(run: Run, chosen: list[Step], args: argparse.Namespace) -> int:
    """The steps, the summary, and the run's exit code."""
    try:
        for step in (s for s in chosen if s.lane == "first"):
            run_step(run, step)
        lanes = lanes_of(chosen)
        if args.serial:
            lanes = [[s for lane in lanes for s in lane]]
        run_lanes(run, lanes, args.jobs)
    except KeyboardInterrupt:
        run.failed.set()
        with run.lock:
            for proc in run.procs:
                stop_group(proc)
        run.say("\ninterrupted")
    run.save()
    outcomes, wall_s = list(run.outcomes.values()), time.monotonic() - run.start
    (REPORTS / "steps.md").write_text(markdown(outcomes, wall_s))
    run.say("\n" + summary(outcomes, wall_s))
    ends = failed_ends(outcomes, REPORTS / "steps")
    if ends:
        run.say("\n" + ends)
    ok = not run.failed.is_set() and all(o.code == 0 for o in run.outcomes.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
