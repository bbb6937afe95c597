"""rebase: move the series to a newer upstream release in one transaction.

The new wheel is fetched and hash-recorded, the tree is put on its base, each patch
is carried with `git am -3 -k` and classified. Only when every patch is carried,
retired or dropped are the pin, the patch files and `series` rewritten, in one
swap of the patches/ folder. A conflict stops the rebase (state in
build/operation/); `--continue`, `--skip` and `--abort` go on from there.
"""

from __future__ import annotations

import argparse

from xpu_series.commands import (
    Context,
    Output,
    add_operation_flags,
    progress_hook,
    render_stop,
)
from xpu_series.errors import UsageError
from xpu_series.rebase.state import RebaseResult
from xpu_series.rebase.steps import continue_rebase, run_rebase, skip_patch
from xpu_series.result import ExitCode
from xpu_series.stack.sequencer import abort_operation
from xpu_series.ui import render_report, table

HELP = "move the series to a newer sglang release (--continue/--skip/--abort)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--onto", metavar="VERSION", help="the sglang release to move to")
    p.add_argument(
        "--wheel", metavar="PATH", help="use this local wheel of that release"
    )
    add_operation_flags(p, "rebase", skip=True)
    p.add_argument("--reason", default="", help="why --skip drops the patch")
    p.add_argument(
        "--since",
        metavar="VERSION",
        default="",
        help="with --skip --upstreamed: the release upstream has it from "
        "(default: the release of the rebase)",
    )
    p.add_argument(
        "--plan",
        metavar="FILE",
        help="decide named patches as they come up: lines 'retire NAME SINCE "
        "REASON', 'drop NAME REASON' or 'edit NAME' (stop after it to amend it); "
        "a finished rebase records its decisions in patches/moves/OLD-to-NEW.plan",
    )
    p.add_argument(
        "--no-test-retired",
        dest="test_retired",
        action="store_false",
        help="do not run the retired patches' tests on the new base",
    )
    p.add_argument(
        "--upstreamed",
        action="store_true",
        help="with --skip: upstream has the change (patches/upstreamed/)",
    )


def _render(out: Output, result: RebaseResult) -> None:
    outcome = result.outcome
    op = outcome.op
    onto = op.target.get("version")
    out.data = result.to_json()
    out.out.append(render_report(outcome.report))
    if not outcome.finished:
        render_stop(out, outcome, "rebase")
        out.code = ExitCode.CONFLICT
        return
    out.out.append("")
    out.out.append(
        f"rebased onto sglang {onto}: patches/upstream.toml, series and "
        f"patch files rewritten (sha256 {op.target.get('sha256', '')[:12]})"
    )
    for r in result.retired:
        out.out.append(f"retired {r['name']} -> {r['moved_to']} ({r['reason']})")
        if r["tests"]:
            out.out.append(
                f"  its tests {', '.join(r['tests'])}: "
                f"{r.get('tests_on_new_base', 'not run')}"
            )
    if result.drift:
        out.out.append("")
        out.out.append(
            f"dependency drift {result.old.get('version')} -> {onto} "
            "(Requires-Dist vs the test environment in pyproject.toml):"
        )
        rows = [[d.name, d.old, d.new, d.pinned or "-", d.action] for d in result.drift]
        out.out.append(table(["package", "old", "new", "pinned", "action"], rows))
    if result.violations:
        out.out.append("")
        out.out.append(
            f"test environment pins that sglang {onto} rejects (pyproject.toml; "
            "changed or not):"
        )
        rows = [[d.name, d.pinned, d.new, d.action] for d in result.violations]
        out.out.append(table(["package", "pinned", "requires", "since"], rows))
    if result.drift_note:
        out.out.append(f"note: {result.drift_note}")
    if result.report_file:
        out.out.append(f"report: {result.report_file}")
    out.err.append(
        "hint: run 'xpu-series verify' to prove every carried patch on the new base"
    )


def execute(ctx: Context) -> Output:
    args = ctx.args
    project = ctx.project()
    out = Output()
    resuming = args.cont or args.skip or args.abort
    if resuming and (args.onto or args.wheel):
        raise UsageError("--continue, --skip and --abort take no --onto or --wheel")
    if (args.reason or args.upstreamed or args.since) and not args.skip:
        raise UsageError("--reason, --upstreamed and --since go with --skip")
    if args.since and not args.upstreamed:
        raise UsageError(
            "--since goes with --upstreamed: it says from when upstream has it"
        )
    if resuming and args.plan:
        raise UsageError("--plan goes with --onto: it is read when the rebase starts")
    hook = progress_hook(ctx)
    if args.abort:
        op, notes = abort_operation(project, "rebase")
        out.out.append(
            f"aborted the rebase onto sglang {op.target.get('version')}: the pin, "
            f"series, patch files and {op.tree} are as they were"
        )
        out.out += [f"note: {n}" for n in notes]
        out.data = {"aborted": True, "notes": notes, "ok": True}
        return out
    if args.cont:
        result = continue_rebase(project, hook, args.test_retired, ctx.say)
    elif args.skip:
        result = skip_patch(
            project,
            args.reason,
            args.upstreamed,
            hook,
            args.test_retired,
            args.since,
            ctx.say,
        )
    else:
        if not args.onto:
            raise UsageError(
                "rebase needs --onto VERSION (or --continue, --skip, --abort)",
                hint="e.g. 'xpu-series rebase --onto 0.5.20'",
            )
        result = run_rebase(
            project, args.onto, ctx.path("wheel"), hook, ctx.progress,
            args.test_retired, ctx.path("plan"), ctx.say,
        )  # fmt: skip
    _render(out, result)
    return out
