"""verify: prove each patch's tests fail on the tree without it and pass with it."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands.apply import ApplyOptions, run_apply
from xpu_series.errors import XpuSeriesError
from xpu_series.git import Git, run_command
from xpu_series.project import Project
from xpu_series.result import Report
from xpu_series.tree import UPSTREAM_TAG


@dataclass(frozen=True)
class Counts:
    """Outcomes of one patch's tests on one prefix of the series."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def to_json(self) -> dict[str, int]:
        return {"passed": self.passed, "failed": self.failed, "skipped": self.skipped}


@dataclass(frozen=True)
class PatchProof:
    """The verdict for one patch."""

    name: str
    tests: tuple[str, ...]
    without: Counts
    with_patch: Counts
    verdict: str  # proven | vacuous | broken | untested

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tests": list(self.tests),
            "without": self.without.to_json(),
            "with": self.with_patch.to_json(),
            "verdict": self.verdict,
        }


@dataclass
class VerifyResult:
    """All verdicts, plus the apply report the prefixes came from."""

    apply: Report
    proofs: list[PatchProof] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.apply.ok
            and bool(self.proofs)
            and all(p.verdict == "proven" for p in self.proofs)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.apply.to_json()["upstream"],
            "patches": [p.to_json() for p in self.proofs],
            "problems": self.apply.problems,
            "ok": self.ok,
        }


def judge(without: Counts, with_patch: Counts) -> str:
    """proven: something fails without the patch and everything passes with it.

    >>> judge(Counts(passed=2, failed=1), Counts(passed=3))
    'proven'
    >>> judge(Counts(passed=3), Counts(passed=3))
    'vacuous'
    >>> judge(Counts(failed=3), Counts(passed=2, failed=1))
    'broken'
    """
    if with_patch.failed or not with_patch.passed:
        return "broken"
    if not without.failed:
        return "vacuous"
    return "proven"


def count(outcomes: dict[str, str], tests: tuple[str, ...]) -> Counts:
    """Tally the outcomes whose node id is one of `tests` or lies below one."""
    passed = failed = skipped = 0
    for nodeid, outcome in outcomes.items():
        if not any(nodeid == t or nodeid.startswith(t + "::") for t in tests):
            continue
        if outcome == "passed":
            passed += 1
        elif outcome == "skipped":
            skipped += 1
        else:
            failed += 1
    return Counts(passed, failed, skipped)


class _Worktrees:
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


def _run_tests(
    project: Project, worktree: Path, commit: str, tests: list[str]
) -> tuple[dict[str, str], str]:
    Git(worktree).run("checkout", "-q", "-f", "--detach", commit)
    with tempfile.TemporaryDirectory(prefix="xpu-verify-") as tmp:
        out = Path(tmp) / "outcomes.json"
        env = {
            "PYTHONPATH": os.pathsep.join(
                [str(worktree / "python"), str(Path(__file__).parents[2])]
            ),
            "XPU_SERIES_OUTCOMES": str(out),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        args = [
            sys.executable, "-m", "pytest", "-q", "-p", "xpu_series.pytest_outcomes",
            "-p", "no:cacheprovider", "--rootdir", str(project.root), *tests,
        ]  # fmt: skip
        result = run_command(args, cwd=project.root, env=env)
        outcomes = json.loads(out.read_text()) if out.is_file() else {}
    return outcomes, result.stdout[-4000:] + result.stderr[-2000:]


def run_verify(project: Project, jobs: int = 2) -> VerifyResult:
    """Apply the series once, then run patch k's tests at prefixes k-1 and k."""
    root = project.build_dir / "verify"
    report = run_apply(project, ApplyOptions(tree=root / "tree", scratch=True))
    result = VerifyResult(apply=report)
    if not report.ok:
        return result
    git = Git(root / "tree")
    series = project.series()
    prefix = [git.out("rev-parse", UPSTREAM_TAG)]
    for outcome in report.patches:
        prefix.append(outcome.commit or prefix[-1])
    tests = [tuple(p.header.tests) for p in series.patches]
    for name, spec in zip((p.name for p in series.patches), tests, strict=True):
        missing = [t for t in spec if not (project.root / t.split("::")[0]).exists()]
        if missing:
            raise XpuSeriesError(
                f"{name} names tests that do not exist: {', '.join(missing)}",
                hint="fix the Tests: field in the patch's commit message, then refresh",
            )
    # Prefix k runs the tests of patch k (must pass) and of patch k+1 (must fail).
    work: dict[int, list[str]] = {}
    for k in range(len(prefix)):
        wanted = list(tests[k - 1]) if k >= 1 else []
        if k < len(tests):
            wanted += [t for t in tests[k] if t not in wanted]
        if wanted:
            work[k] = wanted
    pool = _Worktrees(git, root, max(1, min(jobs, len(work))))
    outcomes: dict[int, dict[str, str]] = {}

    def job(k: int) -> None:
        worktree = pool.take()
        try:
            outcomes[k], result.logs[f"prefix-{k}"] = _run_tests(
                project, worktree, prefix[k], work[k]
            )
        finally:
            pool.give(worktree)

    with ThreadPoolExecutor(max_workers=len(pool.free)) as executor:
        for future in [executor.submit(job, k) for k in sorted(work)]:
            future.result()
    for k, patch in enumerate(series.patches, start=1):
        spec = tests[k - 1]
        if not spec:
            result.proofs.append(
                PatchProof(patch.name, (), Counts(), Counts(), "untested")
            )
            continue
        without = count(outcomes.get(k - 1, {}), spec)
        with_patch = count(outcomes.get(k, {}), spec)
        result.proofs.append(
            PatchProof(
                patch.name, spec, without, with_patch, judge(without, with_patch)
            )
        )
    return result
