"""The XPU kernel package's surface: which `sgl_kernel` names an XPU image has.

The data is `audit/data/sgl-kernel-xpu-api.json` (its provenance is in
`audit/data/README.md`): per ref of sgl-kernel-xpu, the package's modules and the
names its `__init__` exports. The audit judges against the newest ref and says
which. A missing or malformed file is an error that names it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from xpu_series.audit.scan_records import KERNEL_SURFACE, NO_XPU_FORWARD, RawFinding
from xpu_series.errors import UsageError

DEFAULT = Path(__file__).resolve().parent / "data" / "sgl-kernel-xpu-api.json"
PACKAGE = "sgl_kernel"


@dataclass(frozen=True)
class Surface:
    """One ref of sgl-kernel-xpu: its commit, date, modules and exported names."""

    ref: str
    commit: str
    date: str
    modules: frozenset[str]
    exported: frozenset[str]
    source: str  # the file it was read from
    digest: str  # sha256 of that file

    @property
    def short(self) -> str:
        return self.commit[:7]

    def describe(self) -> str:
        return f"sgl-kernel-xpu {self.ref} {self.short} ({self.date})"

    def provides(self, api: str) -> bool:
        """Whether `sgl_kernel.x[.y]` (a module, or a name the package exports)
        exists in this surface."""
        if api == PACKAGE or api in self.modules:
            return True
        parts = api.split(".")
        if len(parts) >= 2 and parts[0] == PACKAGE:
            return parts[1] in self.exported or f"{PACKAGE}.{parts[1]}" in (
                self.modules
            )
        return False

    def to_json(self) -> dict[str, str]:
        return {
            "ref": self.ref,
            "commit": self.commit,
            "date": self.date,
            "source": self.source,
            "sha256": self.digest,
        }


def _bad(path: Path, why: str) -> UsageError:
    return UsageError(
        f"{path}: {why}",
        hint="the surface file is JSON with refs.<ref>.commit, date, modules and "
        "exported (audit/data/README.md); restore it with 'git checkout' or pass "
        "another with --surface FILE",
    )


def load_surface(path: Path = DEFAULT) -> Surface:
    """The newest ref of the surface file at `path`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(
            f"the XPU kernel surface {path} does not exist",
            hint="restore python/xpu_series/audit/data/sgl-kernel-xpu-api.json "
            "(git checkout), or pass one with --surface FILE",
        ) from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise _bad(path, f"not valid JSON ({exc})") from None
    refs = data.get("refs") if isinstance(data, dict) else None
    if not isinstance(refs, dict) or not refs:
        raise _bad(path, "no 'refs' table")
    entries = []
    for ref, entry in refs.items():
        if not isinstance(entry, dict):
            raise _bad(path, f"ref {ref!r} is not a table")
        for key in ("commit", "date"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise _bad(path, f"ref {ref!r} has no {key!r}")
        for key in ("modules", "exported"):
            value = entry.get(key)
            if not isinstance(value, list) or not all(
                isinstance(v, str) for v in value
            ):
                raise _bad(path, f"ref {ref!r}: {key!r} must be a list of names")
        entries.append((entry["date"], ref, entry))
    date, ref, entry = max(entries)
    return Surface(
        ref,
        entry["commit"],
        date,
        frozenset(entry["modules"]),
        frozenset(entry["exported"]),
        str(path),
        hashlib.sha256(raw).hexdigest(),
    )


def judge_kernels(pending: list[RawFinding], surface: Surface) -> list[RawFinding]:
    """Of a module's pending findings, the `kernel-surface` uses the surface lacks
    and the selection chains whose name it exports, with their effect stated
    against the surface's commit."""
    out = []
    newer = f"unless the installed sgl-kernel-xpu is newer than {surface.short}"
    for raw in pending:
        if raw.kind == KERNEL_SURFACE:
            if surface.provides(raw.api):
                continue
            when = (
                "ImportError when the module is imported"
                if raw.function == "<module>"
                else "ImportError or AttributeError where it runs"
            )
            raw = dataclasses.replace(
                raw,
                effect="raises",
                evidence=f"raises {when} {newer}: {surface.describe()} has no "
                f"{raw.api} (its modules and top-level names)",
            )
        elif raw.kind == NO_XPU_FORWARD and raw.api.startswith("select:"):
            name = raw.api.removeprefix("select:")
            if name not in surface.exported:
                continue
            raw = dataclasses.replace(
                raw,
                evidence=f"a platform chain binds {name} {raw.evidence} on other "
                f"devices and None on XPU, although {surface.describe()} exports "
                f"sgl_kernel.{name}: the feature falls back or is off on XPU",
            )
        out.append(raw)
    return out
