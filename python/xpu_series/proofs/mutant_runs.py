"""verify --mutants over a series: per patch, the mutants of the lines it adds
(mutants.py) run against its tests in a worker of their own (mutant_worker.py),
their outcomes cached by what they depend on, or taken from the patch's record
when it is unchanged and not in the run's sample."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import UsageError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.proofs import mutant_worker
from xpu_series.proofs.mutants import (
    Mutant,
    PatchMutants,
    load_accepted,
    patch_mutants,
    run_worker,
)
from xpu_series.proofs.proof import Worktrees, load_outcomes, outcome_key, store_json
from xpu_series.proofs.record import sample, spot_size
from xpu_series.proofs.series_proof import (
    MUTANTS_FOLDER,
    Proving,
    RecordCheck,
    check_record,
    select,
    series_prefixes,
)
from xpu_series.result import Report
from xpu_series.stack.bytecode import prime


@dataclass
class MutantsResult:
    """verify --mutants: per patch, its mutants and what its tests made of them."""

    apply: Report
    patches: list[PatchMutants] = field(default_factory=list)
    seconds: float = 0.0
    record: RecordCheck = field(default_factory=RecordCheck)

    @property
    def ok(self) -> bool:
        return self.apply.ok and all(p.ok for p in self.patches) and self.record.ok

    def to_json(self) -> dict[str, Any]:
        return {
            "patches": [p.to_json() for p in self.patches],
            "problems": self.apply.problems,
            "seconds": round(self.seconds, 1),
            "record": self.record.to_json(),
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
    proving: Proving | None = None,
) -> MutantsResult:
    """Mutate the lines each patch adds; its tests must fail on every mutant.

    One interpreter per patch (heavy imports once), one fork per mutant. A
    patch whose tree, tests and mutants are unchanged answers from the cache,
    unless the run re-proves its record; a patch whose record is unchanged and
    not in the run's sample answers from the record (see record.py). `say`
    hears a line per finished patch and per batch of mutants. `only` (one
    mutant, to reproduce it) leaves the record alone.
    """
    start = time.monotonic()
    proving = proving or Proving()
    prefixes = series_prefixes(project, MUTANTS_FOLDER)
    result = MutantsResult(apply=prefixes.report)
    if not prefixes.report.ok:
        return result
    names = prefixes.names
    chosen = select(names, patches or [])
    prefixes.require_tests(chosen)
    plan, inputs, recorded = prefixes.plan(
        "mutants", chosen, bool(patches), proving.everything, proving.seed
    )
    if only:
        plan.reprove, plan.trusted = [], []
        plan.prove = {k: "asked" for k in chosen}
        plan.keeping = False
    result.record.plan = plan
    tell = say or (lambda _line: None)
    if plan.describe(names):
        tell(plan.describe(names))
    accepted = load_accepted(project.root)
    git, commits = prefixes.git, prefixes.commits
    work: list[tuple[int, PatchMutants, str]] = []
    carried = project.series().patches
    cache = project.cache_dir / "mutants"
    again = set(plan.reprove)
    # The sample's re-proofs run a seeded few of their mutants; a run that
    # records, or re-proves everything or what was named, runs them all.
    spot = 0 if plan.seed is None or proving.record else spot_size()
    for k in chosen:
        name = names[k - 1]
        tests = tuple(carried[k - 1].header.fast_tests)
        reasons = {i: r for (n, i), r in accepted.items() if n == name}
        if k in plan.trusted:
            kept = dict(recorded[name].result)
            entry = PatchMutants(name, tests, [], {}, reasons, recorded=kept)
            result.patches.append(entry)
            tell(f"{name}: {entry.made_count} mutants, from the record")
            continue
        made = patch_mutants(git, commits[k - 1], commits[k])
        if only:
            made = [m for m in made if m.id == only]
        entry = PatchMutants(name, tests, made, {}, reasons)
        if k in again and spot and len(made) > spot and plan.seed is not None:
            entry.spot = frozenset(sample(plan.seed, [m.id for m in made], spot))
            tell(
                f"{name}: spot-checking {spot} of its {len(made)} mutants (seed "
                f"{plan.seed}); its record stands for the others"
            )
        result.patches.append(entry)
        if tests and made:
            tree_id = git.out("rev-parse", f"{commits[k]}^{{tree}}")
            key = mutants_key(project, tree_id, tests, made)
            saved = None if fresh or k in again else load_outcomes(cache, key)
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
    for entry in result.patches:
        if entry.cached:
            tell(f"{entry.name}: {len(entry.made)} mutants, outcomes from the cache")
    if work:
        _run_work(project, prefixes.git, prefixes.root, commits, work, jobs, tell)
    by_name = {p.name: p for p in result.patches}
    check_record(
        result.record, names, recorded, proving,
        {n: p.disagreement for n, p in by_name.items()},
    )  # fmt: skip
    if proving.record and result.ok and not only:
        results = {
            k: by_name[names[k - 1]].record_result()
            for k in chosen
            if k in plan.prove or k in again
        }
        prefixes.record("mutants", result.record, inputs, results)
    result.seconds = time.monotonic() - start
    return result


def _run_work(
    project: Project,
    git: Git,
    root: Path,
    commits: list[str],
    work: list[tuple[int, PatchMutants, str]],
    jobs: int,
    tell: Callable[[str], None],
) -> None:
    """Each patch's mutants in a worker of its own, in a pool of worktrees; a
    complete run with passing unmutated tests is cached under its key."""
    start = time.monotonic()
    cache = project.cache_dir / "mutants"
    lock = threading.Lock()
    finished = [0]
    pool = Worktrees(git, root, min(max(1, jobs), len(work)))
    total = len(work)

    def job(k: int, entry: PatchMutants, key: str) -> None:
        worktree = pool.take()
        ran = [0, 0]  # mutants run, killed

        def heard(row: dict[str, Any]) -> None:
            if row["id"] == "baseline":
                return
            ran[0] += 1
            ran[1] += row["outcome"] != "survived"
            if ran[0] % MUTANT_BATCH == 0 and ran[0] < len(entry.ran):
                tell(
                    f"{entry.name}: {ran[0]}/{len(entry.ran)} mutants run, "
                    f"{ran[1]} killed ({_elapsed(start)})"
                )

        try:
            Git(worktree).run("checkout", "-q", "-f", "--detach", commits[k])
            prime(Git(worktree), project.cache_dir)
            entry.baseline, entry.outcomes, entry.seconds = run_worker(
                project.root, worktree, entry.tests, entry.ran,
                MUTANT_TIMEOUT_FLOOR_S, heard,
            )  # fmt: skip
        finally:
            pool.give(worktree)
        if entry.baseline == "survived" and len(entry.outcomes) == len(entry.made):
            # Only a complete run with passing unmutated tests is remembered.
            store_json(cache, key, {"outcomes": entry.outcomes})
        with lock:
            finished[0] += 1
            of = "" if entry.spot is None else f" of {len(entry.made)}"
            tell(
                f"{entry.name}: {len(entry.ran)}{of} mutants, {entry.killed} killed, "
                f"{len(entry.survivors)} survived in {entry.seconds:.0f}s "
                f"[{finished[0]}/{total} patches, {_elapsed(start)}]"
            )

    # The biggest patches first, so the pool ends together.
    work.sort(key=lambda item: -len(item[1].ran))
    with ThreadPoolExecutor(max_workers=len(pool.free)) as executor:
        for future in [executor.submit(job, *item) for item in work]:
            future.result()


# A progress line after every this many mutants of one patch.
MUTANT_BATCH = 10


def _elapsed(start: float) -> str:
    return f"{time.monotonic() - start:.0f}s elapsed"
