"""Runs one patch's tests against each of its mutants, in one interpreter: the
heavy imports happen once, then every mutant runs in a fork that re-imports only
sglang and the test modules (about half a second) with the mutated file in place.

    python -m xpu_series.proofs.mutant_worker SPEC.json RESULTS.jsonl

SPEC: {"root", "python", "tests", "timeout", "mutants": [{"id", "path", "code"}]};
"timeout" is the least a mutant gets (see main).
Each result line: {"id", "outcome": killed|survived|timeout, "seconds"}; a first
line with id "baseline" says whether the unmutated tests pass.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import types
from pathlib import Path

from xpu_series.proofs.prefix_worker import fresh_metrics

BASELINE_LIMIT_S = 600


def _purge(root: Path, module: str | None = None) -> None:
    """Forget the test modules and sglang, so the child imports them afresh.

    With `module` (the mutated one), forget only it and the sglang modules that
    hold something of it (the module, or a function or class defined there),
    to a fixed point: the rest of sglang stays imported. Whether that is enough
    for a file is checked before its mutants run (see main)."""
    tests = str(root / "test")
    loaded = list(sys.modules.items())
    in_tests = {
        n for n, m in loaded if (getattr(m, "__file__", None) or "").startswith(tests)
    }
    if module is None:
        doomed = {n for n, _ in loaded if n == "sglang" or n.startswith("sglang.")}
    else:
        doomed = {n for n, _ in loaded if n == module or n.startswith(module + ".")}
        rest = [
            (n, m) for n, m in loaded if n.startswith("sglang.") and n not in doomed
        ]
        grew = True
        while grew:
            grew = False
            for name, mod in rest:
                if name not in doomed and _holds(mod, name, doomed):
                    doomed.add(name)
                    grew = True
    for name in doomed | in_tests:
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and parent not in doomed:
            # The package's attribute for it: set again by the next import.
            sys.modules[parent].__dict__.pop(child, None)
        sys.modules.pop(name, None)


def _holds(module: object, name: str, doomed: set[str]) -> bool:
    """Does `module` keep a module of `doomed`, or an object defined in one? A
    package's own submodules do not count: the import system put them there."""
    for value in list(getattr(module, "__dict__", {}).values()):
        if isinstance(value, types.ModuleType):
            other = value.__name__
            if other in doomed and other.rpartition(".")[0] != name:
                return True
            continue
        try:
            owner = getattr(value, "__module__", None)
        except Exception:  # noqa: BLE001 - a lazy proxy may raise anything
            continue
        if isinstance(owner, str) and owner in doomed:
            return True
    return False


def _preload(loaded: Path) -> None:
    """Import here what the baseline's tests imported only as they ran (a test
    that imports each model's module in its body): a narrow fork then imports
    only the mutated module and what holds it, not every such module again. A
    module that does not import here is left to the forks, as before."""
    try:
        names = json.loads(loaded.read_text())
    except (OSError, ValueError):
        return
    sys.dont_write_bytecode = False
    with open(os.devnull, "w") as sink:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            for name in names:
                if name in sys.modules:
                    continue
                try:
                    importlib.import_module(name)
                except (Exception, SystemExit):  # noqa: BLE001 - any import may fail
                    continue
    sys.dont_write_bytecode = True
    gc.freeze()


def _module_name(python: Path, path: Path) -> str:
    """sglang/srt/a.py -> sglang.srt.a; a package's __init__.py -> the package."""
    parts = list(path.relative_to(python).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# A test of a mutant that runs this many times as long as it did unmutated (plus
# TEST_SLACK_S) hangs: it is stopped there, and the mutant counts as killed by a
# timeout, instead of the whole run waiting for the patch-wide timeout.
TEST_FACTOR = 3
TEST_SLACK_S = 3.0
HUNG = 75  # the exit code of a child whose test was stopped


def _clock_plugin(  # noqa: ANN202
    limits: dict[str, float] | None, order: dict[str, float] | None = None
):
    """A pytest plugin: times each test (the baseline run), or stops a test that
    runs past its limit (a mutant's run) with SIGALRM. With `order` (seconds per
    test, from the baseline), the quickest tests run first: under -x a mutant
    is killed by the first test that fails, so it waits for fewer slow ones."""
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

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, items) -> None:  # noqa: ANN001
            if order is not None:
                # Stable: tests of equal (or unknown) time keep their order.
                items.sort(key=lambda item: order.get(item.nodeid, 0.0))

    return Clock()


def _run_child(
    root: Path,
    tests: list[str],
    limits: dict[str, float] | None,
    timing: Path,
    module: str | None,
    order: dict[str, float] | None,
    loaded: Path | None = None,
) -> None:
    """In the forked child: fresh imports, quiet pytest, exit with its code;
    with `loaded`, the sglang modules the run imported are written there."""
    import pytest

    # A scratch working directory of its own: what a mutated path writes lands
    # there, never in the checkout (test paths are absolute).
    os.chdir(tempfile.mkdtemp(prefix="run-", dir=os.environ["XPU_MUTANT_SCRATCH"]))

    # A .pyc someone else left in the tree is never taken for the mutant: its
    # file has another mtime (see main), so it is compiled from its new source.
    sys.dont_write_bytecode = True
    _purge(root, module)
    fresh_metrics()  # a re-imported sglang module registers its metrics again
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    clock = _clock_plugin(limits, order)
    code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--rootdir", str(root), *tests], plugins=[clock])  # fmt: skip
    timing.write_text(json.dumps(clock.durations))
    if loaded is not None:
        names = [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]
        loaded.write_text(json.dumps(names))
    os._exit(HUNG if clock.hung else int(code))


def _run(
    root: Path,
    tests: list[str],
    timeout: float,
    limits: dict[str, float] | None,
    module: str | None = None,
    order: dict[str, float] | None = None,
    loaded: Path | None = None,
) -> tuple[str, float, dict[str, float]]:
    """(outcome, seconds, each test's seconds) of one run in a fork; `module`:
    forget only what holds it (see _purge); `order`: quickest tests first;
    `loaded`: where the fork lists the sglang modules it imported."""
    start = time.monotonic()
    timing = Path(os.environ["XPU_MUTANT_SCRATCH"]) / "timing.json"
    timing.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:
        try:
            _run_child(root, tests, limits, timing, module, order, loaded)
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

    # verify primed the worktree with checked-hash .pyc (bytecode.prime), which a
    # mutant's text never matches; the preload writes the bytecode of anything
    # else it imports beside the source (the tree's git excludes __pycache__), so
    # forks read sglang's instead of compiling it again. No pycache_prefix, which
    # would hide the installed packages' own .pyc. Forks write none, and a
    # mutant's file also gets an mtime no timestamp .pyc carries (see below).
    sys.dont_write_bytecode = False
    # Import once what every run needs (torch, transformers, sglang, the tests).
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        pytest.main(["-q", "--co", "-p", "no:cacheprovider", "--rootdir", str(root),
                     *tests])  # fmt: skip
    sys.dont_write_bytecode = True
    # What is loaded now is never garbage: each fork's collections (pytest runs
    # gc.collect several times as it ends) skip it instead of walking torch's
    # heap, a third of a fork's time before.
    gc.freeze()
    with results.open("w") as out:
        # The unmutated tests get long enough for anything short of a hang.
        loaded = Path(scratch) / "loaded.json"
        baseline, seconds, durations = _run(
            root, tests, BASELINE_LIMIT_S, None, loaded=loaded
        )
        out.write(json.dumps({"id": "baseline", "outcome": baseline,
                              "seconds": seconds}) + "\n")  # fmt: skip
        out.flush()
        if baseline != "survived":
            return 1
        _preload(loaded)
        # A mutant that runs three times as long as the tests do unmutated, plus
        # slack for a busy machine, hangs: a timeout counts as killed.
        timeout = max(spec["timeout"], seconds * 3 + 10)
        limits = {t: d * TEST_FACTOR + TEST_SLACK_S for t, d in durations.items()}
        # Per mutated file: do the tests pass unmutated when only that file and
        # what holds it are imported afresh, quickest tests first? Then its
        # mutants run that way (much less to import per fork, and a kill comes
        # before the slow tests); if not, each re-imports all of sglang and runs
        # the tests in their own order, as the baseline did.
        narrow: dict[str, tuple[str | None, dict[str, float] | None]] = {}
        for rel in dict.fromkeys(m["path"] for m in spec["mutants"]):
            name = _module_name(python, python.parent / rel)
            check, _, _ = _run(root, tests, BASELINE_LIMIT_S, None, name, durations)
            narrow[rel] = (name, durations) if check == "survived" else (None, None)
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
                module, order = narrow[mutant["path"]]
                outcome, seconds, _ = _run(root, tests, timeout, limits, module, order)
                if outcome == "survived" and module is not None:
                    # A survivor is confirmed the slow, sure way: all of sglang
                    # afresh, the tests in their own order (the baseline's), so
                    # nothing kept from before can hide the mutant.
                    outcome, more, _ = _run(root, tests, timeout, limits)
                    seconds += more
            finally:
                path.write_bytes(original)
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            out.write(json.dumps({"id": mutant["id"], "outcome": outcome,
                                  "seconds": round(seconds, 2)}) + "\n")  # fmt: skip
            out.flush()
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
