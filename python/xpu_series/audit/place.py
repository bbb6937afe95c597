"""A tree's findings placed in their files: reach, the tree-wide rules, and the
module-level guards (another device's module, a module XPU cannot import).

`place_tree` is what every audit asks for, per tree: cached by the rules, the
kernel surface and the tree's content (audit/cache.py), so a warm audit reads one
record and never the scans.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xpu_series.audit.cache import (
    Candidate,
    Placed,
    Say,
    placed_key,
    read_json,
    scan_tree,
    write_json,
)
from xpu_series.audit.classes import (
    Hierarchy,
    backend_findings,
    callers_elsewhere,
    forward_findings,
    unquiet,
)
from xpu_series.audit.reach import (
    blocked_modules,
    device_module,
    reached_modules,
    unimportable,
)
from xpu_series.audit.scan import FileScan
from xpu_series.audit.scan_records import CUDA_PACKAGE
from xpu_series.audit.source import TreeFiles
from xpu_series.audit.surface import Surface, judge_kernels, load_surface


def candidates(
    scans: dict[str, FileScan], surface: Surface | None = None
) -> tuple[list[Candidate], int]:
    """Each finding of the tree placed in its file, with its reach; the tree-wide
    rules (class hierarchy, kernel surface, callers across modules) add and drop
    theirs here. Also how many modules an XPU server imports."""
    blocked = blocked_modules(scans)
    reached = reached_modules(scans, blocked=blocked)
    surface = surface or load_surface()
    tree = Hierarchy(scans)
    derived = [backend_findings(scans, tree), forward_findings(scans, tree)]
    users = {m for m in reached if not device_module(m)}
    taken = callers_elsewhere(scans, users)
    out = []
    for path, file_scan in sorted(scans.items()):
        device = device_module(file_scan.module)
        why = blocked.get(file_scan.module, "")
        own = bool(unimportable(file_scan))
        found = file_scan.findings + judge_kernels(file_scan.pending, surface)
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


def place_tree(
    files: TreeFiles,
    cache: Path,
    surface: Surface,
    say: Say | None = None,
    jobs: int | None = None,
) -> Placed:
    """The placed findings of `files`, from the cache when nothing changed."""
    key = placed_key(files, surface.digest, cache)
    data = read_json(key)
    if isinstance(data, dict):
        try:
            return Placed.from_json(data)
        except (KeyError, TypeError, ValueError):
            pass  # a record of an older shape: place again
    scans, _cached = scan_tree(files, cache, say, jobs)
    found, reached = candidates(scans, surface)
    placed = Placed(
        found,
        files=len(scans),
        modules=len({s.module for s in scans.values()}),
        reached=reached,
        parse_errors=[(p, s.error) for p, s in sorted(scans.items()) if s.error],
    )
    write_json(key, placed.to_json())
    return placed
