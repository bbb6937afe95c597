"""check: would the series apply on the pin (or --upstream)? Plus static checks."""

from __future__ import annotations

import argparse
from pathlib import Path

from xpu_series.commands import Context, Output, add_upstream, problems_hint
from xpu_series.commands.apply import ApplyOptions, run_apply
from xpu_series.project import Project
from xpu_series.result import ExitCode, Report
from xpu_series.stack.series import (
    dropped_test_problems,
    format_problems,
    metadata_problems,
    test_problems,
)
from xpu_series.ui import render_report

HELP = "dry run: would the series apply? plus static checks"


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
    report = run_apply(project, options)
    assert isinstance(report, Report)  # a scratch tree always gives a report
    series = project.series(version)
    # What apply can live with but a reviewer should not: a series file that
    # needs normalising, Tests: that name nothing.
    report.problems += (
        format_problems(series)
        + test_problems(series, project.root)
        + dropped_test_problems(series, project.root)
        + metadata_problems(series, project.pin.version)
    )
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_upstream(p)


def execute(ctx: Context) -> Output:
    project = ctx.project()
    report = run_check(project, ctx.args.upstream, ctx.path("wheel"), ctx.progress)
    out = Output(data=report.to_json())
    out.out.append(render_report(report))
    problems_hint(out, report.problems, "check")
    out.out.append(
        "ok: the series applies" if report.ok else "the series does not apply"
    )
    # check is a dry run: nothing waits for a human, so a conflict is a plain failure.
    out.code = ExitCode.OK if report.ok else ExitCode.FAILED
    return out
