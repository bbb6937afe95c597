"""verify: prove each patch's tests fail on the tree without it and pass with it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output, problems_hint
from xpu_series.commands.apply import ApplyOptions, run_apply
from xpu_series.errors import UsageError, XpuSeriesError
from xpu_series.git import Git, run_command
from xpu_series.project import Project
from xpu_series.result import ExitCode, Report
from xpu_series.tree import UPSTREAM_TAG
from xpu_series.ui import render_report, table

HELP = "prove each patch's tests fail without it and pass with it"


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


@dataclass(frozen=True)
class PatchProof:
    """The verdict for one patch."""

    name: str
    tests: tuple[str, ...]
    without: Counts
    with_patch: Counts
    verdict: str  # proven | vacuous | broken | untested | error

    @property
    def only_errors(self) -> bool:
        """Proven only by a collection or setup error (an import that fails)."""
        return self.verdict == "proven" and not self.without.failed

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tests": list(self.tests),
            "without": self.without.to_json(),
            "with": self.with_patch.to_json(),
            "verdict": self.verdict,
            "only_errors": self.only_errors,
        }


@dataclass
class VerifyResult:
    """All verdicts, plus the apply report the prefixes came from."""

    apply: Report
    proofs: list[PatchProof] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    # Runs that produced no outcome for the tests they were given: never a verdict.
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.apply.ok
            and not self.errors
            and bool(self.proofs)
            and all(p.verdict == "proven" for p in self.proofs)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.apply.to_json()["upstream"],
            "patches": [p.to_json() for p in self.proofs],
            "problems": self.apply.problems,
            "errors": self.errors,
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
    >>> judge(Counts(errors=1), Counts(passed=2))
    'proven'
    """
    if with_patch.failed or with_patch.errors or not with_patch.passed:
        return "broken"
    if not (without.failed or without.errors):
        return "vacuous"
    return "proven"


def count(outcomes: dict[str, str], tests: tuple[str, ...]) -> Counts:
    """Tally the outcomes whose node id is one of `tests` or lies below one."""
    tally = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for nodeid, outcome in outcomes.items():
        if not any(nodeid == t or nodeid.startswith(t + "::") for t in tests):
            continue
        tally[outcome if outcome in tally else "failed"] += 1
    return Counts(tally["passed"], tally["failed"], tally["skipped"], tally["error"])


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
    return run_pytest(project, worktree, tests)


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
            "-p", "no:cacheprovider", "--rootdir", str(project.root), *tests,
        ]  # fmt: skip
        result = run_command(args, cwd=project.root, env=env)
        outcomes = json.loads(out.read_text()) if out.is_file() else {}
    return outcomes, result.stdout[-4000:] + result.stderr[-2000:]


def select(names: list[str], wanted: list[str]) -> list[int]:
    """Indexes (1-based) of the patches `wanted` names: a file name, its stem, or
    its number.

    >>> select(["0001-a.patch", "0002-b.patch"], ["0002", "0001-a"])
    [1, 2]
    """
    if not wanted:
        return list(range(1, len(names) + 1))
    chosen: set[int] = set()
    for word in wanted:
        hits = [
            i
            for i, name in enumerate(names, start=1)
            if word in (name, name.removesuffix(".patch"), name[:4])
            or (word.isdigit() and name[:4].isdigit() and int(word) == int(name[:4]))
        ]
        if not hits:
            raise UsageError(
                f"no patch in the series is called {word!r}",
                hint="name a patch as in patches/series, its stem, or its number",
            )
        chosen.update(hits)
    return sorted(chosen)


def run_verify(
    project: Project, jobs: int = 2, patches: list[str] | None = None
) -> VerifyResult:
    """Apply the series once, then run patch k's tests at prefixes k-1 and k."""
    root = project.build_dir / "verify"
    report = run_apply(project, ApplyOptions(tree=root / "tree", scratch=True))
    assert isinstance(report, Report)  # a scratch tree always gives a report
    result = VerifyResult(apply=report)
    if not report.ok:
        return result
    git = Git(root / "tree")
    series = project.series()
    names = [p.name for p in series.patches]
    chosen = select(names, patches or [])
    prefix = [git.out("rev-parse", UPSTREAM_TAG)]
    for outcome in report.patches:
        prefix.append(outcome.commit or prefix[-1])
    tests = [tuple(p.header.tests) for p in series.patches]
    for k in chosen:
        spec = tests[k - 1]
        missing = [t for t in spec if not (project.root / t.split("::")[0]).exists()]
        if missing:
            raise XpuSeriesError(
                f"{names[k - 1]} names tests that do not exist: {', '.join(missing)}",
                hint="fix the Tests: field in the patch's commit message, then refresh",
            )
    # Patch k's tests run at prefix k-1 (must fail) and prefix k (must pass); one
    # pytest process per prefix runs everything that prefix owes.
    work: dict[int, list[str]] = {}
    for k in chosen:
        for at in (k - 1, k):
            wanted = work.setdefault(at, [])
            wanted += [t for t in tests[k - 1] if t not in wanted]
    work = {k: v for k, v in work.items() if v}
    if not work:
        result.proofs = [
            PatchProof(names[k - 1], (), Counts(), Counts(), "untested") for k in chosen
        ]
        return result
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
    for k in chosen:
        name, spec = names[k - 1], tests[k - 1]
        if not spec:
            result.proofs.append(PatchProof(name, (), Counts(), Counts(), "untested"))
            continue
        without = count(outcomes.get(k - 1, {}), spec)
        with_patch = count(outcomes.get(k, {}), spec)
        empty = [
            at for at, counts in ((k - 1, without), (k, with_patch)) if not counts.total
        ]
        if empty:
            # No outcome is not a verdict: pytest crashed, or collected nothing.
            for at in empty:
                result.errors.append(
                    f"{name}: the run at prefix {at} ({_prefix_name(names, at)}) "
                    f"produced no outcome for {', '.join(spec)}; "
                    f"pytest said:\n{_tail(result.logs.get(f'prefix-{at}', ''))}"
                )
            result.proofs.append(PatchProof(name, spec, without, with_patch, "error"))
            continue
        result.proofs.append(
            PatchProof(name, spec, without, with_patch, judge(without, with_patch))
        )
    return result


def _tail(log: str) -> str:
    return log.strip()[-1500:] or "(nothing)"


def _prefix_name(names: list[str], k: int) -> str:
    return "upstream only" if k == 0 else f"upstream + patches up to {names[k - 1]}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "patches", nargs="*", metavar="PATCH", help="prove only these (name or number)"
    )
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel pytest runs")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest output")


def execute(ctx: Context) -> Output:
    project = ctx.project()
    args = ctx.args
    result = run_verify(project, jobs=args.jobs, patches=args.patches)
    out = Output(data=result.to_json())
    if not result.apply.ok:
        out.out.append(render_report(result.apply))
        problems_hint(out, result.apply.problems, "verify")
    rows = [
        [
            p.name,
            ", ".join(Path(t.split("::")[0]).name for t in p.tests) or "-",
            str(p.without),
            str(p.with_patch),
            p.verdict + (" (by errors only)" if p.only_errors else ""),
        ]
        for p in result.proofs
    ]
    out.out.append(table(["patch", "tests", "without", "with", "verdict"], rows))
    for error in result.errors:
        out.err.append(f"error: {error}")
    if args.verbose:
        for key, log in sorted(result.logs.items()):
            out.out.append(f"--- {key}\n{log}")
    elif not result.ok:
        out.err.append("hint: re-run with -v to see the pytest output of each prefix")
    out.code = ExitCode.OK if result.ok else ExitCode.FAILED
    return out
