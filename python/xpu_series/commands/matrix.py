"""matrix: the status of every patch on several upstream releases, side by side."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output
from xpu_series.commands.check import run_check
from xpu_series.errors import UsageError
from xpu_series.project import Project
from xpu_series.result import ExitCode, Report
from xpu_series.ui import table

HELP = "status of every patch on several upstream releases"


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

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "versions": {v: r.to_json() for v, r in self.reports.items()},
            "ok": self.ok,
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("versions", nargs="*", metavar="VERSION", help="e.g. 0.5.20 0.5.23")
    p.add_argument(
        "--wheel",
        action="append",
        metavar="PATH",
        help="a local wheel (its version comes from the file name); repeatable",
    )


def execute(ctx: Context) -> Output:
    project = ctx.project()
    wheels = [Path(w) for w in ctx.args.wheel or []]
    matrix = run_matrix(project, ctx.args.versions, wheels, ctx.progress)
    out = Output(data=matrix.to_json())
    out.out.append(table(["patch", *matrix.reports], matrix.rows()))
    for version, report in matrix.reports.items():
        out.err += [f"error: {version}: {p}" for p in report.problems]
    # Exit code and "ok" agree: 1 when any release needs work on the series.
    out.code = ExitCode.OK if matrix.ok else ExitCode.FAILED
    return out
