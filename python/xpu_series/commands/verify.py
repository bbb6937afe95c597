"""verify: prove each patch's tests fail on the tree without it and pass with it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output, problems_hint
from xpu_series.errors import UsageError
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.proofs.mutant_runs import MutantsResult, run_mutants
from xpu_series.proofs.mutants import ACCEPTED, PatchMutants
from xpu_series.proofs.proof import Counts, PrefixRunner, Run, count
from xpu_series.proofs.record import RECORD_HINT, total_seconds
from xpu_series.proofs.series_proof import (
    MUTANTS_FOLDER,
    Proving,
    RecordCheck,
    check_record,
    select,
    series_prefixes,
)
from xpu_series.result import TESTS_NEED_PORTING, ExitCode, Report
from xpu_series.ui import render_report, table

HELP = "prove each patch's tests fail without it and pass with it"
# Where the record lives, as the user sees it.
RECORD = "patches/proofs.json"


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
    # How long its two test runs took (None: not known, e.g. a trusted record):
    # the record keeps it, for what the sample may cost (record.sample).
    seconds: float | None = None

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
        """What patches/proofs.json keeps of this proof (its seconds are not
        compared: a re-proof agrees on what it counted, not on its time)."""
        kept: dict[str, Any] = {
            "tests": list(self.tests),
            "without": self.without.to_json(),
            "with": self.with_patch.to_json(),
            "verdict": self.verdict,
        }
        if self.seconds is not None:
            kept["seconds"] = round(self.seconds)
        return kept

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


def run_verify(
    project: Project,
    jobs: int = 2,
    patches: list[str] | None = None,
    fresh: bool = False,
    say: Callable[[str], None] | None = None,
    proving: Proving | None = None,
) -> VerifyResult:
    """Apply the series once, then run patch k's tests at prefixes k-1 and k:
    each patch whose record is missing or stale, and the run's sample of the
    unchanged ones (all of them with `proving.everything`)."""
    proving = proving or Proving()
    prefixes = series_prefixes(project)
    result = VerifyResult(apply=prefixes.report)
    if not prefixes.report.ok:
        return result
    names, prefix, tests = prefixes.names, prefixes.commits, prefixes.tests
    chosen = select(names, patches or [])
    prefixes.require_tests(chosen)
    plan, inputs, recorded = prefixes.plan(
        "verify", chosen, bool(patches), proving.everything, proving.seed
    )
    result.record.plan = plan
    if say is not None and plan.describe(names):
        say(plan.describe(names))
    again = set(plan.reprove)
    ran = [k for k in chosen if k in plan.prove or k in again]
    # Patch k's tests run at prefix k-1 (must fail) and prefix k (must pass),
    # each in a pytest run of their own: what a patch's proof measured depends
    # on nothing but its own inputs (the record's key), never on which other
    # patches' tests shared its process. A re-proof never reads the cache.
    at_prefix = [at for k in ran if tests[k - 1] for at in (k - 1, k)]
    labels: dict[tuple[int, int], str] = {}
    runs: dict[str, Run] = {}
    for k in ran:
        for at in (k - 1, k) if tests[k - 1] else ():
            label = f"prefix-{at}"
            if at_prefix.count(at) > 1:
                label += f" for {names[k - 1][:4]}"
            labels[(k, at)] = label
            runs[label] = Run(prefix[at], list(tests[k - 1]), fresh=k in again)
    by_label: dict[str, dict[str, str]] = {}
    took: dict[str, float] = {}
    if runs:
        runner = PrefixRunner(project, prefixes.git, prefixes.root, jobs, fresh, say)
        by_label = runner.run(runs)
        result.logs, took = runner.logs, runner.seconds
    for k in chosen:
        name, spec = names[k - 1], tests[k - 1]
        if k in plan.trusted:
            kept = recorded[name].result
            result.proofs.append(
                PatchProof(
                    name,
                    spec,
                    Counts(**kept["without"]),
                    Counts(**kept["with"]),
                    kept["verdict"],
                    "record",
                )  # fmt: skip
            )
            continue
        source = "re-proven" if k in again else "ran"
        if not spec:
            result.proofs.append(
                PatchProof(name, (), Counts(), Counts(), "untested", source)
            )
            continue
        without = count(by_label.get(labels[(k, k - 1)], {}), spec)
        with_patch = count(by_label.get(labels[(k, k)], {}), spec)
        empty = [
            at for at, counts in ((k - 1, without), (k, with_patch)) if not counts.total
        ]
        if empty:
            # No outcome is not a verdict: pytest crashed, or collected nothing.
            for at in empty:
                result.errors.append(
                    f"{name}: the run at prefix {at} ({_prefix_name(names, at)}) "
                    f"produced no outcome for {', '.join(spec)}; pytest said:\n"
                    f"{_tail(result.logs.get(labels[(k, at)], ''))}"
                )
            verdict = "error"
        else:
            verdict = judge(without, with_patch)
        seconds = total_seconds(took.get(labels[(k, at)]) for at in (k - 1, k))
        result.proofs.append(
            PatchProof(name, spec, without, with_patch, verdict, source, seconds)
        )
    proofs = {p.name: p for p in result.proofs}
    check_record(
        result.record, names, recorded, proving,
        {n: p.disagreement for n, p in proofs.items()},
    )  # fmt: skip
    if proving.record and result.ok:
        results = {k: proofs[names[k - 1]].record_result() for k in ran}
        prefixes.record("verify", result.record, inputs, results)
    return result


def _tail(log: str) -> str:
    return log.strip()[-1500:] or "(nothing)"


def _prefix_name(names: list[str], k: int) -> str:
    return "upstream only" if k == 0 else f"upstream + patches up to {names[k - 1]}"


def _render_mutants(out: Output, result: MutantsResult) -> None:
    rows = [
        [
            p.name,
            str(p.made_count),
            str(p.killed),
            str(p.accepted_count),
            str(len(p.unaccepted)),
            "-" if p.recorded is not None else f"{p.seconds:.0f}s",
            _mutants_source(p, result.record),
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
    head = ["patch", "mutants", "killed", "accepted", "survived", "time", "proof"]
    out.out.append(table([*head, "verdict"], rows))
    for patch in result.patches:
        for mutant in patch.unaccepted:
            out.out.append(f"survived {mutant.id} {mutant.operator}: {mutant.diff}")
            out.out.append(
                f"  reproduce: xpu-series verify --mutants {patch.name[:4]} "
                f"--mutant {mutant.id}"
            )
    out.out.append(f"total {result.seconds:.0f}s")
    if not all(p.ok for p in result.patches):
        out.err.append(
            f"hint: kill each survivor with a test of behaviour, or accept it with a "
            f"reason in {ACCEPTED}"
        )


def _mutants_source(patch: PatchMutants, check: RecordCheck) -> str:
    """record (trusted), re-proven (the sample, or --all), cache or ran."""
    if patch.recorded is not None:
        return "record"
    if patch.spot is not None:
        return f"spot-checked {len(patch.ran)}/{len(patch.made)}"
    if patch.name in check.reproven:
        return "re-proven"
    return "cache" if patch.cached else "ran"


def _render_record(out: Output, check: RecordCheck, verb: str) -> None:
    """What the run did with patches/proofs.json: disagreements (they fail it),
    stale records (they fail it in CI), what it recorded."""
    for line in check.disagreements:
        out.err.append(f"error: {line}")
    if check.disagreements:
        out.err.append(
            "hint: a re-proof must measure what the record says; look at its "
            f"output ('{verb} -v PATCH'), and once the cause is known, "
            f"'{verb} --all --record' writes the record anew"
        )
    if check.stale:
        word = "error" if check.stale_fails else "note"
        out.err.append(
            f"{word}: the record of {len(check.stale)} patch(es) is stale or "
            f"missing, so they were proven in full: {', '.join(check.stale)}"
        )
        out.err.append(f"hint: {RECORD_HINT}")
    if check.recorded:
        shown = ", ".join(n[:4] for n in check.recorded)
        out.err.append(f"recorded {len(check.recorded)} patch(es) in {RECORD}: {shown}")
    if check.moved:
        out.err.append(
            f"note: not recorded, their inputs changed while the run went on: "
            f"{', '.join(check.moved)}"
        )
        out.err.append(f"hint: run '{verb} --record' again")


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
    p.add_argument(
        "--all",
        action="store_true",
        dest="everything",
        help="re-prove every patch, not only those whose record is stale and the "
        "run's sample (also XPU_SERIES_PROVE_ALL=1)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="write what this run proves into patches/proofs.json",
    )


def execute(ctx: Context) -> Output:
    project = ctx.project()
    args = ctx.args
    if args.mutant and not args.mutants:
        raise UsageError("--mutant ID goes with --mutants")
    if args.mutant and args.record:
        raise UsageError(
            "--record goes with whole proofs, not one mutant",
            hint="run 'xpu-series verify --mutants PATCH --record'",
        )
    proving = Proving(everything=args.everything, record=args.record)
    # One run at a time per folder: two runs side by side would check out (or
    # mutate) the same worktrees under each other. Proofs and mutants have a
    # folder each, so one of each can run at once.
    verb = "xpu-series verify" + (" --mutants" if args.mutants else "")
    folder = MUTANTS_FOLDER if args.mutants else "verify"
    with tree_lock(project.build_dir / folder, verb):
        if args.mutants:
            return _mutants_output(
                run_mutants(
                    project,
                    args.jobs,
                    args.patches,
                    args.mutant,
                    args.fresh,
                    ctx.say,
                    proving,
                )  # fmt: skip
            )
        result = run_verify(
            project, args.jobs, args.patches, args.fresh, ctx.say, proving
        )
    return _proof_output(result, args.verbose)


def _mutants_output(mutants: MutantsResult) -> Output:
    out = Output(data=mutants.to_json())
    if not mutants.apply.ok:
        out.out.append(render_report(mutants.apply))
        problems_hint(out, mutants.apply.problems, "verify")
    _render_mutants(out, mutants)
    _render_record(out, mutants.record, "xpu-series verify --mutants")
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
            p.source,
            p.verdict + (" (by errors only)" if p.only_errors else ""),
        ]
        for p in result.proofs
    ]
    head = ["patch", "tests", "without", "with", "proof", "verdict"]
    out.out.append(table(head, rows))
    for error in result.errors:
        out.err.append(f"error: {error}")
    _render_record(out, result.record, "xpu-series verify")
    if verbose:
        for key, log in sorted(result.logs.items()):
            out.out.append(f"--- {key}\n{log}")
    elif not result.ok:
        out.err.append("hint: re-run with -v to see the pytest output of each prefix")
    out.code = ExitCode.OK if result.ok else ExitCode.FAILED
    return out
