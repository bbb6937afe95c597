"""One module per verb: its arguments (`add_arguments`), its logic (`run_*`) and its
rendering (`execute`, which returns text and never prints). `cli.py` only builds the
parser from `VERBS` and prints what `execute` returns."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.project import Project, find_project
from xpu_series.result import ExitCode
from xpu_series.stack.engine import ProgressHook
from xpu_series.stack.sequencer import EDIT_STOP, Outcome

VERBS = (
    "fetch",
    "apply",
    "status",
    "check",
    "matrix",
    "refresh",
    "verify",
    "rebase",
    "range-diff",
    "unregister",
    "overlay",
    "audit",
    "upstream",
    "wheel",
)


@dataclass
class Output:
    """What a verb has to say: stdout text, stderr lines, JSON, exit code."""

    code: int = ExitCode.OK
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    data: dict[str, Any] | None = None

    def error(self, message: str, hint: str = "") -> None:
        self.err.append(f"error: {message}")
        if hint:
            self.err.append(f"hint: {hint}")


@dataclass
class Context:
    """The parsed command line plus what the CLI lends a verb while it runs."""

    args: argparse.Namespace
    # Prints one progress line to stderr (only the CLI prints; a verb calls this).
    say: Callable[[str], None]

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def progress(self) -> bool:
        return not self.json and sys.stderr.isatty()

    def project(self) -> Project:
        root = getattr(self.args, "project", None)
        return find_project(Path(root) if root else None)

    def tree(self, project: Project) -> Path:
        tree = getattr(self.args, "tree", None)
        return Path(tree).resolve() if tree else project.default_tree

    def path(self, name: str) -> Path | None:
        value = getattr(self.args, name, None)
        return Path(value) if value else None


def add_upstream(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream", metavar="VERSION", help="an sglang release other than the pin"
    )
    p.add_argument(
        "--wheel", metavar="PATH", help="use this local wheel file (offline use)"
    )


def add_tree(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tree", metavar="DIR", help="the git tree to use (default: build/sglang)"
    )


def add_operation_flags(p: argparse.ArgumentParser, verb: str, skip: bool) -> None:
    """--continue / [--skip] / --abort of an operation that can stop (apply, rebase)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--continue",
        dest="cont",
        action="store_true",
        help=f"after resolving a conflict (edit, git add): finish the {verb}",
    )
    if skip:
        group.add_argument(
            "--skip",
            action="store_true",
            help=f"drop the patch the {verb} stopped at (needs --reason)",
        )
    group.add_argument(
        "--abort",
        action="store_true",
        help=f"undo a stopped or interrupted {verb}: everything as it was before",
    )


def problems_hint(out: Output, problems: list[str], verb: str) -> None:
    """Each static problem as an error, and a next step that is not this verb."""
    for problem in problems:
        out.err.append(f"error: {problem}")
    if problems:
        nxt = (
            "fix patches/ (the commits in build/sglang, then 'xpu-series refresh'), "
            "then run 'xpu-series check' again"
            if verb == "check"
            else "fix patches/ ('xpu-series check' lists every problem)"
        )
        out.err.append(f"hint: {nxt}")


def render_stop(out: Output, outcome: Outcome, verb: str) -> None:
    op = outcome.op
    if op.current_detail.endswith(EDIT_STOP):
        out.error(f"stopped after {op.current} so you can edit it (the plan asked)")
        out.err.append(
            f"hint: amend it with 'git -C {op.tree} commit --amend', then run "
            f"'xpu-series {verb} --continue'; or drop it with 'xpu-series {verb} "
            f"--skip --reason TEXT'; or undo everything with 'xpu-series {verb} "
            "--abort'"
        )
        return
    files = outcome.stopped_files
    if files:
        where = f" (conflict markers in {', '.join(files)})"
        fix = f"fix the markers in {op.tree}"
    else:
        where = " (git could not merge it: no common base to merge from)"
        patch = Path(outcome.op.tree).parent / "operation" / "patches.orig"
        fix = f"make its change by hand in {op.tree} (the patch: {patch / op.current})"
    out.error(
        f"{op.current} does not apply on sglang {op.target.get('version')}"
        f"{where}: {op.current_detail}"
    )
    steps = [
        f"{fix}, 'git -C {op.tree} add' the files, then run "
        f"'xpu-series {verb} --continue'"
    ]
    if verb == "rebase":
        steps.append(
            "or drop it with 'xpu-series rebase --skip --reason TEXT' "
            "(add --upstreamed if upstream has it)"
        )
    steps.append(f"or undo everything with 'xpu-series {verb} --abort'")
    out.err.append("hint: " + "; ".join(steps))


def progress_hook(ctx: Context) -> ProgressHook:
    """A line per patch as it is applied, on a terminal and in a CI log alike
    (not with --json: a machine reads the result, not the way there)."""
    start = time.monotonic()

    def show(patch, index: int, total: int) -> None:
        if not ctx.json:
            elapsed = time.monotonic() - start
            ctx.say(f"[{index + 1}/{total}] {patch.name} ({elapsed:.0f}s elapsed)")

    return show
