"""The committed record of the matrix on the served releases below the pin
(patches/matrix-record.json): per release and patch, its test counts without and
with it, keyed by everything they depend on, and trusted as proofs are.

A cell is keyed like a patch's proof (proofs/record.py: the patch, the patches
below it, what its tests read, the pin, the two trees, the proof code, the tool
and the environment), plus the release and the patch's status there. A cell with
no record, or whose key changed, is measured; an unchanged one is trusted unless
the run's seeded sample picks it, and a re-measured cell that disagrees with its
record fails the run. `XPU_SERIES_PROVE_ALL=1` measures every cell. On the pin,
the carried patches' cells come from verify's record instead, and only the cells
verify does not prove (retired patches' tests on the release that absorbed them)
are kept here; releases newer than the pin are always measured (they are
information, and new ones appear on the index).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import SeriesError
from xpu_series.proofs.proof import Counts
from xpu_series.proofs.record import (
    PatchInputs,
    Recorded,
    SeriesFacts,
    as_seconds,
    patch_inputs,
)

RECORD = "matrix-record.json"  # in patches/
FORMAT = 1
RECORD_HINT = (
    f"run 'xpu-series matrix --behaviour --record', then commit patches/{RECORD}"
)


@dataclass(frozen=True)
class Cell:
    """What one patch's tests counted on one release (`with_patch` is None
    where the patch does not apply there)."""

    status: str
    without: Counts
    with_patch: Counts | None
    # How long the runs of its commits took when measured (None: not known):
    # what re-measuring it costs the sample (proofs/record.py: sample). Never
    # compared: a re-measured cell agrees on what it counted, not on its time.
    seconds: float | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        kept: dict[str, Any] = {
            "status": self.status,
            "without": self.without.to_json(),
            "with": None if self.with_patch is None else self.with_patch.to_json(),
        }
        if self.seconds is not None:
            kept["seconds"] = round(self.seconds)
        return kept

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cell:
        kept = data.get("with")
        return cls(
            status=str(data["status"]),
            without=Counts(**data["without"]),
            with_patch=None if kept is None else Counts(**kept),
            seconds=as_seconds(data.get("seconds")),
        )


def cell_label(release: str, patch: str) -> str:
    """How a cell is named in the log and in the sample.

    >>> cell_label("0.5.20", "0003-device-memory-probes.patch")
    '0.5.20 0003-device-memory-probes.patch'
    """
    return f"{release} {patch}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def matrix_code() -> list[Path]:
    """The code that measures a cell and keeps it, beside the proof code."""
    here = Path(__file__).resolve().parent
    return [here / "behaviour.py", here / "record.py"]


def cell_inputs(facts: SeriesFacts, k: int, release: str, status: str) -> PatchInputs:
    """The key of patch k (1-based) on `release`: its proof inputs there, the
    release and its status, and the matrix's own code."""
    digests = dict(patch_inputs(facts, k).digests)
    digests["release"] = _digest(release)
    digests["status"] = _digest(status)
    code = hashlib.sha256()
    for path in matrix_code():
        code.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digests["matrix-code"] = code.hexdigest()
    return PatchInputs(digests)


def record_path(patches_dir: Path) -> Path:
    return patches_dir / RECORD


def load_cells(patches_dir: Path) -> dict[str, Recorded] | None:
    """Cell label -> its record; None when the series keeps no matrix record
    (every cell is then measured, every run)."""
    path = record_path(patches_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SeriesError(
            f"{path} is not valid JSON: {exc}", hint=RECORD_HINT
        ) from None
    if data.get("format") != FORMAT:
        return {}  # another format: nothing in it is trusted
    out: dict[str, Recorded] = {}
    for release, cells in (data.get("releases") or {}).items():
        for patch, kept in (cells or {}).items():
            if isinstance(kept, dict) and "inputs" in kept and "result" in kept:
                out[cell_label(release, patch)] = Recorded(
                    kept["inputs"], kept["result"]
                )
    return out


def save_cells(
    patches_dir: Path, measured: Mapping[str, Mapping[str, Recorded]]
) -> Path:
    """Write each release of `measured` (release -> patch -> record) whole,
    keep the releases not in it, and replace the file in one rename."""
    path = record_path(patches_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    releases = dict(data.get("releases") or {}) if data.get("format") == FORMAT else {}
    for release, cells in measured.items():
        releases[release] = {
            patch: {"inputs": dict(sorted(r.inputs.items())), "result": r.result}
            for patch, r in sorted(cells.items())
        }
    text = json.dumps(
        {
            "format": FORMAT,
            "about": "the behavioural matrix on the served releases below the "
            "pin; 'xpu-series matrix --behaviour --record' writes it",
            "releases": dict(sorted(releases.items())),
        },
        indent=1,
        sort_keys=True,
    )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
