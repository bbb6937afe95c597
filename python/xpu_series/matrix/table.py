"""The matrix's rows and verdicts: a patch per row, a release per column, and
what a patch's test counts without and with it say about that release."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import UsageError
from xpu_series.project import Project
from xpu_series.proofs.proof import Counts
from xpu_series.result import TESTS_NEED_PORTING, PatchStatus, Report
from xpu_series.stack.pin import version_tuple
from xpu_series.stack.wheel import index_releases

NEEDED = "needed"
UPSTREAM_HAS_IT = "upstream-has-it"
PORTING = TESTS_NEED_PORTING
UNTESTED = "untested"
ERROR = "error"


@dataclass
class PatchRow:
    """One patch across the releases."""

    name: str
    text: dict[str, str] = field(default_factory=dict)
    behaviour: dict[str, str] = field(default_factory=dict)
    detail: dict[str, str] = field(default_factory=dict)
    no_longer_needed: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "text": self.text,
            "behaviour": self.behaviour,
            "detail": self.detail,
            "no_longer_needed": self.no_longer_needed,
        }


@dataclass
class Matrix:
    """One check report per version, in the order asked, and the per-patch rows."""

    reports: dict[str, Report] = field(default_factory=dict)
    rows_: list[PatchRow] = field(default_factory=list)
    behaviour: bool = False
    # Our own errors (a test run that produced nothing): these fail the run.
    errors: list[str] = field(default_factory=list)
    # Headers that disagree with what the tests measured: information.
    disagreements: list[str] = field(default_factory=list)
    # What to do about the errors, where a command does it.
    hints: list[str] = field(default_factory=list)
    pin: str = ""

    @property
    def versions(self) -> list[str]:
        return list(self.reports)

    def cell(self, row: PatchRow, version: str) -> str:
        text = row.text.get(version, "-")
        if not self.behaviour:
            return text
        return f"{text} / {row.behaviour.get(version, '-')}"

    def rows(self) -> list[list[str]]:
        return [
            [row.name, *(self.cell(row, v) for v in self.versions)]
            for row in self.rows_
        ]

    @property
    def ok(self) -> bool:
        """The pin applies and every test run produced outcomes. A newer release
        that needs work is information, not a failure."""
        pin = self.reports.get(self.pin)
        return (pin is None or pin.ok) and not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "versions": self.versions,
            "pin": self.pin,
            "patches": [row.to_json() for row in self.rows_],
            "reports": {v: r.to_json() for v, r in self.reports.items()},
            "errors": self.errors,
            "hints": self.hints,
            "disagreements": self.disagreements,
            "ok": self.ok,
        }

    def markdown(self) -> str:
        head = ["patch", *self.versions, "no longer needed from"]
        lines = [
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for row in self.rows_:
            gone = row.no_longer_needed
            when = f"{gone['version']} ({gone['why']})" if gone else "-"
            cells = [row.name.removesuffix(".patch")]
            cells += [self.cell(row, v) for v in self.versions] + [when]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def wheel_version(path: Path, project: str) -> str:
    """The release a wheel file name carries.

    >>> wheel_version(Path("sglang-0.5.23-cp311-cp311-x.whl"), "sglang")
    '0.5.23'
    """
    prefix = f"{project}-"
    if not path.name.startswith(prefix) or path.suffix != ".whl":
        raise UsageError(f"{path.name} is not a {project} wheel file name")
    return path.name[len(prefix) :].split("-", 1)[0]


def release_order(version: str) -> tuple[int, ...]:
    """Sort key of releases: by number, what is not X.Y.Z last.

    >>> sorted(["0.5.23", "dev", "0.5.9"], key=release_order)
    ['0.5.9', '0.5.23', 'dev']
    """
    return version_tuple(version) or (10**6,)


def compared_releases(project: Project, asked: list[str]) -> list[str]:
    """The releases a matrix compares: the pin and `asked`, each once, oldest
    first (the served releases, the pin, then the newer ones)."""
    wanted = [project.pin.version]
    wanted += [v for v in dict.fromkeys(asked) if v != project.pin.version]
    return sorted(wanted, key=release_order)


def default_versions(project: Project) -> list[str]:
    """Every release the series serves (from the pin's `serves-from`) and every
    newer one the index lists (plain X.Y.Z releases), oldest first."""
    pin = version_tuple(project.pin.version) or ()
    oldest = version_tuple(project.pin.serves_from) or pin
    return sorted(
        (
            v
            for v in index_releases(project.pin)
            if (t := version_tuple(v)) is not None and t >= oldest and t != pin
        ),
        key=lambda v: version_tuple(v) or (),
    )


def classify(
    without: Counts, with_patch: Counts | None, status: str, has_tests: bool
) -> str:
    """A patch's behaviour on one release from its tests' outcomes.

    >>> classify(Counts(failed=1), Counts(passed=1), "applied", True)
    'needed'
    >>> classify(Counts(passed=2), Counts(passed=2), "applied", True)
    'upstream-has-it'
    >>> classify(Counts(failed=1), Counts(failed=1), "applied", True)
    'tests-need-porting'
    >>> classify(Counts(failed=1), None, "conflict", True)
    'needed'
    """
    if not has_tests:
        return UNTESTED
    if not without.total:
        return ERROR
    if not (without.passed or without.failed or without.errors):
        return UNTESTED  # every test skipped here (their reasons say why)
    if without.passed and not (without.failed or without.errors):
        return UPSTREAM_HAS_IT
    if status == str(PatchStatus.ABSORBED):
        return PORTING  # upstream has the text, yet the tests fail: they moved
    if with_patch is None:
        return NEEDED  # fails without; the patch itself needs rework to apply
    if with_patch.failed or with_patch.errors or not with_patch.passed:
        return PORTING
    return NEEDED
