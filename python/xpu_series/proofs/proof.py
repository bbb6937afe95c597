"""Running a patch's tests on prefixes of the series: the machinery `verify` and the
behavioural `matrix` share (prefix commits in worktrees, a worker interpreter per
lane and a fork per run, the outcome plugin, and a cache of outcomes keyed by tree
and tests)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from xpu_series.git import Git, run_command, stop_worker
from xpu_series.project import Project
from xpu_series.proofs import TEST_ENV
from xpu_series.proofs.record import (
    as_seconds,
    code_digest,
    environment_digest,
    files_tests_read,
)
from xpu_series.stack.bytecode import prime

# Bumped when what a cached outcome means changes (the plugin, the counting).
_CACHE_FORMAT = "2"
# How often a run meets a worker that dies under it before it has no outcome.
WORKER_ATTEMPTS = 2
# Runs per lane before a second lane pays off: a lane starts a worker (torch and
# transformers imported, the tests collected) and a worktree, about the CPU of
# three small runs. The sample's four runs in one lane cost 21 s of CPU, not 30
# (verify of two unchanged patches, measured); a full proof still takes -j lanes.
RUNS_PER_LANE = 4


@dataclass(frozen=True)
class Counts:
    """Outcomes of one patch's tests on one prefix of the series."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    # Collection and setup errors (an import that fails), apart from failed tests.
    errors: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped + self.errors

    def to_json(self) -> dict[str, int]:
        return {
            "passed": self.passed,
            "failed": self.failed,
            "skipped": self.skipped,
            "errors": self.errors,
        }

    def __str__(self) -> str:
        text = f"{self.passed} passed, {self.failed} failed"
        return text + (f", {self.errors} errors" if self.errors else "")


def _covered(nodeid: str, tests: Iterable[str]) -> bool:
    """Is `nodeid` one of `tests` or below one (a file covers its classes)?"""
    return any(nodeid == t or nodeid.startswith(t + "::") for t in tests)


def count(outcomes: dict[str, str], tests: tuple[str, ...]) -> Counts:
    """Tally the outcomes whose node id is one of `tests` or lies below one."""
    tally = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for nodeid, outcome in outcomes.items():
        if not _covered(nodeid, tests):
            continue
        tally[outcome if outcome in tally else "failed"] += 1
    return Counts(tally["passed"], tally["failed"], tally["skipped"], tally["error"])


class Worktrees:
    """A small pool of detached worktrees, one per worker thread."""

    def __init__(self, git: Git, root: Path, size: int) -> None:
        self.free: list[Path] = []
        self.lock = threading.Lock()
        git.run("worktree", "prune")
        for i in range(size):
            path = root / f"w{i}"
            if not Git(path).is_repo():
                git.run("worktree", "add", "-q", "-f", "--detach", str(path), "HEAD")
            self.free.append(path)

    def take(self) -> Path:
        with self.lock:
            return self.free.pop()

    def give(self, path: Path) -> None:
        with self.lock:
            self.free.append(path)


def run_pytest(
    project: Project, tree: Path, tests: list[str]
) -> tuple[dict[str, str], str]:
    """Run `tests` with `import sglang` resolving to `tree`; outcome per node id
    (from the xpu_series.proofs.pytest_outcomes plugin) and the tail of pytest's
    output."""
    with tempfile.TemporaryDirectory(prefix="xpu-verify-") as tmp:
        out = Path(tmp) / "outcomes.json"
        env = {
            "PYTHONPATH": os.pathsep.join(
                [str(tree / "python"), str(Path(__file__).parents[3])]
            ),
            "XPU_SERIES_OUTCOMES": str(out),
            **TEST_ENV,
        }
        args = [
            sys.executable, "-m", "pytest", "-q",
            "-p", "xpu_series.proofs.pytest_outcomes",
            "-p", "no:cacheprovider", "--continue-on-collection-errors",
            "--rootdir", str(project.root), *tests,
        ]  # fmt: skip
        result = run_command(args, cwd=project.root, env=env)
        outcomes = json.loads(out.read_text()) if out.is_file() else {}
    return outcomes, result.stdout[-4000:] + result.stderr[-2000:]


class _Worker:
    """A `prefix_worker` interpreter (heavy imports once, a fork per run); `ask`
    runs tests on whatever a worktree has checked out. It starts on `worktree`,
    and a run may name another one, of another repository (the matrix's
    releases): the fork imports sglang from there."""

    def __init__(self, project: Project, worktree: Path, every: list[str]) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="xpu-verify-"))
        (self.tmp / "tests.json").write_text(json.dumps(every))
        self.stderr = (self.tmp / "worker.log").open("wb")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(worktree / "python"), str(Path(__file__).parents[2])]
            ),
            **TEST_ENV,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "xpu_series.proofs.prefix_worker", str(project.root),
             str(self.tmp / "tests.json"), str(worktree / "python")],
            cwd=project.root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True,
        )  # fmt: skip
        self.runs = 0
        self.dead = False
        # How long the last run took in its fork (not the worker's own start,
        # which the first run of a lane would otherwise carry); None: not said.
        self.seconds: float | None = None

    def ask(self, worktree: Path, tests: list[str]) -> tuple[dict[str, str], str]:
        """Outcome per node id and the tail of pytest's output, as run_pytest,
        with sglang imported from `worktree`."""
        self.runs += 1
        outcomes_path = self.tmp / f"outcomes-{self.runs}.json"
        log_path = self.tmp / f"run-{self.runs}.log"
        request = {
            "tests": tests,
            "outcomes": str(outcomes_path),
            "log": str(log_path),
            "python": str(worktree / "python"),
        }
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        except BrokenPipeError:
            answer = ""
        log = log_path.read_text(errors="replace") if log_path.is_file() else ""
        try:
            said = json.loads(answer)["seconds"] if answer else None
        except (ValueError, KeyError, TypeError):
            said = None
        self.seconds = as_seconds(said)
        try:
            outcomes = json.loads(outcomes_path.read_text())
        except (OSError, ValueError):
            outcomes = {}
        if not answer:
            # The worker itself died: say why, and let the next run start anew.
            self.dead = True
            self.stderr.flush()
            log += (self.tmp / "worker.log").read_text(errors="replace")[-2000:]
            self.close()
        return outcomes, log[-6000:]

    def close(self) -> None:
        stop_worker(self.proc)
        self.stderr.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _support_files(project: Project, tests: Iterable[str]) -> list[Path]:
    """What a test run reads besides sglang: the test files, the other files of
    their folders (configs, helpers), and the conftest.py files, helper modules
    and JSON files above them."""
    root = project.root.resolve()
    files: set[Path] = set()
    for test in tests:
        path = (project.root / test.split("::")[0]).resolve()
        files.add(path)
        if path.parent.is_dir():
            files.update(p for p in path.parent.iterdir() if p.is_file())
        for parent in path.parents:
            if parent == root or root not in parent.parents:
                break
            # conftest.py, configs and the tests' helper modules (not other tests).
            files.update(
                p
                for p in parent.iterdir()
                if p.is_file()
                and (p.suffix in (".py", ".json") and not p.name.startswith("test_"))
            )
    return sorted(p for p in files if "__pycache__" not in p.parts)


def outcome_key(project: Project, tree_id: str, tests: list[str]) -> str:
    """Cache key of one run: the prefix's tree, the tests and what they read
    (their folders, and what they import from test/), the interpreter and the
    pinned environment, and the proof code. Everything a patch's record is
    keyed by (record.py) is here too, so an outcome from this cache is one a
    proof with the same inputs measured."""
    h = hashlib.sha256()
    digests = (code_digest(), environment_digest(project.root))
    for part in (_CACHE_FORMAT, sys.executable, sys.version, *digests, tree_id, *tests):
        h.update(part.encode() + b"\0")
    root = project.root.resolve()
    files = set(_support_files(project, tests)) | set(files_tests_read(root, tests))
    for path in sorted(files):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def store_json(cache: Path, key: str, data: dict) -> None:
    """`cache/<key>.json`, written beside and renamed in: never half a file."""
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{key}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, cache / f"{key}.json")


def load_outcomes(cache: Path, key: str) -> dict[str, str] | None:
    """The outcomes stored under `key`; None when there are none (or the file is
    unreadable: then the run happens again)."""
    return load_run(cache, key)[0]


def load_run(cache: Path, key: str) -> tuple[dict[str, str] | None, float | None]:
    """The outcomes stored under `key` and how long their run took (None where
    the entry does not say)."""
    try:
        data = json.loads((cache / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    outcomes = data.get("outcomes")
    kept = outcomes if isinstance(outcomes, dict) and outcomes else None
    return kept, as_seconds(data.get("seconds"))


@dataclass
class Run:
    """What one prefix owes: its commit and the tests to run there. `repo` and
    `root`: the repository of the commit and the folder of its worktrees, where
    they are not the runner's own (the matrix runs every release in one pool)."""

    commit: str
    tests: list[str]
    repo: Git | None = None
    root: Path | None = None
    # Run it even when the cache has its outcomes (a re-proof of a record).
    fresh: bool = False


class PrefixRunner:
    """Runs each prefix's tests once, in a pool of worktrees of `git`'s repo, and
    remembers outcomes by (tree, tests) so an unchanged run costs nothing."""

    def __init__(
        self,
        project: Project,
        git: Git,
        root: Path,
        jobs: int,
        fresh: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.project = project
        self.git = git
        self.root = root
        self.jobs = max(1, jobs)
        self.fresh = fresh  # run everything again (outcomes are still stored)
        self.cache = project.cache_dir / "outcomes"
        self.logs: dict[str, str] = {}
        self.cached: set[str] = set()
        # How long each label's run took (a cached one: when it ran), where known.
        self.seconds: dict[str, float] = {}
        # Hears a line per finished run (the label, its outcomes, its time).
        self.say = say

    def _load(self, key: str, label: str) -> dict[str, str] | None:
        outcomes, seconds = load_run(self.cache, key)
        if outcomes is not None and seconds is not None:
            self.seconds[label] = seconds
        return outcomes

    def _covering(self, tree_id: str, tests: list[str]) -> dict[str, str] | None:
        """The outcomes of `tests` from a stored run of more tests on the same
        tree (verify runs a patch's Tests where the matrix wants its Fast-Tests):
        the run that covers them is looked up under its own key, so its tests and
        what they read are the same as now."""
        for entry in sorted((self.cache / "by-tree" / tree_id).glob("*.json")):
            try:
                stored = json.loads(entry.read_text())["tests"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not all(_covered(t, stored) for t in tests):
                continue
            outcomes = load_outcomes(
                self.cache, outcome_key(self.project, tree_id, stored)
            )
            if outcomes is None:
                continue
            mine = {n: o for n, o in outcomes.items() if _covered(n, tests)}
            if all(any(_covered(n, [t]) for n in mine) for t in tests):
                return mine
        return None

    def _store(
        self, key: str, tree_id: str, tests: list[str], outcomes: dict[str, str],
        log: str, seconds: float | None,
    ) -> None:  # fmt: skip
        if not outcomes:
            return  # no outcome is never remembered: the next run tries again
        data: dict = {"outcomes": outcomes, "log": log}
        if seconds is not None:
            data["seconds"] = round(seconds, 1)
        store_json(self.cache, key, data)
        # Which runs a tree has outcomes of: one file per run, never rewritten,
        # so verify and the matrix can store side by side.
        store_json(self.cache / "by-tree" / tree_id, key, {"tests": tests})

    def _tell(
        self,
        lock: threading.Lock,
        label: str,
        outcomes: dict[str, str],
        began: float,
        start: float,
        done: list[int],
        total: int,
    ) -> None:
        if self.say is None:
            return
        tally = Counter(outcomes.values())
        counts = ", ".join(f"{n} {o}" for o, n in sorted(tally.items()))
        with lock:
            done[0] += 1
            self.say(
                f"{label}: {counts or 'no outcome'} in "
                f"{time.monotonic() - began:.0f}s "
                f"[{done[0]}/{total} runs, {time.monotonic() - start:.0f}s elapsed]"
            )

    def _worker_died(self, lock: threading.Lock, label: str, again: bool) -> None:
        if self.say is None:
            return
        with lock:
            self.say(
                f"{label}: the test worker died before the run finished; "
                + (
                    "running it again on a new worker"
                    if again
                    else "it died again on a new worker: no outcome (its log says why)"
                )
            )

    def run(
        self,
        work: dict[str, Run],
        finished: Callable[[str], None] | None = None,
    ) -> dict[str, dict[str, str]]:
        """Outcomes per label of `work` (label -> commit and tests), in the order
        given; `finished` hears each label as its outcomes are in (a cached one
        at once), one at a time."""
        results: dict[str, dict[str, str]] = {}
        todo: dict[str, tuple[Run, str, str]] = {}
        for label, run in work.items():
            repo = run.repo or self.git
            tree_id = repo.out("rev-parse", f"{run.commit}^{{tree}}")
            key = outcome_key(self.project, tree_id, run.tests)
            hit = None
            if not (self.fresh or run.fresh):
                hit = self._load(key, label) or self._covering(tree_id, run.tests)
            if hit is not None:
                results[label] = hit
                self.cached.add(label)
                self.logs[label] = "(outcomes from the cache)"
                if finished is not None:
                    finished(label)
            else:
                todo[label] = (run, key, tree_id)
        if not todo:
            return results
        lanes = min(self.jobs, -(-len(todo) // RUNS_PER_LANE))
        if self.say is not None:
            self.say(f"{len(todo)} test run(s), {lanes} at a time")
        # A pool of worktrees per repository, made before the lanes start (one
        # `git worktree add` at a time); a lane holds one worktree at a time, so
        # a pool as large as the lanes never runs dry.
        pools: dict[Path, Worktrees] = {}
        for run, _key, _tree in todo.values():
            repo = run.repo or self.git
            if repo.repo not in pools:
                pools[repo.repo] = Worktrees(repo, run.root or self.root, lanes)
        lock = threading.Lock()
        start, done = time.monotonic(), [0]
        waiting = list(todo)
        every = sorted({t for run, _key, _tree in todo.values() for t in run.tests})

        def lane() -> None:
            """One worker interpreter, the runs still waiting, each in a worktree
            of its repository."""
            worker: _Worker | None = None
            try:
                while True:
                    with lock:
                        if not waiting:
                            return
                        label = waiting.pop(0)
                    run, key, tree_id = todo[label]
                    pool = pools[(run.repo or self.git).repo]
                    worktree = pool.take()
                    try:
                        began = time.monotonic()
                        tree = Git(worktree)
                        tree.run("checkout", "-q", "-f", "--detach", run.commit)
                        prime(tree, self.project.cache_dir)
                        outcomes, log, deaths = {}, "", ""
                        took: float | None = None
                        for attempt in range(WORKER_ATTEMPTS):
                            if worker is None:
                                worker = _Worker(self.project, worktree, every)
                            outcomes, log = worker.ask(worktree, run.tests)
                            took = worker.seconds
                            if not worker.dead:
                                break
                            # Killed during the run or while it waited for this
                            # one: the run did not finish (its fork died with
                            # it). Once more on a new worker, and say so.
                            worker = None
                            again = attempt + 1 < WORKER_ATTEMPTS
                            self._worker_died(lock, label, again)
                            deaths += f"(the test worker died in this run)\n{log}\n"
                            outcomes, log = {}, ""
                        log = deaths + log
                    finally:
                        pool.give(worktree)
                    results[label], self.logs[label] = outcomes, log
                    if took is not None:
                        self.seconds[label] = took
                    self._store(key, tree_id, run.tests, outcomes, log, took)
                    self._tell(lock, label, outcomes, began, start, done, len(todo))
                    if finished is not None:
                        with lock:
                            finished(label)
            finally:
                if worker is not None:
                    worker.close()

        with ThreadPoolExecutor(max_workers=lanes) as executor:
            for future in [executor.submit(lane) for _ in range(lanes)]:
                future.result()
        return results
