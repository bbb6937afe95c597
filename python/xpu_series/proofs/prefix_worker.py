"""Runs test runs in one interpreter: torch, transformers and the rest are
imported once, then each run is a fork that imports sglang and the test modules
afresh from whatever commit its worktree has checked out by then.

    python -m xpu_series.proofs.prefix_worker ROOT TESTS.json [PYTHON]

TESTS.json lists every test the runs may name (they are collected once, to
import what they need); PYTHON is the python/ folder of the worktree the worker
starts on (first on sys.path). Then, one JSON line per run on stdin:
{"tests": [...], "outcomes": PATH, "log": PATH, "python": FOLDER}; the fork
imports sglang from FOLDER (any worktree, of any release: what the parent keeps
loaded is third-party), and the worker answers each run with a line
{"code": N, "seconds": S} on stdout once pytest in the fork has written PATH
(the outcome plugin) and its output to the log. The caller checks the commit
out before sending the run, and waits for the answer before the next. A fork
dies with its worker (Linux); the caller runs a run the worker died in again on
a new worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path


def _forget(root: Path) -> None:
    """sglang, the test modules and the outcome plugin: the fork imports them
    afresh (the checkout may have changed any of them since the last run)."""
    tests = str(root / "test")
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if (
            name == "sglang"
            or name.startswith("sglang.")
            or name == "xpu_series.proofs.pytest_outcomes"
            or path.startswith(tests)
        ):
            del sys.modules[name]


def fresh_metrics() -> None:
    """Forget the prometheus metrics the worker's imports registered: sglang
    registers some when its modules load (mooncake's session counters), and the
    fork's fresh import would find them taken (DuplicateTimeseries)."""
    registry = getattr(sys.modules.get("prometheus_client.registry"), "REGISTRY", None)
    if registry is None:
        return
    with registry._lock:
        registry._collector_to_names.clear()
        registry._names_to_collectors.clear()


def _child(root: Path, run: dict, started_on: str | None) -> None:
    import importlib

    import pytest

    _forget(root)
    fresh_metrics()
    folder = run.get("python")
    if folder:
        # This run's tree in front, the one the worker started on gone: an
        # import sglang forgot must not find the other release's file.
        gone = {os.path.abspath(p) for p in (folder, started_on) if p}
        sys.path[:] = [folder] + [p for p in sys.path if os.path.abspath(p) not in gone]
    importlib.invalidate_caches()  # a checkout can add files a finder cached
    sys.dont_write_bytecode = True
    os.environ["XPU_SERIES_OUTCOMES"] = run["outcomes"]
    log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = pytest.main(["-q", "-p", "xpu_series.proofs.pytest_outcomes",
                        "-p", "no:cacheprovider", "--continue-on-collection-errors",
                        "--rootdir", str(root), *run["tests"]])  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


# prctl(2): the signal a child gets when the thread that forked it exits.
_PR_SET_PDEATHSIG = 1


def die_with(worker: int) -> None:
    """The fork is killed when its worker dies: the caller runs the test again
    on a new worker, and this run must not go on alone beside it (writing into
    a folder the caller removed, holding a core). Linux only; elsewhere a fork
    outlives its worker as before."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != worker:  # the worker died before prctl took hold
        os._exit(70)


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    every = json.loads(Path(argv[1]).read_text())
    started_on = argv[2] if len(argv) > 2 else None
    os.chdir(root)
    import pytest

    # No bytecode is written (the tree stays as checked out), and none is
    # redirected: a pycache_prefix would hide the installed packages' own .pyc
    # and compile torch and transformers again in every worker (about 15 s of
    # CPU each); the tree's modules compile in memory at a small cost.
    sys.dont_write_bytecode = True
    # Import once what every run needs. Collection errors are fine here: a
    # prefix without a patch may not even import its tests.
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        with contextlib.redirect_stderr(sink):
            pytest.main(["-q", "--co", "-p", "no:cacheprovider",
                         "--continue-on-collection-errors", "--rootdir", str(root),
                         *every])  # fmt: skip
    # What is loaded now is never garbage: each fork's collections (pytest runs
    # gc.collect several times as it ends) skip it instead of walking torch's heap.
    gc.freeze()
    answer = sys.stdout
    worker = os.getpid()
    for line in sys.stdin:
        run = json.loads(line)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                die_with(worker)
                _child(root, run, started_on)
            finally:
                os._exit(70)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        seconds = round(time.monotonic() - start, 2)
        answer.write(json.dumps({"code": code, "seconds": seconds}) + "\n")
        answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
