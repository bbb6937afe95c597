"""The audit: CUDA-only code on the paths an XPU server runs, with verdicts.

A tree's `.py` files are scanned one by one (audit_scan, cached by path and blob),
the import graph says which modules an XPU server reaches (audit_reach), each API
gets its effect on XPU (audit_effects), triage entries accept findings with a
reason (audit_triage), and a recorded stand-in run marks what executed
(audit_trace). Verdicts, in order: `harmless` (the API behaves on XPU),
`unreached` (the module is never imported by an XPU server), `guarded` (a
condition keeps XPU out), `triaged`, `exposed`. A finding the series fixes is
marked `patched` (on the release as shipped it keeps its verdict; the tree with
the series lists it with the verdict `patched`, where it was).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.audit import guards, scan
from xpu_series.audit.classes import (
    Hierarchy,
    backend_findings,
    callers_elsewhere,
    forward_findings,
    unquiet,
)
from xpu_series.audit.effects import CUDA_ONLY_PACKAGES, ApiEffect, Effect, effect_of
from xpu_series.audit.kinds import FIXES
from xpu_series.audit.reach import (
    blocked_modules,
    device_module,
    reached_modules,
    unimportable,
)
from xpu_series.audit.scan import CUDA_PACKAGE, FileScan, RawFinding, scan_source
from xpu_series.audit.scan_records import XPU_KINDS
from xpu_series.audit.source import TreeFiles
from xpu_series.audit.surface import Surface, judge_kernels, load_surface
from xpu_series.audit.triage import TriageEntry, TriageIndex

FORMAT = "1"
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

    def count(self, attr: str) -> dict[str, int]:
        return dict(Counter(getattr(f, attr) for f in self.findings))

    @property
    def stale(self) -> list[TriageEntry]:
        return [entry for entry, covered in self.triage if covered == 0]

    @property
    def exposed(self) -> list[Finding]:
        """What `--check` fails on: exposed, and not fixed by the series."""
        return [f for f in self.findings if f.verdict == EXPOSED and not f.patched]


# --- scanning, cached by path and blob -------------------------------------


def analyzer_digest() -> str:
    """Changes whenever the scanner's rules do, so cached scans never go stale."""
    h = hashlib.sha256(FORMAT.encode())
    # The rules live in scan.py and its scan_*.py parts: a part added later is
    # hashed too, with nothing to list.
    rules = sorted(Path(scan.__file__ or "").parent.glob("scan*.py"))
    for path in (*rules, Path(guards.__file__ or "")):
        h.update(path.read_bytes())
    h.update(" ".join(sorted(CUDA_ONLY_PACKAGES)).encode())
    return h.hexdigest()


def _write_json(path: Path, data: Any) -> None:
    """Write beside and rename in: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _scan_batch(batch: list[tuple[str, bytes]]) -> list[tuple[str, dict[str, Any]]]:
    packages = CUDA_ONLY_PACKAGES
    return [(path, scan_source(data, path, packages).to_json()) for path, data in batch]


def scan_tree(
    files: TreeFiles, cache: Path, say: Say | None = None, jobs: int | None = None
) -> tuple[dict[str, FileScan], bool]:
    """Each file's scan, by path; True when the whole tree came from the cache."""
    analyzer = analyzer_digest()
    tree_key = hashlib.sha256(f"{analyzer}\0{files.digest()}".encode()).hexdigest()
    tree_cache = cache / "audit" / "trees" / f"{tree_key}.json"
    packed = _read_json(tree_cache)
    if isinstance(packed, dict) and set(packed) == set(files.blobs):
        return {p: FileScan.from_json(d) for p, d in packed.items()}, True

    def file_key(path: str) -> Path:
        key = hashlib.sha256(f"{analyzer}\0{path}\0{files.blobs[path]}".encode())
        digest = key.hexdigest()
        return cache / "audit" / "files" / digest[:2] / f"{digest}.json"

    scans: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    for path in sorted(files.blobs):
        data = _read_json(file_key(path))
        if isinstance(data, dict):
            scans[path] = data
        else:
            missing.append(path)
    if missing:
        scans.update(_scan_missing(files, missing, file_key, say, jobs))
    _write_json(tree_cache, scans)
    return {p: FileScan.from_json(d) for p, d in scans.items()}, False


def _scan_missing(
    files: TreeFiles,
    missing: list[str],
    file_key: Callable[[str], Path],
    say: Say | None,
    jobs: int | None,
) -> dict[str, dict[str, Any]]:
    start = last = time.monotonic()
    out: dict[str, dict[str, Any]] = {}
    # Large files first, so the last batches are small and the workers end together.
    contents = files.read(missing)
    order = sorted(missing, key=lambda p: -len(contents[p]))
    size = 64
    batches = [
        [(p, contents[p]) for p in order[i : i + size]]
        for i in range(0, len(order), size)
    ]
    workers = jobs or min(4, os.cpu_count() or 1)
    if say:
        say(f"audit: scanning {len(missing)} files of {files.label}")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for results in pool.map(_scan_batch, batches):
            for path, data in results:
                out[path] = data
                _write_json(file_key(path), data)
            now = time.monotonic()
            if say and now - last >= 2.0:
                last = now
                say(f"audit: {len(out)}/{len(missing)} files ({now - start:.0f}s)")
    return out


# --- verdicts ---------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A raw finding placed in its file, before triage."""

    file: str
    raw: RawFinding
    reached: bool
    why_unreached: str = ""


def candidates(
    scans: dict[str, FileScan], surface: Surface | None = None
) -> tuple[list[Candidate], int]:
    """Each finding of the tree placed in its file, with its reach; the
    tree-wide rules (class hierarchy, kernel surface, callers across modules)
    add and drop theirs here. Also how many modules an XPU server imports."""
    blocked = blocked_modules(scans)
    reached = reached_modules(scans, blocked=blocked)
    surface = surface or load_surface()
    tree = Hierarchy(scans)
    derived = [backend_findings(scans, tree), forward_findings(scans, tree)]
    taken = callers_elsewhere(scans, reached)
    out = []
    for path, file_scan in sorted(scans.items()):
        device = device_module(file_scan.module)
        why = blocked.get(file_scan.module, "")
        own = bool(unimportable(file_scan))
        found = judge_kernels(file_scan.findings, surface)
        for extra in derived:
            found += extra.get(path, [])
        if path in taken:
            found = unquiet(found, taken[path])
        for raw in found:
            if why and not (own and raw.kind == CUDA_PACKAGE):
                # On XPU importing the module fails before this can run.
                out.append(
                    Candidate(path, raw, False, f"XPU cannot import the module: {why}")
                )
                continue
            if device and not raw.guard:
                # Its module serves another device: it runs when that one does.
                raw = dataclasses.replace(
                    raw, guard=f"a module for {device} (its path says so)"
                )
            out.append(Candidate(path, raw, file_scan.module in reached, ""))
    return out, len(reached)


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
            index = accepted.first_match(cand.file, raw.function, raw.api)
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
    say: Say | None = None,
) -> AuditReport:
    """Audit `files`. With `series_files` (the same release with the series), a
    finding the series removes is `patched`. With `pristine_files` (the same
    release as shipped), the findings the series removed are listed as `patched`
    at their pristine place. With `since_files`, only what is new is kept."""
    start = time.monotonic()
    scans, cached = scan_tree(files, cache, say)
    found, reached = candidates(scans)
    fixed = None
    extra: list[Finding] = []
    if series_files is not None:
        series_found, _ = candidates(scan_tree(series_files, cache, say)[0])
        fixed = fixed_by_series(found, series_found)
    findings, covered = judge(found, triage, fixed, executed)
    if pristine_files is not None:
        pristine_found, _ = candidates(scan_tree(pristine_files, cache, say)[0])
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
    if since_files is not None:
        older, _ = candidates(scan_tree(since_files, cache, say)[0])
        findings = only_new(findings, older)
    return AuditReport(
        label=files.label,
        findings=findings,
        files=len(scans),
        modules=len({s.module for s in scans.values()}),
        reached=reached,
        parse_errors=[(p, s.error) for p, s in sorted(scans.items()) if s.error],
        triage=covered,
        since=since,
        executed_source=executed_source,
        cached=cached,
        seconds=time.monotonic() - start,
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
