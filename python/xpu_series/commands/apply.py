"""apply: materialize the pinned upstream as a git tree and commit each patch on it
(the work is stack.build's; this verb parses, renders and links .venv)."""

from __future__ import annotations

import argparse
from pathlib import Path

from xpu_series.commands import (
    Context,
    Output,
    add_operation_flags,
    add_tree,
    add_upstream,
    problems_hint,
    progress_hook,
    render_stop,
)
from xpu_series.errors import UsageError
from xpu_series.lock import tree_lock
from xpu_series.result import ExitCode, Report
from xpu_series.stack.build import TreeRequest, build_tree, finish_apply, link_venv
from xpu_series.stack.sequencer import (
    Outcome,
    Runner,
    abort_operation,
    open_operation,
    resume,
)
from xpu_series.ui import render_report

HELP = "build the tree: upstream commit + one commit per patch"


def _report_of(result: Report | Outcome) -> Report:
    return result if isinstance(result, Report) else result.report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_tree(p)
    add_upstream(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="reset a tree with local edits (they are stashed or branched, not lost)",
    )
    p.add_argument(
        "--no-link", action="store_true", help="do not point .venv at the tree"
    )
    add_operation_flags(p, "apply", skip=False)


def execute(ctx: Context) -> Output:
    args = ctx.args
    check_usage(args)
    project = ctx.project()
    out = Output()
    if args.abort:
        op, notes = abort_operation(project, "apply")
        out.out += [f"aborted the apply on {op.tree}", *(f"note: {n}" for n in notes)]
        out.data = {"aborted": True, "tree": op.tree, "notes": notes, "ok": True}
        return out
    if args.cont:
        op = open_operation(project, "apply")
        runner = Runner(project, op, progress_hook(ctx))
        with tree_lock(Path(op.tree), "xpu-series apply --continue"):
            result: Report | Outcome = resume(runner, finish_apply)
        tree = Path(op.tree)
    else:
        tree = ctx.tree(project)
        request = TreeRequest(
            tree=tree,
            version=args.upstream,
            wheel=ctx.path("wheel"),
            force=args.force,
            progress=ctx.progress,
        )
        result = build_tree(project, request, on_patch=progress_hook(ctx))
    report = _report_of(result)
    if report.head and tree == project.default_tree and not args.no_link:
        if link_venv(project, tree):
            report.notes.append(f"this virtualenv imports sglang from {tree}/python")
    out.data = report.to_json()
    out.out.append(render_report(report))
    problems_hint(out, report.problems, "apply")
    out.code = report.exit_code
    if isinstance(result, Outcome) and not result.finished:
        render_stop(out, result, "apply")
        out.data["stopped"] = result.op.current
        out.code = ExitCode.CONFLICT
    elif args.cont and report.ok:
        out.err.append(
            "hint: run 'xpu-series refresh' to write your resolution into patches/"
        )
    return out


def check_usage(args: argparse.Namespace) -> None:
    if (args.cont or args.abort) and (args.upstream or args.wheel or args.force):
        raise UsageError("--continue and --abort take no other options")
