"""Each patch's tests on each release, without and with it: the trees (the series
as far as each patch goes), the runs they owe, one runner for all of them, and
the verdicts per cell.

Behaviour on a release: the series is committed there as far as each patch goes
(a patch that does not apply is left out, the rest go on), then each patch's
`Fast-Tests:` run with the patches below it and without it (and with it, where it
applies), through the same prefix runner and outcome cache as `verify`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.matrix.record import (
    RECORD,
    RECORD_HINT,
    Cell,
    cell_inputs,
    cell_label,
    load_cells,
    save_cells,
)
from xpu_series.matrix.table import (
    ERROR,
    NEEDED,
    UPSTREAM_HAS_IT,
    Matrix,
    PatchRow,
    classify,
    compared_releases,
    default_versions,
    release_order,
    wheel_version,
)
from xpu_series.project import Project
from xpu_series.proofs.proof import Counts, PrefixRunner, Run, count
from xpu_series.proofs.record import (
    SEED_ENV,
    PatchInputs,
    Recorded,
    SeriesFacts,
    budget_s,
    in_ci,
    load_record,
    patch_inputs,
    plan_proofs,
    prove_all_asked,
    recorded_seconds,
    sample_size,
    total_seconds,
)
from xpu_series.proofs.series_proof import SeriesPrefixes
from xpu_series.result import PatchStatus, Report
from xpu_series.stack import engine
from xpu_series.stack.build import remember, reusable, run_check, scratch_key
from xpu_series.stack.pin import version_tuple
from xpu_series.stack.sequencer import borrow_pin_objects
from xpu_series.stack.series import Patch
from xpu_series.stack.tree import materialize_base, repair
from xpu_series.stack.wheel import fetch_wheel


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
    work: dict[str, list[str]] = field(default_factory=dict)
    # Patch index -> (without, with): from verify's record (the pin) or the
    # matrix record (a served older release); their runs are not made.
    recorded: dict[int, tuple[Counts, Counts | None]] = field(default_factory=dict)
    # Of `recorded`, the patches whose cells are verify's (the pin's carried ones).
    from_verify: set[int] = field(default_factory=set)
    # Patch index -> the seconds the matrix record keeps for its cell.
    recorded_s: dict[int, float | None] = field(default_factory=dict)
    # Patch index -> its cell's key (the served releases below the pin).
    keys: dict[int, PatchInputs] = field(default_factory=dict)
    # Patch index -> the recorded cell a sampled re-measurement must equal.
    reprove: dict[int, Cell] = field(default_factory=dict)
    # Patch index -> what its tests counted in this run (or the record's).
    cells: dict[int, Cell] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)

    def owe(self) -> None:
        """The runs each commit owes: the tests of every patch measured here,
        before it and (where it applies) after it; a re-measured patch's
        commits are run even when the outcome cache has them."""
        self.work = {}
        self.fresh = set()
        for k, spec in enumerate(self.tests):
            if not spec or k in self.recorded:
                continue
            status, after = self.steps[k]
            commits = [self.before[k]]
            if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
                commits.append(after)
            for commit in commits:
                wanted = self.work.setdefault(commit, [])
                wanted += [t for t in spec if t not in wanted]
                if k in self.reprove:
                    self.fresh.add(commit)

    def cell(
        self,
        k: int,
        outcomes: dict[str, dict[str, str]],
        took: dict[str, float | None] | None = None,
    ) -> Cell:
        """Patch k's counts, from the record or from this run's `outcomes`
        (commit -> test -> outcome), and how long its commits' runs took
        (`took`, commit -> seconds; a trusted cell keeps its record's)."""
        status, after = self.steps[k]
        if k in self.recorded:
            without, with_patch = self.recorded[k]
            return Cell(str(status), without, with_patch, self.recorded_s.get(k))
        spec = self.tests[k]
        without = count(outcomes.get(self.before[k], {}), spec)
        applied = status in (PatchStatus.APPLIED, PatchStatus.MERGED)
        with_patch = count(outcomes.get(after, {}), spec) if applied else None
        commits = [self.before[k], after] if applied else [self.before[k]]
        seconds = total_seconds((took or {}).get(c) for c in commits)
        return Cell(str(status), without, with_patch, seconds)


def _plan(project: Project, version: str, wheel: Path | None, report: Report) -> _Plan:
    """The series on `version` as far as it goes (on the pin, verify's record
    stands for the patches it holds for these trees; on a served older release,
    each cell gets its key for the matrix record)."""
    git, steps, base = _best_effort_tree(project, version, wheel)
    series = project.series(version, every_retired=True).patches
    # Fast-Tests where a patch names them: the real-server ones would start
    # servers twice per patch per release.
    tests = [tuple(p.header.fast_tests) for p in series]
    before = [base] + [commit for _status, commit in steps[:-1]]
    plan = _Plan(version, git, series, steps, before, tests)
    if version == project.pin.version:
        plan.recorded = dict(_recorded_pin(project, git, report, series, steps, before))
        plan.from_verify = set(plan.recorded)
        # The pin's cells verify does not prove (a retired patch's tests on the
        # release that absorbed it) are kept in the matrix record, as a served
        # older release's are: they are not measured again every run.
        keys = _cell_keys(project, plan, base)
        plan.keys = {k: key for k, key in keys.items() if series[k].retired}
    elif _served_below_pin(project, version):
        plan.keys = _cell_keys(project, plan, base)
    return plan


def _served_below_pin(project: Project, version: str) -> bool:
    have = version_tuple(version)
    low = version_tuple(project.pin.serves_from or project.pin.version)
    pin = version_tuple(project.pin.version)
    return None not in (have, low, pin) and low <= have < pin  # type: ignore[operator]


def _cell_keys(project: Project, plan: _Plan, base: str) -> dict[int, PatchInputs]:
    """Each tested patch's key on this release (matrix/record.py)."""
    trees = plan.git.out(
        "rev-parse", *(f"{c}^{{tree}}" for c in [base, *(c for _s, c in plan.steps)])
    ).split()
    facts = SeriesFacts(
        root=project.root,
        names=[p.name for p in plan.patches],
        files=[p.path for p in plan.patches],
        tests=list(plan.tests),
        trees=trees,
        accepted={},
        pin=project.patches_dir / "upstream.toml",
    )
    return {
        k: cell_inputs(facts, k + 1, plan.version, plan.steps[k][0])
        for k, spec in enumerate(plan.tests)
        if spec
    }


@dataclass
class RecordUse:
    """What the matrix record did in a run: the line saying so, and the cells
    measured because their record was missing or stale (CI fails on those)."""

    line: str = ""
    stale: list[str] = field(default_factory=list)


def _use_record(project: Project, plans: list[_Plan]) -> RecordUse:
    """Split every keyed cell into trusted, re-measured (the seeded sample)
    and measured (no record, or a changed key), as verify splits patches."""
    recorded = load_cells(project.patches_dir)
    labels: list[str] = []
    keys: dict[int, PatchInputs] = {}
    where: dict[int, tuple[_Plan, int]] = {}
    for plan in plans:
        for k, key in plan.keys.items():
            labels.append(cell_label(plan.version, plan.patches[k].name))
            keys[len(labels)] = key
            where[len(labels)] = (plan, k)
    if not labels:
        return RecordUse()
    chosen = list(keys)
    proof = plan_proofs(
        labels, chosen, False, keys, recorded, prove_all_asked(), None, sample_size(),
        costs=recorded_seconds(recorded), budget=budget_s(),
    )  # fmt: skip
    for i in proof.trusted:
        plan, k = where[i]
        cell = Cell.from_json(recorded[labels[i - 1]].result)  # type: ignore[index]
        plan.recorded[k] = (cell.without, cell.with_patch)
        plan.recorded_s[k] = cell.seconds
    for i in proof.reprove:
        plan, k = where[i]
        plan.reprove[k] = Cell.from_json(recorded[labels[i - 1]].result)  # type: ignore[index]
    if recorded is None:
        return RecordUse()
    use = RecordUse(
        stale=[f"{labels[i - 1]} ({why})" for i, why in proof.prove.items()]
    )
    again = ", ".join(labels[i - 1] for i in proof.reprove) or "none"
    line = (
        f"matrix record: {len(proof.trusted)} of {len(labels)} cells from "
        f"patches/{RECORD}; re-measuring {again}"
    )
    if proof.seed is not None:
        line += f" (seed {proof.seed}; {SEED_ENV}={proof.seed} repeats the choice)"
    if proof.prove:
        line += f"; measuring {len(proof.prove)} with no record or a changed key"
    use.line = line
    return use


def _recorded_pin(
    project: Project,
    git: Git,
    report: Report,
    series: tuple[Patch, ...],
    steps: list[tuple[str, str]],
    before: list[str],
) -> dict[int, tuple[Counts, Counts | None]]:
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
    out: dict[int, tuple[Counts, Counts | None]] = {}
    for i, k in enumerate(carried, start=1):
        kept = recorded.get(names[i - 1])
        if kept is None or kept.key != patch_inputs(facts, i).key:
            continue
        result = kept.result
        out[k] = (Counts(**result["without"]), Counts(**result["with"]))
    return out


def _kept(plan: _Plan) -> str:
    """Where the cells not measured come from, for the plan's line."""
    verify = len(plan.from_verify)
    matrix = len(plan.recorded) - verify
    parts = [f"{verify} patches from verify's record"] if verify else []
    parts += [f"{matrix} patches from the matrix record"] if matrix else []
    return f" ({', '.join(parts)})" if parts else ""


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
            fresh = commit in plan.fresh
            work[label] = Run(commit, tests, repo=plan.git, root=root, fresh=fresh)
            owner[label] = plan
    left = {plan.version: len(plan.work) for plan in plans}
    start = time.monotonic()

    def tell(line: str) -> None:
        # "<version> <40-hex commit>: ..." -> "matrix <version> <12-hex>: ..."
        version, _, rest = line.partition(" ")
        if say is None:
            return
        if version in left and rest[40:41] == ":":
            say(f"matrix {version} {rest[:12]}{rest[40:]}")
        else:  # the runner's own lines (how many runs, how many at a time)
            say(f"matrix: {line}")

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
        took = {
            commit: runner.seconds.get(_label(version, commit)) for commit in plan.work
        }
        for k, (patch, spec) in enumerate(zip(plan.patches, plan.tests, strict=True)):
            row = rows[patch.name]
            status, _after = plan.steps[k]
            if row.text.get(version, "-") == "-":
                row.text[version] = status  # a retired patch: check leaves it out
            cell = plan.cell(k, mine, took)
            plan.cells[k] = cell
            verdict = classify(cell.without, cell.with_patch, status, bool(spec))
            row.behaviour[version] = verdict
            detail = f"without: {cell.without}"
            if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
                detail += f"; with: {cell.with_patch}"
            if k in plan.recorded:
                source = "verify's record" if k in plan.from_verify else "matrix record"
                detail += f" ({source})"
            row.detail[version] = detail if spec else ""
            kept = plan.reprove.get(k)
            if kept is not None and kept != cell:
                matrix.errors.append(
                    f"{version}: {patch.name}: re-measured, its tests count "
                    f"{_counts(cell)}, but patches/{RECORD} says {_counts(kept)}"
                )
            if verdict == ERROR:
                label = _label(version, plan.before[k])
                log = runner.logs.get(label, "").strip()[-1200:]
                matrix.errors.append(
                    f"{version}: {patch.name}: the run without it produced no "
                    f"outcome for {', '.join(spec)}; pytest said:\n"
                    f"{log or '(nothing)'}"
                )


def _counts(cell: Cell) -> str:
    return f"without: {cell.without}; with: {cell.with_patch} ({cell.status})"


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
    ordered = sorted(matrix.versions, key=release_order)
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


def _save(project: Project, plans: list[_Plan]) -> Path | None:
    """Each served older release's cells, measured or trusted in this run."""
    measured: dict[str, dict[str, Recorded]] = {}
    for plan in plans:
        if not plan.keys:
            continue
        measured[plan.version] = {
            plan.patches[k].name: Recorded(dict(key.digests), plan.cells[k].to_json())
            for k, key in plan.keys.items()
        }
    return save_cells(project.patches_dir, measured) if measured else None


def run_matrix(
    project: Project,
    versions: list[str],
    wheels: list[Path],
    progress: bool = False,
    behaviour: bool = False,
    jobs: int = 2,
    newer: bool = False,
    say: Callable[[str], None] | None = None,
    record: bool = False,
) -> Matrix:
    """`check` on the pin and on each version (or local wheel); with `behaviour`,
    each patch's tests there too. The user's tree is never touched. `newer`:
    by default only the releases newer than the pin. `say` hears a line per
    finished release. `record`: write the served older releases' cells into
    the matrix record (matrix/record.py) when the run has no error."""
    by_version = {wheel_version(w, project.pin.project): w for w in wheels}
    asked = [*versions, *by_version]
    if not asked:
        asked = default_versions(project)
        if newer:
            pin = version_tuple(project.pin.version) or ()
            asked = [v for v in asked if (version_tuple(v) or ()) > pin]
    wanted = compared_releases(project, asked)
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
        if behaviour and not report.problems:
            plans.append(_plan(project, version, by_version.get(version), report))
        if say is not None:
            applied = sum(p.status == PatchStatus.APPLIED for p in report.patches)
            say(
                f"matrix {version}: {applied}/{len(report.patches)} patches apply "
                f"in {time.monotonic() - began:.0f}s "
                f"[{number}/{len(wanted)} releases, "
                f"{time.monotonic() - start:.0f}s elapsed]"
            )
    if plans:
        use = _use_record(project, plans)
        if use.line and say is not None:
            say(use.line)
        for plan in plans:
            plan.owe()
            if say is None:
                continue
            say(
                f"matrix {plan.version}: {len(plan.work)} test runs to make"
                + _kept(plan)
            )
        _measure(project, matrix, plans, jobs, say)
        if use.stale and in_ci() and not record:
            shown = "; ".join(use.stale[:5])
            more = f" and {len(use.stale) - 5} more" if len(use.stale) > 5 else ""
            matrix.errors.append(
                f"patches/{RECORD} is stale for {len(use.stale)} cell(s), measured "
                f"in full here: {shown}{more}"
            )
            matrix.hints.append(RECORD_HINT)
        if record and not matrix.errors:
            path = _save(project, plans)
            if path is not None and say is not None:
                say(f"matrix record: wrote {path}")
    _conclude(project, matrix)
    return matrix
