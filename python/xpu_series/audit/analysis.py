"""The audit: XPU hazards on the paths an XPU server runs, with verdicts.

A tree's `.py` files are scanned one by one (scan*.py, cached by path and blob),
the import graph says which modules an XPU server reaches (reach.py), the
tree-wide rules add what only the whole tree shows (classes.py, surface.py;
place.py puts every finding in its file, cached per tree), each finding gets its
effect on XPU (effects.py, or its own evidence), triage entries accept findings
with a reason (triage.py), and a recorded stand-in run marks what executed
(trace.py). Verdicts, in order: `harmless` (the API behaves on XPU), `unreached`
(the module is never imported by an XPU server), `guarded` (a condition keeps XPU
out), `triaged`, `exposed`. A finding the series fixes is marked `patched` (on
the release as shipped it keeps its verdict; the tree with the series lists it
with the verdict `patched`, where it was).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.audit.cache import Candidate
from xpu_series.audit.effects import ApiEffect, Effect, effect_of
from xpu_series.audit.kinds import FIXES
from xpu_series.audit.ledger import LedgerCheck
from xpu_series.audit.place import candidates, place_tree
from xpu_series.audit.scan import RawFinding
from xpu_series.audit.scan_records import KINDS, XPU_KINDS
from xpu_series.audit.source import TreeFiles
from xpu_series.audit.surface import Surface, load_surface
from xpu_series.audit.triage import TriageEntry, TriageIndex

__all__ = ["Candidate", "candidates"]  # placed findings, re-exported

EXPOSED, TRIAGED, PATCHED, GUARDED, UNREACHED, HARMLESS = (
    "exposed",
    "triaged",
    "patched",
    "guarded",
    "unreached",
    "harmless",
)
VERDICTS = (EXPOSED, TRIAGED, PATCHED, GUARDED, UNREACHED, HARMLESS)
Say = Callable[[str], None]


@dataclass(frozen=True)
class Finding:
    """One use of a CUDA-only API, with what it does on XPU and why it stands."""

    file: str
    line: int
    function: str
    api: str
    kind: str
    effect: str
    verdict: str
    reason: str  # the guard, the triage reason, or what the series did
    executed: bool
    replacement: str
    what: str
    occurrence: int = 0  # n-th finding of this file + function + api (0-based)
    # The series fixes it: on the release as shipped it keeps its verdict; on the
    # tree with the series it is listed with the verdict `patched`, at its
    # pristine place.
    patched: bool = False

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.file, self.function, self.api)

    def fingerprint(self) -> str:
        """Stable across moved lines: file, function, API and occurrence."""
        text = "\0".join((*self.identity, str(self.occurrence)))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies, a third of a warm --json run.
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["fingerprint"] = self.fingerprint()
        return data


@dataclass
class AuditReport:
    """Everything one audit found, for the text, JSON, Markdown and SARIF views."""

    label: str
    findings: list[Finding]
    files: int
    modules: int
    reached: int
    parse_errors: list[tuple[str, str]] = field(default_factory=list)
    triage: list[tuple[TriageEntry, int]] = field(default_factory=list)
    since: str = ""
    executed_source: str = ""
    cached: bool = False
    seconds: float = 0.0
    surface: Surface | None = None
    ledger: LedgerCheck | None = None
    # Findings the series adds (not in the release as shipped) that a person
    # should see even when triaged: neither guarded, unreached nor harmless.
    introduced: list[Finding] = field(default_factory=list)

    def count(self, attr: str) -> dict[str, int]:
        return dict(Counter(getattr(f, attr) for f in self.findings))

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Per finding kind (each listed, in rule order), its verdicts."""
        out: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        for f in self.findings:
            verdicts = out.setdefault(f.kind, {})
            verdicts[f.verdict] = verdicts.get(f.verdict, 0) + 1
        return out

    @property
    def stale(self) -> list[TriageEntry]:
        return [entry for entry, covered in self.triage if covered == 0]

    @property
    def exposed(self) -> list[Finding]:
        """What `--check` fails on: exposed, and not fixed by the series."""
        return [f for f in self.findings if f.verdict == EXPOSED and not f.patched]


def effect_of_finding(raw: RawFinding) -> ApiEffect:
    """The effect of a raw finding: its own (the kinds beyond the CUDA calls say
    it per place, with its evidence), else the API's row."""
    if raw.kind in XPU_KINDS:
        return ApiEffect(
            raw.api, Effect(raw.effect), raw.evidence, FIXES.get(raw.kind, "")
        )
    info = effect_of(raw.api)
    if raw.effect and raw.effect != info.effect:
        # An assert that fails on XPU raises before the API does anything.
        return ApiEffect(
            raw.api,
            Effect(raw.effect),
            f"{raw.evidence}; {info.what}",
            info.replacement,
        )
    return info


def _live(candidate: Candidate) -> bool:
    """Reached, unguarded, and not an API that behaves on XPU."""
    effect = effect_of_finding(candidate.raw).effect
    return candidate.reached and not candidate.raw.guard and effect != Effect.HARMLESS


def _identities(items: Iterable[Candidate]) -> Counter[tuple[str, str, str]]:
    return Counter((c.file, c.raw.function, c.raw.api) for c in items)


def judge(
    found: list[Candidate],
    triage: list[TriageEntry],
    fixed_by_series: Counter[tuple[str, str, str]] | None = None,
    executed: set[tuple[str, int, str]] | None = None,
) -> tuple[list[Finding], list[tuple[TriageEntry, int]]]:
    """Each candidate's verdict; how many findings each triage entry covers."""
    covered = dict.fromkeys(range(len(triage)), 0)
    accepted = TriageIndex(triage)
    fixed = Counter(fixed_by_series or {})
    seen: Counter[tuple[str, str, str]] = Counter()
    findings: list[Finding] = []
    for cand in found:
        raw = cand.raw
        identity = (cand.file, raw.function, raw.api)
        occurrence = seen[identity]
        seen[identity] += 1
        info = effect_of_finding(raw)
        if info.effect == Effect.HARMLESS:
            verdict, reason = HARMLESS, info.what
        elif not cand.reached:
            verdict = UNREACHED
            reason = cand.why_unreached or (
                "no import path from an XPU server's entry points reaches it"
            )
        elif raw.guard:
            verdict, reason = GUARDED, raw.guard
        else:
            verdict, reason = EXPOSED, ""
            index = accepted.first_match(cand.file, raw.function, raw.api, raw.kind)
            if index is not None:
                covered[index] += 1
                verdict, reason = TRIAGED, triage[index].reason
        # Upstream's code still has it (verdict stands); the series fixes it.
        patched = verdict in (EXPOSED, TRIAGED) and fixed[identity] > 0
        if patched:
            fixed[identity] -= 1
            reason = reason or "the series fixes it"
        findings.append(
            Finding(
                file=cand.file,
                line=raw.line,
                function=raw.function,
                api=raw.api,
                kind=raw.kind,
                effect=str(info.effect),
                verdict=verdict,
                reason=reason,
                executed=(cand.file, raw.line, raw.api) in (executed or set()),
                replacement=info.replacement,
                what=info.what,
                occurrence=occurrence,
                patched=patched,
            )
        )
    return findings, [(entry, covered[i]) for i, entry in enumerate(triage)]


def fixed_by_series(
    pristine: list[Candidate], patched: list[Candidate]
) -> Counter[tuple[str, str, str]]:
    """How many live findings per identity the series removes (or guards)."""
    before = _identities(c for c in pristine if _live(c))
    after = _identities(c for c in patched if _live(c))
    return before - after


def only_new(findings: list[Finding], older: Iterable[Candidate]) -> list[Finding]:
    """The findings beyond what release `older` had, per file + function + API."""
    budget = _identities(older)
    out = []
    for finding in findings:
        if budget[finding.identity] > 0:
            budget[finding.identity] -= 1
        else:
            out.append(finding)
    return out


def run_audit(
    files: TreeFiles,
    cache: Path,
    triage: list[TriageEntry],
    *,
    series_files: TreeFiles | None = None,
    pristine_files: TreeFiles | None = None,
    since_files: TreeFiles | None = None,
    since: str = "",
    executed: set[tuple[str, int, str]] | None = None,
    executed_source: str = "",
    surface: Surface | None = None,
    ledger: Callable[[list[Finding]], LedgerCheck] | None = None,
    say: Say | None = None,
) -> AuditReport:
    """Audit `files`. With `series_files` (the same release with the series), a
    finding the series removes is `patched`. With `pristine_files` (the same
    release as shipped), the findings the series removed are listed as `patched`
    at their pristine place. With `since_files`, only what is new is kept.
    `ledger` re-checks the upstream reports' locators against the findings."""
    start = time.monotonic()
    surface = surface or load_surface()
    placed = place_tree(files, cache, surface, say)
    found = placed.candidates
    fixed = None
    extra: list[Finding] = []
    if series_files is not None:
        series_found = place_tree(series_files, cache, surface, say).candidates
        fixed = fixed_by_series(found, series_found)
    findings, covered = judge(found, triage, fixed, executed)
    introduced: list[Finding] = []
    if pristine_files is not None:
        pristine_found = place_tree(pristine_files, cache, surface, say).candidates
        introduced = [
            f
            for f in only_new(findings, pristine_found)
            if f.verdict in (EXPOSED, TRIAGED)
        ]
        gone = fixed_by_series(pristine_found, found)
        extra, _ = judge(
            [c for c in pristine_found if _live(c)], [], Counter(gone), None
        )
        extra = [
            dataclasses.replace(f, verdict=PATCHED, reason="the series fixes it")
            for f in extra
            if f.patched
        ]
    findings += extra
    checked = ledger(findings) if ledger is not None else None
    if since_files is not None:
        older = place_tree(since_files, cache, surface, say).candidates
        findings = only_new(findings, older)
    return AuditReport(
        label=files.label,
        findings=findings,
        files=placed.files,
        modules=placed.modules,
        reached=placed.reached,
        parse_errors=placed.parse_errors,
        triage=covered,
        since=since,
        executed_source=executed_source,
        cached=placed.cached,
        seconds=time.monotonic() - start,
        surface=surface,
        ledger=checked,
        introduced=introduced,
    )


ORDER = {v: i for i, v in enumerate(VERDICTS)}


def grouped(findings: Iterable[Finding]) -> list[tuple[tuple[str, str], list[Finding]]]:
    """Findings by concern (file and function), exposed concerns first."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.file, f.function), []).append(f)
    return sorted(
        groups.items(),
        key=lambda kv: (min(ORDER[f.verdict] for f in kv[1]), kv[0]),
    )
