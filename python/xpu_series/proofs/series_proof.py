"""A series' proofs on its prefixes: the series applied once (commit k is
upstream plus patches 1..k), which patches a run names, and how a run stands to
the committed record of each patch's last full proof (record.py); shared by
`verify` and `verify --mutants`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.proofs.mutants import load_accepted
from xpu_series.proofs.record import (
    PatchInputs,
    ProofPlan,
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
    save_record,
)
from xpu_series.result import Report
from xpu_series.stack.build import ScratchRequest, build_scratch
from xpu_series.stack.tree import UPSTREAM_TAG


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

    def facts(self) -> SeriesFacts:
        """What each patch's record key is computed from, read now. A patch
        added on top since the run began changes nothing below it; any other
        change to patches/series is SeriesChanged."""
        series = self.project.series().patches
        if [p.name for p in series][: len(self.names)] != self.names:
            raise SeriesChanged
        series = series[: len(self.names)]
        trees = self.git.out(
            "rev-parse", *(f"{c}^{{tree}}" for c in self.commits)
        ).split()
        accepted: dict[str, dict[str, str]] = {}
        for (name, mutant), reason in load_accepted(self.project.root).items():
            accepted.setdefault(name, {})[mutant] = reason
        return SeriesFacts(
            root=self.project.root,
            names=self.names,
            files=[p.path for p in series],
            tests=[
                tuple(dict.fromkeys([*p.header.tests, *p.header.fast_tests]))
                for p in series
            ],
            trees=trees,
            accepted=accepted,
            pin=self.project.patches_dir / "upstream.toml",
        )

    def plan(
        self,
        part: str,
        chosen: list[int],
        named: bool,
        everything: bool,
        seed: int | None,
    ) -> tuple[ProofPlan, dict[int, PatchInputs], dict[str, Recorded]]:
        """Which of `chosen` this run proves, re-proves or takes from the record
        (see record.py), each patch's inputs, and the record's `part`."""
        recorded = load_record(self.project.patches_dir, part)
        facts = self.facts()
        inputs = {k: patch_inputs(facts, k) for k in chosen}
        everything = everything or prove_all_asked()
        # What a re-proof costs is what its verify runs took, for the mutants
        # too: both parts pick the same patches for the same seed.
        timed = (
            recorded
            if part == "verify"
            else load_record(self.project.patches_dir, "verify")
        )
        plan = plan_proofs(
            self.names, chosen, named, inputs, recorded, everything, seed,
            sample_size(), costs=recorded_seconds(timed), budget=budget_s(),
        )  # fmt: skip
        return plan, inputs, recorded or {}

    def record(
        self,
        part: str,
        check: RecordCheck,
        inputs: dict[int, PatchInputs],
        results: dict[int, dict[str, Any]],
    ) -> None:
        """Write `results` (patch k -> what its full proof found) into the
        record's `part`: each keyed by the inputs the run began with, and only
        where they are still those (a file edited while the tests ran would key
        the record by content the proof never saw)."""
        try:
            now = self.facts()
        except SeriesChanged:
            check.moved = [self.names[k - 1] for k in results]
            return
        proven: dict[str, Recorded] = {}
        for k, result in results.items():
            name = self.names[k - 1]
            if patch_inputs(now, k).key != inputs[k].key:
                check.moved.append(name)
                continue
            proven[name] = Recorded(dict(inputs[k].digests), result)
        # Pruned to the series as it is now (a patch added meanwhile keeps its).
        names = [p.name for p in self.project.series().patches]
        save_record(self.project.patches_dir, part, names, proven)
        check.recorded = sorted(proven)


class SeriesChanged(XpuSeriesError):
    """patches/series lists other patches than when the run began."""

    def __init__(self) -> None:
        super().__init__(
            "patches/series changed while the run went on",
            hint="run it again once the series stands still",
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


@dataclass(frozen=True)
class Proving:
    """How a proof run treats the record: every patch (`everything`), the
    sample's seed, and whether it writes what it proves (`record`)."""

    everything: bool = False
    record: bool = False
    seed: int | None = None


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
    reproven: list[str] = field(default_factory=list)  # names of the sample
    # Proven, yet not recorded: their inputs changed while the run went on.
    moved: list[str] = field(default_factory=list)

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
            "not_recorded": self.moved,
        }


def check_record(
    check: RecordCheck,
    names: list[str],
    recorded: dict[str, Recorded],
    proving: Proving,
    differs: dict[str, Callable[[dict[str, Any]], str]],
) -> None:
    """Compare each re-proof with its record (a disagreement fails the run,
    unless the run records anew), and list the records this run found stale."""
    plan = check.plan
    check.reproven = [names[k - 1] for k in plan.reprove]
    for k in plan.reprove:
        name = names[k - 1]
        why = differs[name](dict(recorded[name].result))
        if why and not proving.record:
            check.disagreements.append(
                f"{name}: the re-proof disagrees with its record: {why}"
            )
    if plan.keeping:
        check.stale = [f"{names[k - 1]} ({why})" for k, why in plan.prove.items()]
        check.stale_fails = in_ci() and not proving.record
