"""verify: prove each patch's tests fail on the tree without it and pass with it."""

from __future__ import annotations

import argparse
import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output, problems_hint
from xpu_series.errors import UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.proofs import mutant_worker
from xpu_series.proofs.mutants import (
    ACCEPTED,
    Mutant,
    PatchMutants,
    load_accepted,
    patch_mutants,
    run_worker,
)
from xpu_series.proofs.proof import (
    Counts,
    PrefixRunner,
    Run,
    Worktrees,
    count,
    load_outcomes,
    outcome_key,
    store_json,
)
from xpu_series.proofs.record import (
    RECORD_HINT,
    PatchInputs,
    ProofPlan,
    Recorded,
    SeriesFacts,
    in_ci,
    load_record,
    patch_inputs,
    plan_proofs,
    prove_all_asked,
    record_path,
    sample_size,
    save_record,
)
from xpu_series.result import TESTS_NEED_PORTING, ExitCode, Report
from xpu_series.stack.build import ScratchRequest, build_scratch
from xpu_series.stack.bytecode import prime
from xpu_series.stack.tree import UPSTREAM_TAG
from xpu_series.ui import render_report, table

HELP = "prove each patch's tests fail without it and pass with it"


@dataclass(frozen=True)
class PatchProof:
    """The verdict for one patch."""

    name: str
    tests: tuple[str, ...]
    without: Counts
    with_patch: Counts
    verdict: str  # proven | vacuous | tests-need-porting | untested | error
    # ran (no record, or its key changed), re-proven (the record's sample, or
    # --all), or record (unchanged, trusted from patches/proofs.json)
    source: str = "ran"

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
            "source": self.source,
        }

    def record_result(self) -> dict[str, Any]:
        """What patches/proofs.json keeps of this proof."""
        return {
            "tests": list(self.tests),
            "without": self.without.to_json(),
            "with": self.with_patch.to_json(),
            "verdict": self.verdict,
        }

    def disagreement(self, recorded: dict[str, Any]) -> str:
        """How this proof differs from a recorded one ("" when it agrees)."""
        then = (recorded["verdict"], recorded["without"], recorded["with"])
        now = (self.verdict, self.without.to_json(), self.with_patch.to_json())
        if then == now:
            return ""
        return (
            f"recorded {recorded['verdict']} (without: {Counts(**recorded['without'])}"
            f"; with: {Counts(**recorded['with'])}), now {self.verdict} (without: "
            f"{self.without}; with: {self.with_patch})"
        )


@dataclass
class RecordCheck:
    """How a run stands to patches/proofs.json: the plan it followed, the
    re-proofs that disagree with the record, the records that are stale (and
    whether that fails the run: in CI, unless it records), what it recorded."""

    plan: ProofPlan = field(default_factory=ProofPlan)
    disagreements: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    stale_fails: bool = False
    recorded: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.disagreements and not (self.stale and self.stale_fails)

    def to_json(self) -> dict[str, Any]:
        return {
            "kept": self.plan.keeping,
            "seed": self.plan.seed,
            "disagreements": self.disagreements,
            "stale": self.stale,
            "recorded": self.recorded,
        }


@dataclass
class VerifyResult:
    """All verdicts, plus the apply report the prefixes came from."""

    apply: Report
    proofs: list[PatchProof] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    # Runs that produced no outcome for the tests they were given: never a verdict.
    errors: list[str] = field(default_factory=list)
    record: RecordCheck = field(default_factory=RecordCheck)

    @property
    def ok(self) -> bool:
        return (
            self.apply.ok
            and not self.errors
            and bool(self.proofs)
            and all(p.verdict == "proven" for p in self.proofs)
            and self.record.ok
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.apply.to_json()["upstream"],
            "patches": [p.to_json() for p in self.proofs],
            "problems": self.apply.problems,
            "errors": self.errors,
            "record": self.record.to_json(),
            "ok": self.ok,
        }


def judge(without: Counts, with_patch: Counts) -> str:
    """proven: something fails without the patch and everything passes with it.

    >>> judge(Counts(passed=2, failed=1), Counts(passed=3))
    'proven'
    >>> judge(Counts(passed=3), Counts(passed=3))
    'vacuous'
    >>> judge(Counts(failed=3), Counts(passed=2, failed=1))
    'tests-need-porting'
    >>> judge(Counts(errors=1), Counts(passed=2))
    'proven'
    """
    if with_patch.failed or with_patch.errors or not with_patch.passed:
        return TESTS_NEED_PORTING
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


@dataclass
class SeriesPrefixes:
    """The series applied once in build/verify/tree: commit k is upstream plus
    patches 1..k (prefix 0 is upstream alone); shared by verify and --mutants."""

    project: Project
    report: Report
    git: Git
    root: Path
    names: list[str]
    commits: list[str]
    tests: list[tuple[str, ...]]

    def require_tests(self, chosen: list[int]) -> None:
        for k in chosen:
            spec = self.tests[k - 1]
            root = self.project.root
            missing = [t for t in spec if not (root / t.split("::")[0]).exists()]
            if missing:
                raise XpuSeriesError(
                    f"{self.names[k - 1]} names tests that do not exist: "
                    f"{', '.join(missing)}",
                    hint="fix the Tests: field in the patch's commit message, "
                    "then refresh",
                )


# Where `verify --mutants` applies the series and keeps its worktrees.
MUTANTS_FOLDER = "mutants"


def series_prefixes(project: Project, folder: str = "verify") -> SeriesPrefixes:
    """The series applied in build/<folder>/tree: verify's proofs and its
    mutant runs each have their own (and lock it), so they can run side by
    side."""
    root = project.build_dir / folder
    report = build_scratch(project, ScratchRequest(tree=root / "tree"))
    assert isinstance(report, Report)  # a scratch tree always gives a report
    git = Git(root / "tree")
    series = project.series()
    commits: list[str] = []
    if report.ok:
        commits = [git.out("rev-parse", UPSTREAM_TAG)]
        for outcome in report.patches:
            commits.append(outcome.commit or commits[-1])
    return SeriesPrefixes(
        project,
        report,
        git,
        root,
        [p.name for p in series.patches],
        commits,
        [tuple(p.header.tests) for p in series.patches],
    )


def run_verify(
    project: Project,
    jobs: int = 2,
    patches: list[str] | None = None,
    fresh: bool = False,
    say: Callable[[str], None] | None = None,
) -> VerifyResult:
    """Apply the series once, then run patch k's tests at prefixes k-1 and k."""
    prefixes = series_prefixes(project)
    result = VerifyResult(apply=prefixes.report)
    if not prefixes.report.ok:
        return result
    git, root = prefixes.git, prefixes.root
    names, prefix, tests = prefixes.names, prefixes.commits, prefixes.tests
    chosen = select(names, patches or [])
    prefixes.require_tests(chosen)
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
    runner = PrefixRunner(project, git, root, jobs, fresh, say)
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


@dataclass
class MutantsResult:
    """verify --mutants: per patch, its mutants and what its tests made of them."""

    apply: Report
    patches: list[PatchMutants] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.apply.ok and all(p.ok for p in self.patches)

    def to_json(self) -> dict[str, Any]:
        return {
            "patches": [p.to_json() for p in self.patches],
            "problems": self.apply.problems,
            "seconds": round(self.seconds, 1),
            "ok": self.ok,
        }


# The least time a mutant's run gets; the worker gives more when the tests need
# it (three times their unmutated time plus slack).
MUTANT_TIMEOUT_FLOOR_S = 10.0


def mutants_key(
    project: Project, tree_id: str, tests: tuple[str, ...], made: list[Mutant]
) -> str:
    """What one patch's mutant outcomes depend on: the outcome key of its tests
    on its tree, every mutant's text, the worker and the timeout floor."""
    h = hashlib.sha256(outcome_key(project, tree_id, list(tests)).encode())
    h.update(Path(mutant_worker.__file__).read_bytes())
    h.update(str(MUTANT_TIMEOUT_FLOOR_S).encode())
    for mutant in made:
        h.update(f"\0{mutant.id}\0{mutant.path}\0".encode())
        h.update(mutant.code.encode())
    return h.hexdigest()


def run_mutants(
    project: Project,
    jobs: int = 2,
    patches: list[str] | None = None,
    only: str = "",
    fresh: bool = False,
    say: Callable[[str], None] | None = None,
) -> MutantsResult:
    """Mutate the lines each patch adds; its tests must fail on every mutant.

    One interpreter per patch (heavy imports once), one fork per mutant. A
    patch whose tree, tests and mutants are unchanged answers from the cache.
    `say` hears a line per finished patch and per batch of mutants.
    """
    start = time.monotonic()
    prefixes = series_prefixes(project, MUTANTS_FOLDER)
    result = MutantsResult(apply=prefixes.report)
    if not prefixes.report.ok:
        return result
    chosen = select(prefixes.names, patches or [])
    prefixes.require_tests(chosen)
    accepted = load_accepted(project.root)
    git, commits = prefixes.git, prefixes.commits
    work: list[tuple[int, PatchMutants, str]] = []
    carried = project.series().patches
    cache = project.cache_dir / "mutants"
    for k in chosen:
        name = prefixes.names[k - 1]
        tests = tuple(carried[k - 1].header.fast_tests)
        made = patch_mutants(git, commits[k - 1], commits[k])
        if only:
            made = [m for m in made if m.id == only]
        reasons = {i: r for (n, i), r in accepted.items() if n == name}
        entry = PatchMutants(name, tests, made, {}, reasons)
        result.patches.append(entry)
        if tests and made:
            tree_id = git.out("rev-parse", f"{commits[k]}^{{tree}}")
            key = mutants_key(project, tree_id, tests, made)
            saved = None if fresh else load_outcomes(cache, key)
            if saved is not None:
                entry.baseline, entry.outcomes = "survived", saved
                entry.cached = True
            else:
                work.append((k, entry, key))
        elif made:
            entry.baseline = "untested"
    if only and not any(p.made for p in result.patches):
        raise UsageError(
            f"no mutant {only!r} in {', '.join(p.name for p in result.patches)}",
            hint="copy the id from the survivor's line of 'verify --mutants'",
        )
    tell = say or (lambda _line: None)
    lock = threading.Lock()
    finished = [sum(p.cached for p in result.patches)]
    for entry in result.patches:
        if entry.cached:
            tell(f"{entry.name}: {len(entry.made)} mutants, outcomes from the cache")
    if work:
        pool = Worktrees(git, prefixes.root, min(max(1, jobs), len(work)))
        total = len([p for p in result.patches if p.tests and p.made])

        def job(k: int, entry: PatchMutants, key: str) -> None:
            worktree = pool.take()
            ran = [0, 0]  # mutants run, killed

            def heard(row: dict[str, Any]) -> None:
                if row["id"] == "baseline":
                    return
                ran[0] += 1
                ran[1] += row["outcome"] != "survived"
                if ran[0] % MUTANT_BATCH == 0 and ran[0] < len(entry.made):
                    tell(
                        f"{entry.name}: {ran[0]}/{len(entry.made)} mutants run, "
                        f"{ran[1]} killed ({_elapsed(start)})"
                    )

            try:
                Git(worktree).run("checkout", "-q", "-f", "--detach", commits[k])
                prime(Git(worktree), project.cache_dir)
                entry.baseline, entry.outcomes, entry.seconds = run_worker(
                    project.root, worktree, entry.tests, entry.made,
                    MUTANT_TIMEOUT_FLOOR_S, heard,
                )  # fmt: skip
            finally:
                pool.give(worktree)
            if entry.baseline == "survived" and len(entry.outcomes) == len(entry.made):
                # Only a complete run with passing unmutated tests is remembered.
                store_json(cache, key, {"outcomes": entry.outcomes})
            with lock:
                finished[0] += 1
                tell(
                    f"{entry.name}: {len(entry.made)} mutants, {entry.killed} killed, "
                    f"{len(entry.survivors)} survived in {entry.seconds:.0f}s "
                    f"[{finished[0]}/{total} patches, {_elapsed(start)}]"
                )

        # The biggest patches first, so the pool ends together.
        work.sort(key=lambda item: -len(item[1].made))
        with ThreadPoolExecutor(max_workers=len(pool.free)) as executor:
            for future in [executor.submit(job, *item) for item in work]:
                future.result()
    result.seconds = time.monotonic() - start
    return result


# A progress line after every this many mutants of one patch.
MUTANT_BATCH = 10


def _elapsed(start: float) -> str:
    return f"{time.monotonic() - start:.0f}s elapsed"


def _render_mutants(out: Output, result: MutantsResult) -> None:
    rows = [
        [
            p.name,
            str(len(p.made)),
            str(p.killed),
            str(sum(m.id in p.accepted for m in p.survivors)),
            str(len(p.unaccepted)),
            f"{p.seconds:.0f}s",
            "ok"
            if p.ok
            else (
                "tests fail unmutated"
                if p.baseline == "killed"
                else p.baseline
                if p.baseline != "survived"
                else "survivors"
            ),  # fmt: skip
        ]
        for p in result.patches
    ]
    out.out.append(
        table(
            ["patch", "mutants", "killed", "accepted", "survived", "time", "verdict"],
            rows,
        )  # fmt: skip
    )
    for patch in result.patches:
        for mutant in patch.unaccepted:
            out.out.append(f"survived {mutant.id} {mutant.operator}: {mutant.diff}")
            out.out.append(
                f"  reproduce: xpu-series verify --mutants {patch.name[:4]} "
                f"--mutant {mutant.id}"
            )
    out.out.append(f"total {result.seconds:.0f}s")
    if not result.ok:
        out.err.append(
            f"hint: kill each survivor with a test of behaviour, or accept it with a "
            f"reason in {ACCEPTED}"
        )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "patches", nargs="*", metavar="PATCH", help="prove only these (name or number)"
    )
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel pytest runs")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest output")
    p.add_argument(
        "--mutants",
        action="store_true",
        help="mutate the lines each patch adds; its tests must kill every mutant",
    )
    p.add_argument(
        "--mutant", metavar="ID", default="", help="with --mutants: only this one"
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="run every test again instead of reusing outcomes of the same tree",
    )


def execute(ctx: Context) -> Output:
    project = ctx.project()
    args = ctx.args
    if args.mutant and not args.mutants:
        raise UsageError("--mutant ID goes with --mutants")
    # One run at a time per folder: two runs side by side would check out (or
    # mutate) the same worktrees under each other. Proofs and mutants have a
    # folder each, so one of each can run at once.
    verb = "xpu-series verify" + (" --mutants" if args.mutants else "")
    folder = MUTANTS_FOLDER if args.mutants else "verify"
    with tree_lock(project.build_dir / folder, verb):
        if args.mutants:
            return _mutants_output(
                run_mutants(
                    project, args.jobs, args.patches, args.mutant, args.fresh, ctx.say
                )
            )
        result = run_verify(project, args.jobs, args.patches, args.fresh, ctx.say)
    return _proof_output(result, args.verbose)


def _mutants_output(mutants: MutantsResult) -> Output:
    out = Output(data=mutants.to_json())
    if not mutants.apply.ok:
        out.out.append(render_report(mutants.apply))
        problems_hint(out, mutants.apply.problems, "verify")
    _render_mutants(out, mutants)
    out.code = ExitCode.OK if mutants.ok else ExitCode.FAILED
    return out


def _proof_output(result: VerifyResult, verbose: bool) -> Output:
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
    if verbose:
        for key, log in sorted(result.logs.items()):
            out.out.append(f"--- {key}\n{log}")
    elif not result.ok:
        out.err.append("hint: re-run with -v to see the pytest output of each prefix")
    out.code = ExitCode.OK if result.ok else ExitCode.FAILED
    return out
