"""Statuses, exit codes and the report objects every command returns."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class ExitCode(enum.IntEnum):
    """Process exit codes shared by every verb (design.md section 6)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    CONFLICT = 3
    INTEGRITY = 4


class PatchStatus(enum.StrEnum):
    """Per-patch outcome vocabulary (design.md section 5)."""

    APPLIED = "applied"
    MERGED = "merged"
    ABSORBED = "absorbed"
    PARTIAL = "partial"
    CONFLICT = "conflict"
    MISSING = "missing"
    SKIPPED = "skipped"

    @property
    def ok(self) -> bool:
        """Whether the series can go on past a patch with this status."""
        return self in (PatchStatus.APPLIED, PatchStatus.MERGED, PatchStatus.ABSORBED)


@dataclass(frozen=True)
class PatchOutcome:
    """What happened to one patch of the series."""

    name: str
    status: PatchStatus
    concern: str = ""
    files: tuple[str, ...] = ()
    detail: str = ""
    commit: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        data["files"] = list(self.files)
        return data


@dataclass(frozen=True)
class UpstreamInfo:
    """The upstream a command worked against."""

    version: str
    sha256: str
    pinned: bool = True
    source: str = "wheel"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """The result of apply/check: one outcome per patch plus problems found."""

    upstream: UpstreamInfo | None
    patches: list[PatchOutcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tree: str = ""
    head: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.status.ok for p in self.patches)

    @property
    def exit_code(self) -> ExitCode:
        if self.ok:
            return ExitCode.OK
        if any(p.status is PatchStatus.CONFLICT for p in self.patches):
            return ExitCode.CONFLICT
        return ExitCode.FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream.to_json() if self.upstream else None,
            "tree": self.tree,
            "head": self.head,
            "patches": [p.to_json() for p in self.patches],
            "problems": list(self.problems),
            "notes": list(self.notes),
            "ok": self.ok,
        }


# The word verify and matrix both use for tests that fail with the patch applied:
# the tests (or the patch) must be ported to this release.
TESTS_NEED_PORTING = "tests-need-porting"
