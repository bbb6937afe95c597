"""check: would the series apply on the pin (or --upstream)? Plus static checks."""

from __future__ import annotations

from pathlib import Path

from xpu_series.commands.apply import ApplyOptions, run_apply
from xpu_series.project import Project
from xpu_series.result import Report


def scratch_tree(project: Project, version: str) -> Path:
    return project.build_dir / "check" / version


def run_check(
    project: Project,
    version: str | None = None,
    wheel: Path | None = None,
    progress: bool = False,
) -> Report:
    """Apply the series into a scratch tree under build/check/; the user's tree is
    never touched. Static problems are reported without applying anything."""
    version = version or project.pin.version
    options = ApplyOptions(
        tree=scratch_tree(project, version),
        version=version,
        wheel=wheel,
        scratch=True,  # the scratch tree is ours: nothing in it is a user's edit
        progress=progress,
    )
    return run_apply(project, options)
