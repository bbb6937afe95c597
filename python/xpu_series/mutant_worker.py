"""Runs one patch's tests against each of its mutants, in one interpreter: the
heavy imports happen once, then every mutant runs in a fork that re-imports only
sglang and the test modules (about half a second) with the mutated file in place.

    python -m xpu_series.mutant_worker SPEC.json RESULTS.jsonl

SPEC: {"root", "python", "tests", "timeout", "mutants": [{"id", "path", "code"}]};
"timeout" is the least a mutant gets (see main).
Each result line: {"id", "outcome": killed|survived|timeout, "seconds"}; a first
line with id "baseline" says whether the unmutated tests pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

BASELINE_LIMIT_S = 600


def _purge(root: Path) -> None:
    """Forget sglang and the test modules, so the child imports them afresh."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if (
            name == "sglang"
            or name.startswith("sglang.")
            or path.startswith(str(root / "test"))
        ):
            del sys.modules[name]


# A test of a mutant that runs this many times as long as it did unmutated (plus
# TEST_SLACK_S) hangs: it is stopped there, and the mutant counts as killed by a
# timeout, instead of the whole run waiting for the patch-wide timeout.
TEST_FACTOR = 3
TEST_SLACK_S = 3.0
HUNG = 75  # the exit code of a child whose test was stopped


def _clock_plugin(limits: dict[str, float] | None):  # noqa: ANN202
    """A pytest plugin: times each test (the baseline run), or stops a test that
    runs past its limit (a mutant's run) with SIGALRM."""
    import pytest

    class Clock:
        def __init__(self) -> None:
            self.durations: dict[str, float] = {}
            self.hung = False

        def _alarm(self, _signum: int, _frame: object) -> None:
            self.hung = True
            raise TimeoutError("the test ran past its limit under this mutant")

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):  # noqa: ANN001, ANN202
            limit = None if limits is None else limits.get(item.nodeid)
            if limit:
                signal.signal(signal.SIGALRM, self._alarm)
                signal.setitimer(signal.ITIMER_REAL, limit)
            start = time.monotonic()
            try:
                return (yield)
            finally:
                if limit:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                self.durations[item.nodeid] = time.monotonic() - start

    return Clock()


def _run_child(
    root: Path, tests: list[str], limits: dict[str, float] | None, timing: Path
) -> None:
    """In the forked child: fresh imports, quiet pytest, exit with its code."""
    import pytest

    # A scratch working directory of its own: what a mutated path writes lands
    # there, never in the checkout (test paths are absolute).
    os.chdir(tempfile.mkdtemp(prefix="run-", dir=os.environ["XPU_MUTANT_SCRATCH"]))

    # The parent's bytecode of unchanged modules is reused; the mutated file's
    # has another mtime (see main), so it is compiled from its new source.
    sys.dont_write_bytecode = True
    _purge(root)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    clock = _clock_plugin(limits)
    code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--rootdir", str(root), *tests], plugins=[clock])  # fmt: skip
    timing.write_text(json.dumps(clock.durations))
    os._exit(HUNG if clock.hung else int(code))


def _run(
    root: Path, tests: list[str], timeout: float, limits: dict[str, float] | None
) -> tuple[str, float, dict[str, float]]:
    """(outcome, seconds, each test's seconds) of one run in a fork."""
    start = time.monotonic()
    timing = Path(os.environ["XPU_MUTANT_SCRATCH"]) / "timing.json"
    timing.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:
        try:
            _run_child(root, tests, limits, timing)
        finally:
            os._exit(70)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start, {}
        time.sleep(0.02)
    code = os.waitstatus_to_exitcode(status)
    durations = json.loads(timing.read_text()) if timing.is_file() else {}
    outcome = "survived" if code == 0 else "timeout" if code == HUNG else "killed"
    return outcome, time.monotonic() - start, durations


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    results = Path(argv[1])
    root, python = Path(spec["root"]), Path(spec["python"])
    sys.path.insert(0, str(python))
    scratch = tempfile.mkdtemp(prefix="xpu-mutant-cwd-")
    os.environ["XPU_MUTANT_SCRATCH"] = scratch
    os.chdir(scratch)
    tests = [f"{root}/{test}" for test in spec["tests"]]
    import pytest

    # Bytecode of the unchanged modules goes to a private folder once, so each
    # fork re-imports sglang from it instead of compiling thousands of lines.
    cache = tempfile.mkdtemp(prefix="xpu-mutant-pyc-")
    sys.pycache_prefix = cache
    sys.dont_write_bytecode = False
    # Import once what every run needs (torch, transformers, sglang, the tests).
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        pytest.main(["-q", "--co", "-p", "no:cacheprovider", "--rootdir", str(root),
                     *tests])  # fmt: skip
    with results.open("w") as out:
        # The unmutated tests get long enough for anything short of a hang.
        baseline, seconds, durations = _run(root, tests, BASELINE_LIMIT_S, None)
        out.write(json.dumps({"id": "baseline", "outcome": baseline,
                              "seconds": seconds}) + "\n")  # fmt: skip
        out.flush()
        if baseline != "survived":
            return 1
        # A mutant that runs three times as long as the tests do unmutated, plus
        # slack for a busy machine, hangs: a timeout counts as killed.
        timeout = max(spec["timeout"], seconds * 3 + 10)
        limits = {t: d * TEST_FACTOR + TEST_SLACK_S for t, d in durations.items()}
        for number, mutant in enumerate(spec["mutants"], start=1):
            path = python.parent / mutant["path"]
            original = path.read_bytes()
            stat = path.stat()
            try:
                path.write_text(mutant["code"], encoding="utf-8")
                # A timestamp no .pyc of the original can carry: the mutant is
                # always compiled from its own source, even at the same size.
                fake = int(stat.st_mtime) + 100_000 + number
                os.utime(path, (fake, fake))
                outcome, seconds, _ = _run(root, tests, timeout, limits)
            finally:
                path.write_bytes(original)
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            out.write(json.dumps({"id": mutant["id"], "outcome": outcome,
                                  "seconds": round(seconds, 2)}) + "\n")  # fmt: skip
            out.flush()
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
