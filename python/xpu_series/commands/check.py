"""check: would the series apply on the pin (or --upstream)? Plus static checks."""

from __future__ import annotations

import argparse

from xpu_series.commands import Context, Output, add_upstream, problems_hint
from xpu_series.result import ExitCode
from xpu_series.stack.build import run_check
from xpu_series.ui import render_report

HELP = "dry run: would the series apply? plus static checks"


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
