"""Running a patch's tests on prefixes of the series: the machinery `verify` and the
behavioural `matrix` share (prefix commits in worktrees, one pytest process per
prefix, the outcome plugin, and a cache of outcomes keyed by tree and tests)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from xpu_series.git import Git, run_command
from xpu_series.project import Project

# Bumped when what a cached outcome means changes (the plugin, the counting).
_CACHE_FORMAT = "2"


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


def count(outcomes: dict[str, str], tests: tuple[str, ...]) -> Counts:
    """Tally the outcomes whose node id is one of `tests` or lies below one."""
    tally = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for nodeid, outcome in outcomes.items():
        if not any(nodeid == t or nodeid.startswith(t + "::") for t in tests):
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
    (from the xpu_series.pytest_outcomes plugin) and the tail of pytest's output."""
    with tempfile.TemporaryDirectory(prefix="xpu-verify-") as tmp:
        out = Path(tmp) / "outcomes.json"
        env = {
            "PYTHONPATH": os.pathsep.join(
                [str(tree / "python"), str(Path(__file__).parents[2])]
            ),
            "XPU_SERIES_OUTCOMES": str(out),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        args = [
            sys.executable, "-m", "pytest", "-q", "-p", "xpu_series.pytest_outcomes",
            "-p", "no:cacheprovider", "--continue-on-collection-errors",
            "--rootdir", str(project.root), *tests,
        ]  # fmt: skip
        result = run_command(args, cwd=project.root, env=env)
        outcomes = json.loads(out.read_text()) if out.is_file() else {}
    return outcomes, result.stdout[-4000:] + result.stderr[-2000:]


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
    """Cache key of one run: the prefix's tree, the tests and what they read, and
    the interpreter (its packages answer for the rest)."""
    h = hashlib.sha256()
    for part in (_CACHE_FORMAT, sys.executable, sys.version, tree_id, *tests):
        h.update(part.encode() + b"\0")
    for path in _support_files(project, tests):
        h.update(str(path.relative_to(project.root.resolve())).encode() + b"\0")
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
    try:
        data = json.loads((cache / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    outcomes = data.get("outcomes") if isinstance(data, dict) else None
    return outcomes if isinstance(outcomes, dict) and outcomes else None


@dataclass
class Run:
    """What one prefix owes: its commit and the tests to run there."""

    commit: str
    tests: list[str]


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
        # Hears a line per finished run (the label, its outcomes, its time).
        self.say = say

    def _load(self, key: str) -> dict[str, str] | None:
        return load_outcomes(self.cache, key)

    def _store(self, key: str, outcomes: dict[str, str], log: str) -> None:
        if not outcomes:
            return  # no outcome is never remembered: the next run tries again
        store_json(self.cache, key, {"outcomes": outcomes, "log": log})

    def run(self, work: dict[str, Run]) -> dict[str, dict[str, str]]:
        """Outcomes per label of `work` (label -> commit and tests)."""
        results: dict[str, dict[str, str]] = {}
        todo: dict[str, tuple[Run, str]] = {}
        for label, run in work.items():
            tree_id = self.git.out("rev-parse", f"{run.commit}^{{tree}}")
            key = outcome_key(self.project, tree_id, run.tests)
            hit = None if self.fresh else self._load(key)
            if hit is not None:
                results[label] = hit
                self.cached.add(label)
                self.logs[label] = "(outcomes from the cache)"
            else:
                todo[label] = (run, key)
        if not todo:
            return results
        pool = Worktrees(self.git, self.root, min(self.jobs, len(todo)))
        lock = threading.Lock()
        start, done = time.monotonic(), [0]

        def job(label: str) -> None:
            run, key = todo[label]
            worktree = pool.take()
            began = time.monotonic()
            try:
                Git(worktree).run("checkout", "-q", "-f", "--detach", run.commit)
                outcomes, log = run_pytest(self.project, worktree, run.tests)
            finally:
                pool.give(worktree)
            results[label], self.logs[label] = outcomes, log
            self._store(key, outcomes, log)
            if self.say is not None:
                tally = Counter(outcomes.values())
                counts = ", ".join(f"{n} {o}" for o, n in sorted(tally.items()))
                with lock:
                    done[0] += 1
                    self.say(
                        f"{label}: {counts or 'no outcome'} in "
                        f"{time.monotonic() - began:.0f}s "
                        f"[{done[0]}/{len(todo)} runs, "
                        f"{time.monotonic() - start:.0f}s elapsed]"
                    )

        with ThreadPoolExecutor(max_workers=len(pool.free)) as executor:
            for future in [executor.submit(job, label) for label in todo]:
                future.result()
        return results
