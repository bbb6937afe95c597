"""matrix: the status of every patch on several upstream releases, side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands.check import run_check
from xpu_series.errors import UsageError
from xpu_series.project import Project
from xpu_series.result import Report


@dataclass
class Matrix:
    """One check report per version, in the order asked."""

    reports: dict[str, Report] = field(default_factory=dict)

    def rows(self) -> list[list[str]]:
        versions = list(self.reports)
        names = [p.name for p in next(iter(self.reports.values())).patches]
        table = []
        for index, name in enumerate(names):
            row = [name]
            for version in versions:
                patches = self.reports[version].patches
                row.append(str(patches[index].status) if index < len(patches) else "-")
            table.append(row)
        return table

    def to_json(self) -> dict[str, Any]:
        return {
            "versions": {v: r.to_json() for v, r in self.reports.items()},
            "ok": all(r.ok for r in self.reports.values()),
        }


def wheel_version(path: Path, project: str) -> str:
    """The release a wheel file name carries.

    >>> wheel_version(Path("sglang-0.5.23-cp311-cp311-x.whl"), "sglang")
    '0.5.23'
    """
    prefix = f"{project}-"
    if not path.name.startswith(prefix) or path.suffix != ".whl":
        raise UsageError(f"{path.name} is not a {project} wheel file name")
    return path.name[len(prefix) :].split("-", 1)[0]


def run_matrix(
    project: Project, versions: list[str], wheels: list[Path], progress: bool = False
) -> Matrix:
    """`check` on the pin and on each version or local wheel; not the user's tree."""
    by_version = {wheel_version(w, project.pin.project): w for w in wheels}
    wanted = [project.pin.version]
    for version in [*versions, *by_version]:
        if version not in wanted:
            wanted.append(version)
    matrix = Matrix()
    for version in wanted:
        matrix.reports[version] = run_check(
            project, version, by_version.get(version), progress
        )
    return matrix
