"""matrix: each patch on several upstream releases, side by side: by text (does it
apply?) and, with --behaviour, by its tests (does the release still need it?).

Behaviour on a release: the series is committed there as far as each patch goes
(a patch that does not apply is left out, the rest go on), then each patch's
`Tests:` run with the patches below it and without it (and with it, where it
applies), through the same prefix runner and outcome cache as `verify`:
`needed` (fail without, pass with), `upstream-has-it` (pass without),
`tests-need-porting` (fail or error with the patch too, or the text says upstream
has it but the tests disagree), `untested` (no `Tests:`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output
from xpu_series.errors import UsageError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.proofs.proof import Counts, PrefixRunner, Run, count
from xpu_series.proofs.record import load_record, patch_inputs
from xpu_series.proofs.series_proof import SeriesPrefixes
from xpu_series.result import TESTS_NEED_PORTING, ExitCode, PatchStatus, Report
from xpu_series.stack import engine
from xpu_series.stack.build import remember, reusable, run_check, scratch_key
from xpu_series.stack.pin import version_tuple
from xpu_series.stack.sequencer import borrow_pin_objects
from xpu_series.stack.series import Patch
from xpu_series.stack.tree import materialize_base, repair
from xpu_series.stack.wheel import fetch_wheel, index_releases
from xpu_series.ui import table

HELP = "each patch on several upstream releases: applies? still needed?"
NEEDED = "needed"
UPSTREAM_HAS_IT = "upstream-has-it"
PORTING = TESTS_NEED_PORTING
UNTESTED = "untested"
ERROR = "error"


@dataclass
class PatchRow:
    """One patch across the releases."""

    name: str
    text: dict[str, str] = field(default_factory=dict)
    behaviour: dict[str, str] = field(default_factory=dict)
    detail: dict[str, str] = field(default_factory=dict)
    no_longer_needed: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "text": self.text,
            "behaviour": self.behaviour,
            "detail": self.detail,
            "no_longer_needed": self.no_longer_needed,
        }


@dataclass
class Matrix:
    """One check report per version, in the order asked, and the per-patch rows."""

    reports: dict[str, Report] = field(default_factory=dict)
    rows_: list[PatchRow] = field(default_factory=list)
    behaviour: bool = False
    # Our own errors (a test run that produced nothing): these fail the run.
    errors: list[str] = field(default_factory=list)
    # Headers that disagree with what the tests measured: information.
    disagreements: list[str] = field(default_factory=list)
    pin: str = ""

    @property
    def versions(self) -> list[str]:
        return list(self.reports)

    def cell(self, row: PatchRow, version: str) -> str:
        text = row.text.get(version, "-")
        if not self.behaviour:
            return text
        return f"{text} / {row.behaviour.get(version, '-')}"

    def rows(self) -> list[list[str]]:
        return [
            [row.name, *(self.cell(row, v) for v in self.versions)]
            for row in self.rows_
        ]

    @property
    def ok(self) -> bool:
        """The pin applies and every test run produced outcomes. A newer release
        that needs work is information, not a failure."""
        pin = self.reports.get(self.pin)
        return (pin is None or pin.ok) and not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "versions": self.versions,
            "pin": self.pin,
            "patches": [row.to_json() for row in self.rows_],
            "reports": {v: r.to_json() for v, r in self.reports.items()},
            "errors": self.errors,
            "disagreements": self.disagreements,
            "ok": self.ok,
        }

    def markdown(self) -> str:
        head = ["patch", *self.versions, "no longer needed from"]
        lines = [
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for row in self.rows_:
            gone = row.no_longer_needed
            when = f"{gone['version']} ({gone['why']})" if gone else "-"
            cells = [row.name.removesuffix(".patch")]
            cells += [self.cell(row, v) for v in self.versions] + [when]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def wheel_version(path: Path, project: str) -> str:
    """The release a wheel file name carries.

    >>> wheel_version(Path("sglang-0.5.23-cp311-cp311-x.whl"), "sglang")
    '0.5.23'
    """
    prefix = f"{project}-"
    if not path.name.startswith(prefix) or path.suffix != ".whl":
        raise UsageError(f"{path.name} is not a {project} wheel file name")
    return path.name[len(prefix) :].split("-", 1)[0]


def default_versions(project: Project) -> list[str]:
    """Every release the series serves (from the pin's `serves-from`) and every
    newer one the index lists (plain X.Y.Z releases), oldest first."""
    pin = version_tuple(project.pin.version) or ()
    oldest = version_tuple(project.pin.serves_from) or pin
    return sorted(
        (
            v
            for v in index_releases(project.pin)
            if (t := version_tuple(v)) is not None and t >= oldest and t != pin
        ),
        key=lambda v: version_tuple(v) or (),
    )


def classify(
    without: Counts, with_patch: Counts | None, status: str, has_tests: bool
) -> str:
    """A patch's behaviour on one release from its tests' outcomes.

    >>> classify(Counts(failed=1), Counts(passed=1), "applied", True)
    'needed'
    >>> classify(Counts(passed=2), Counts(passed=2), "applied", True)
    'upstream-has-it'
    >>> classify(Counts(failed=1), Counts(failed=1), "applied", True)
    'tests-need-porting'
    >>> classify(Counts(failed=1), None, "conflict", True)
    'needed'
    """
    if not has_tests:
        return UNTESTED
    if not without.total:
        return ERROR
    if not (without.passed or without.failed or without.errors):
        return UNTESTED  # every test skipped here (their reasons say why)
    if without.passed and not (without.failed or without.errors):
        return UPSTREAM_HAS_IT
    if status == str(PatchStatus.ABSORBED):
        return PORTING  # upstream has the text, yet the tests fail: they moved
    if with_patch is None:
        return NEEDED  # fails without; the patch itself needs rework to apply
    if with_patch.failed or with_patch.errors or not with_patch.passed:
        return PORTING
    return NEEDED


def _best_effort_tree(
    project: Project, version: str, wheel: Path | None
) -> tuple[Git, list[tuple[str, str]], str]:
    """The series on `version` as far as each patch goes: (status, commit after
    the patch) per patch, and the base commit. An unchanged tree answers from
    its record."""
    tree = project.build_dir / "matrix" / version / "tree"
    tree.parent.mkdir(parents=True, exist_ok=True)
    series = project.series(version, every_retired=True)
    with tree_lock(tree, f"xpu-series matrix {version}"):
        git = Git(tree)
        pin = project.pin.for_version(version)
        fetched = fetch_wheel(pin, project.cache_dir, local=wheel)
        key = scratch_key(fetched.sha256, series)
        saved = reusable(git, key, "best_effort")
        if saved is not None:
            steps = [(s, c) for s, c in saved["steps"]]
            return git, steps, saved["base"]
        if git.is_repo():
            repair(git)
            git.run("clean", "-q", "-fdx")
        base = materialize_base(fetched, pin, tree, project.cache_dir)
        if version != project.pin.version:
            borrow_pin_objects(project, git)
        steps: list[tuple[str, str]] = []
        head = base.commit
        for patch in series.patches:
            status, detail = engine.commit_patch(
                git, patch, exact=version == project.pin.version
            )
            status, _detail = engine.settle(git, patch, status, detail, version)
            if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
                head = git.out("rev-parse", "HEAD")
            steps.append((str(status), head))
        remember(git, key, "best_effort", {"steps": steps, "base": base.commit})
    return git, steps, base.commit


@dataclass
class _Plan:
    """One release's share of the behavioural runs: its tree, its series, the
    commit before and after each patch, and the tests each commit owes."""

    version: str
    git: Git
    patches: tuple[Patch, ...]
    steps: list[tuple[str, str]]
    before: list[str]
    tests: list[tuple[str, ...]]
    work: dict[str, list[str]]
    # Patch index -> (without, with) from verify's record (the pin only).
    recorded: dict[int, tuple[Counts, Counts]] = field(default_factory=dict)


def _plan(project: Project, version: str, wheel: Path | None, report: Report) -> _Plan:
    """The series on `version` as far as it goes, and the runs its patches owe
    (on the pin, none for a patch whose verify record holds for these trees)."""
    git, steps, base = _best_effort_tree(project, version, wheel)
    series = project.series(version, every_retired=True).patches
    # Fast-Tests where a patch names them: the real-server ones would start
    # servers twice per patch per release.
    tests = [tuple(p.header.fast_tests) for p in series]
    before = [base] + [commit for _status, commit in steps[:-1]]
    recorded: dict[int, tuple[Counts, Counts]] = {}
    if version == project.pin.version:
        recorded = _recorded_pin(project, git, report, series, steps, before)
    work: dict[str, list[str]] = {}
    for k, spec in enumerate(tests):
        if not spec or k in recorded:
            continue
        status, after = steps[k]
        commits = [before[k]]
        if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
            commits.append(after)
        for commit in commits:
            wanted = work.setdefault(commit, [])
            wanted += [t for t in spec if t not in wanted]
    return _Plan(version, git, series, steps, before, tests, work, recorded)


def _recorded_pin(
    project: Project,
    git: Git,
    report: Report,
    series: tuple[Patch, ...],
    steps: list[tuple[str, str]],
    before: list[str],
) -> dict[int, tuple[Counts, Counts]]:
    """The pin's carried patches whose verify record holds for the trees this
    tree has for them (same key: same trees, tests, proof code, environment):
    their cells are verify's measurement, and their runs are not made again.
    A patch with no record, or a stale one, is measured as on any release."""
    recorded = load_record(project.patches_dir, "verify")
    carried = [k for k, p in enumerate(series) if not p.retired]
    if not recorded or any(steps[k][0] != PatchStatus.APPLIED for k in carried):
        return {}
    names = [series[k].name for k in carried]
    commits = [before[carried[0]], *(steps[k][1] for k in carried)]
    tests = [tuple(series[k].header.tests) for k in carried]
    prefixes = SeriesPrefixes(
        project, report, git, git.repo.parent, names, commits, tests
    )
    facts = prefixes.facts()
    out: dict[int, tuple[Counts, Counts]] = {}
    for i, k in enumerate(carried, start=1):
        kept = recorded.get(names[i - 1])
        if kept is None or kept.key != patch_inputs(facts, i).key:
            continue
        result = kept.result
        out[k] = (Counts(**result["without"]), Counts(**result["with"]))
    return out


def _label(version: str, commit: str) -> str:
    return f"{version} {commit}"


def _measure(
    project: Project,
    matrix: Matrix,
    plans: list[_Plan],
    jobs: int,
    say: Callable[[str], None] | None = None,
) -> None:
    """Fill in the behaviour columns of the planned releases for every patch.
    Every release's runs go through one pool of worker interpreters (torch and
    the rest imported once per lane, not once per lane per release), oldest
    release first; a line per finished release says how many runs it took and
    how many the cache answered."""
    work: dict[str, Run] = {}
    owner: dict[str, _Plan] = {}
    for plan in plans:
        root = project.build_dir / "matrix" / plan.version
        for commit, tests in plan.work.items():
            label = _label(plan.version, commit)
            work[label] = Run(commit, tests, repo=plan.git, root=root)
            owner[label] = plan
    left = {plan.version: len(plan.work) for plan in plans}
    start = time.monotonic()

    def tell(line: str) -> None:
        # "<version> <40-hex commit>: ..." -> "matrix <version> <12-hex>: ..."
        version, _, rest = line.partition(" ")
        if say is not None:
            say(f"matrix {version} {rest[:12]}{rest[40:]}")

    runner = PrefixRunner(
        project, plans[0].git, project.build_dir / "matrix", jobs, say=tell
    )

    def finished(label: str) -> None:
        plan = owner[label]
        left[plan.version] -= 1
        if left[plan.version] or say is None:
            return
        labels = [_label(plan.version, c) for c in plan.work]
        cached = sum(label in runner.cached for label in labels)
        say(
            f"matrix {plan.version}: {len(labels)} test runs ({cached} from the "
            f"cache) done [{len(plans) - sum(map(bool, left.values()))}/"
            f"{len(plans)} releases measured, {time.monotonic() - start:.0f}s "
            "elapsed]"
        )

    outcomes = runner.run(work, finished)
    rows = {row.name: row for row in matrix.rows_}
    for plan in plans:
        version = plan.version
        mine = {
            commit: outcomes.get(_label(version, commit), {}) for commit in plan.work
        }
        for k, (patch, spec) in enumerate(zip(plan.patches, plan.tests, strict=True)):
            row = rows[patch.name]
            status, after = plan.steps[k]
            if row.text.get(version, "-") == "-":
                row.text[version] = status  # a retired patch: check leaves it out
            applied = status in (PatchStatus.APPLIED, PatchStatus.MERGED)
            if k in plan.recorded:
                without, with_patch = plan.recorded[k]
            else:
                without = count(mine.get(plan.before[k], {}), spec)
                with_patch = count(mine.get(after, {}), spec) if applied else None
            verdict = classify(without, with_patch, status, bool(spec))
            row.behaviour[version] = verdict
            detail = f"without: {without}" + (
                f"; with: {with_patch}" if applied else ""
            )
            if k in plan.recorded:
                detail += " (verify's record)"
            row.detail[version] = detail if spec else ""
            if verdict == ERROR:
                label = _label(version, plan.before[k])
                log = runner.logs.get(label, "").strip()[-1200:]
                matrix.errors.append(
                    f"{version}: {patch.name}: the run without it produced no "
                    f"outcome for {', '.join(spec)}; pytest said:\n"
                    f"{log or '(nothing)'}"
                )


def _conclude(project: Project, matrix: Matrix) -> None:
    """Per patch: the first release that no longer needs it, and headers that
    disagree with the measurement."""
    series = {
        p.name: p
        for v in matrix.versions
        for p in project.series(v, every_retired=True).patches
    }
    # Oldest first: a retired patch is no longer needed from its release, a
    # carried one from the first newer release that has it.
    ordered = sorted(matrix.versions, key=lambda v: version_tuple(v) or (10**6,))
    for row in matrix.rows_:
        for version in ordered:
            if row.text.get(version) == str(PatchStatus.ABSORBED):
                why = "text: upstream has it"
            elif row.behaviour.get(version) == UPSTREAM_HAS_IT:
                why = "behaviour: its tests pass without it"
            else:
                continue
            row.no_longer_needed = {"version": version, "why": why}
            break
        claimed = series[row.name].header.get("Applied-Upstream")
        if not claimed or not matrix.behaviour:
            continue
        if matrix.behaviour and row.behaviour.get(claimed) == NEEDED:
            matrix.disagreements.append(
                f"{row.name} says Applied-Upstream: {claimed}, but its tests still "
                f"fail without it on {claimed}"
            )
        for version in matrix.versions:
            have, want = version_tuple(version), version_tuple(claimed)
            if (
                have is not None
                and want is not None
                and have < want
                and row.behaviour.get(version) == UPSTREAM_HAS_IT
            ):
                matrix.disagreements.append(
                    f"{row.name} says Applied-Upstream: {claimed}, but its tests "
                    f"already pass without it on {version}"
                )
                break


def run_matrix(
    project: Project,
    versions: list[str],
    wheels: list[Path],
    progress: bool = False,
    behaviour: bool = False,
    jobs: int = 2,
    newer: bool = False,
    say: Callable[[str], None] | None = None,
) -> Matrix:
    """`check` on the pin and on each version (or local wheel); with `behaviour`,
    each patch's tests there too. The user's tree is never touched. `newer`:
    by default only the releases newer than the pin. `say` hears a line per
    finished release."""
    by_version = {wheel_version(w, project.pin.project): w for w in wheels}
    asked = [*versions, *by_version]
    if not asked:
        asked = default_versions(project)
        if newer:
            pin = version_tuple(project.pin.version) or ()
            asked = [v for v in asked if (version_tuple(v) or ()) > pin]
    wanted = [project.pin.version]
    for version in asked:
        if version not in wanted:
            wanted.append(version)
    # Oldest first: the served releases, the pin, then the newer ones.
    wanted.sort(key=lambda v: version_tuple(v) or (10**6,))
    matrix = Matrix(behaviour=behaviour, pin=project.pin.version)
    # One row per patch any of these releases carries (retired patches appear
    # on the older releases that still need them), in series order.
    names: list[str] = []
    for version in wanted:
        for patch in project.series(version, every_retired=True).patches:
            if patch.name not in names:
                names.append(patch.name)
    names.sort(key=lambda n: int(n[:4]) if n[:4].isdigit() else 10**6)
    matrix.rows_ = [PatchRow(name) for name in names]
    start = time.monotonic()
    plans: list[_Plan] = []
    for number, version in enumerate(wanted, start=1):
        began = time.monotonic()
        report = run_check(project, version, by_version.get(version), progress)
        matrix.reports[version] = report
        statuses = {p.name: str(p.status) for p in report.patches}
        for row in matrix.rows_:
            row.text[version] = statuses.get(row.name, "-")
        runs = ""
        if behaviour and not report.problems:
            plans.append(_plan(project, version, by_version.get(version), report))
            runs = f", {len(plans[-1].work)} test runs to make"
            if plans[-1].recorded:
                runs += f" ({len(plans[-1].recorded)} patches from verify's record)"
        if say is not None:
            applied = sum(p.status == PatchStatus.APPLIED for p in report.patches)
            say(
                f"matrix {version}: {applied}/{len(report.patches)} patches apply"
                f"{runs} in {time.monotonic() - began:.0f}s "
                f"[{number}/{len(wanted)} releases, "
                f"{time.monotonic() - start:.0f}s elapsed]"
            )
    if plans:
        _measure(project, matrix, plans, jobs, say)
    _conclude(project, matrix)
    return matrix


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "versions",
        nargs="*",
        metavar="VERSION",
        help="releases to compare with the pin (default: every newer release "
        "the package index lists)",
    )
    p.add_argument(
        "--wheel",
        action="append",
        metavar="PATH",
        help="a local wheel (its version comes from the file name); repeatable",
    )
    p.add_argument(
        "--behaviour",
        action="store_true",
        help="also run each patch's tests without and with it on every release",
    )
    p.add_argument(
        "--newer",
        action="store_true",
        help="by default, only the releases newer than the pin (not the served "
        "older ones)",
    )
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel pytest runs")
    p.add_argument(
        "--markdown", action="store_true", help="print the table as markdown"
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        help="also write matrix.json and matrix.md into DIR",
    )


def execute(ctx: Context) -> Output:
    project = ctx.project()
    args = ctx.args
    wheels = [Path(w) for w in args.wheel or []]
    matrix = run_matrix(
        project,
        args.versions,
        wheels,
        ctx.progress,
        args.behaviour,
        args.jobs,
        args.newer,
        ctx.say,
    )
    out = Output(data=matrix.to_json())
    if args.markdown:
        out.out.append(matrix.markdown())
    else:
        out.out.append(table(["patch", *matrix.versions], matrix.rows()))
        gone = [
            f"{row.name}: not needed from {row.no_longer_needed['version']} "
            f"({row.no_longer_needed['why']})"
            for row in matrix.rows_
            if row.no_longer_needed
        ]
        if gone:
            out.out += ["", *gone]
    out.out += [f"note: {d}" for d in matrix.disagreements]
    # DEP-3's Forwarded: the upstream pull request a carried patch was sent as.
    forwarded = {
        p.name: p.header.get("Forwarded")
        for p in project.series().patches
        if p.exists and p.header.get("Forwarded")
    }
    out.out += [f"forwarded: {name} {url}" for name, url in forwarded.items()]
    if forwarded:
        out.data = {**(out.data or {}), "forwarded": forwarded}
    for version, report in matrix.reports.items():
        out.err += [f"error: {version}: {p}" for p in report.problems]
    out.err += [f"error: {e}" for e in matrix.errors]
    if args.save:
        folder = Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "matrix.json").write_text(
            json.dumps(matrix.to_json(), indent=2, sort_keys=True) + "\n"
        )
        (folder / "matrix.md").write_text(matrix.markdown() + "\n")
    out.code = ExitCode.OK if matrix.ok else ExitCode.FAILED
    return out
