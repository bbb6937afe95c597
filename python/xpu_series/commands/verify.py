"""verify: prove each patch's tests fail on the tree without it and pass with it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output, problems_hint
from xpu_series.commands.apply import ApplyOptions, run_apply
from xpu_series.errors import UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.proof import Counts, PrefixRunner, Run, count
from xpu_series.result import ExitCode, Report
from xpu_series.tree import UPSTREAM_TAG
from xpu_series.ui import render_report, table

HELP = "prove each patch's tests fail without it and pass with it"


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
    runner = PrefixRunner(project, git, root, jobs)
    runs = {f"prefix-{k}": Run(prefix[k], wanted) for k, wanted in sorted(work.items())}
    by_label = runner.run(runs)
    result.logs = runner.logs
    outcomes = {k: by_label.get(f"prefix-{k}", {}) for k in work}
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
