"""The audit's caches: each file's scan by (rules, path, blob), a tree's scans by the
set of those, and a tree's placed findings by (rules, surface, tree).

A cold audit parses every file once, in a process pool, largest first; blobs that
two releases (or a release and its series) share are scanned once. A warm audit
reads one small record per tree: the findings placed in their files, with their
reach, after the tree-wide rules; the scans themselves are read only when those
rules change.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.audit import guards, scan
from xpu_series.audit.effects import CUDA_ONLY_PACKAGES
from xpu_series.audit.scan import FileScan, RawFinding, scan_source
from xpu_series.audit.source import TreeFiles

FORMAT = "2"
Say = Callable[[str], None]
_SEEN: dict[Path, dict[str, Any]] = {}  # this process's scans, by cache key
_HERE = Path(__file__).resolve().parent
# The tree-wide rules: a change to one of these re-places every finding (the
# per-file scans stay valid).
_TREE_RULES = ("classes.py", "surface.py", "reach.py", "place.py", "cache.py")


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


def rules_digest(surface_digest: str) -> str:
    """The scanner's rules, the tree-wide rules and the kernel surface."""
    h = hashlib.sha256(analyzer_digest().encode())
    for name in _TREE_RULES:
        h.update((_HERE / name).read_bytes())
    h.update(surface_digest.encode())
    return h.hexdigest()


def write_json(path: Path, data: Any) -> None:
    """Write beside and rename in: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
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
    packed = read_json(tree_cache)
    if isinstance(packed, dict) and set(packed) == set(files.blobs):
        return {p: FileScan.from_json(d) for p, d in packed.items()}, True

    def file_key(path: str) -> Path:
        key = hashlib.sha256(f"{analyzer}\0{path}\0{files.blobs[path]}".encode())
        digest = key.hexdigest()
        return cache / "audit" / "files" / digest[:2] / f"{digest}.json"

    scans: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    for path in sorted(files.blobs):
        key = file_key(path)
        data = _SEEN.get(key) or read_json(key)
        if isinstance(data, dict):
            scans[path] = data
        else:
            missing.append(path)
    if missing:
        scans.update(_scan_missing(files, missing, file_key, say, jobs))
    for path, data in scans.items():
        # The release as shipped and with the series share most blobs: the
        # second tree of a run takes them from here, not from disk.
        _SEEN[file_key(path)] = data
    write_json(tree_cache, scans)
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
    if len(batches) == 1:
        results = [_scan_batch(batches[0])]  # a pool costs more than one batch
        return _store(results, file_key, out)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for results in pool.map(_scan_batch, batches):
            _store([results], file_key, out)
            now = time.monotonic()
            if say and now - last >= 2.0:
                last = now
                say(f"audit: {len(out)}/{len(missing)} files ({now - start:.0f}s)")
    return out


def _store(
    results: list[list[tuple[str, dict[str, Any]]]],
    file_key: Callable[[str], Path],
    out: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    for batch in results:
        for path, data in batch:
            out[path] = data
            write_json(file_key(path), data)
    return out


@dataclass(frozen=True)
class Candidate:
    """A raw finding placed in its file, before triage."""

    file: str
    raw: RawFinding
    reached: bool
    why_unreached: str = ""


@dataclass
class Placed:
    """A tree's findings placed in their files, and what the report says of it."""

    candidates: list[Candidate]
    files: int
    modules: int
    reached: int
    parse_errors: list[tuple[str, str]] = field(default_factory=list)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "candidates": [
                [c.file, _raw_row(c.raw), c.reached, c.why_unreached]
                for c in self.candidates
            ],
            "files": self.files,
            "modules": self.modules,
            "reached": self.reached,
            "parse_errors": self.parse_errors,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Placed:
        return cls(
            [
                Candidate(file, RawFinding(*raw), reached, why)
                for file, raw, reached, why in data["candidates"]
            ],
            data["files"],
            data["modules"],
            data["reached"],
            [(p, e) for p, e in data["parse_errors"]],
            cached=True,
        )


def _raw_row(raw: RawFinding) -> list[Any]:
    return list(asdict(raw).values())


def placed_key(files: TreeFiles, surface_digest: str, cache: Path) -> Path:
    key = hashlib.sha256(
        f"{rules_digest(surface_digest)}\0{files.digest()}".encode()
    ).hexdigest()
    return cache / "audit" / "placed" / f"{key}.json"
