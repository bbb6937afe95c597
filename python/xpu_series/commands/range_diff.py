"""range-diff: what changed in each patch between two revisions of patches/.

Each revision's series is applied on its own pin in a scratch tree, then
`git range-diff` compares the two commit ranges, so a reviewer of a rebase reads
"0003 changed in scheduler.py" instead of two whole series.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output
from xpu_series.errors import UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.result import ExitCode, Report
from xpu_series.stack.build import ScratchRequest, build_scratch
from xpu_series.stack.tree import UPSTREAM_TAG
from xpu_series.ui import table

HELP = "what changed in each patch between two revisions of patches/"
WORKTREE = "working tree"
_PAIR = re.compile(r"^\s*(-|\d+):\s+(\S+)\s+([=!<>])\s+(-|\d+):\s+(\S+)\s+(.*)$")
_FILE = re.compile(r"^\s+## (\S+) ##")
_WORDS = {"=": "unchanged", "!": "changed", "<": "removed", ">": "added"}


@dataclass
class PatchChange:
    """One line of the range-diff: a patch and what happened to it."""

    subject: str
    change: str
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "change": self.change, "files": self.files}


@dataclass
class RangeDiff:
    old: str
    new: str
    changes: list[PatchChange]
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "patches": [c.to_json() for c in self.changes],
            "range_diff": self.text,
            "ok": True,
        }


def _export_revision(project: Project, rev: str, dest: Path) -> None:
    """patches/ as it is at git revision `rev` of the project, written to dest."""
    git = Git(project.root)
    if git.rev(rev) is None:
        raise UsageError(
            f"{rev!r} is not a revision of {project.root}",
            hint="name a commit, branch or tag of this repository",
        )
    listing = git.run("ls-tree", "-r", "--name-only", rev, "patches/", check=False)
    names = listing.stdout.split()
    if "patches/upstream.toml" not in names:
        raise UsageError(f"{rev} has no patches/upstream.toml")
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(git.run("show", f"{rev}:{name}").stdout, encoding="utf-8")


def _materialize(project: Project, label: str) -> Git:
    tree = project.build_dir / "range-diff" / label
    report = build_scratch(project, ScratchRequest(tree=tree))
    assert isinstance(report, Report)
    if not report.ok:
        bad = [f"{p.name}: {p.status}" for p in report.patches if not p.status.ok]
        raise XpuSeriesError(
            f"the series at {label} does not apply on its pin: "
            + "; ".join(report.problems + bad),
            hint="run 'xpu-series check' on that revision",
        )
    return Git(tree)


def summarize(text: str) -> list[PatchChange]:
    """Per patch, from `git range-diff` output: unchanged/changed/added/removed."""
    changes: list[PatchChange] = []
    for line in text.splitlines():
        match = _PAIR.match(line)
        if match:
            changes.append(PatchChange(match.group(6), _WORDS[match.group(3)]))
            continue
        file_match = _FILE.match(line)
        if file_match and changes and file_match.group(1) not in changes[-1].files:
            changes[-1].files.append(file_match.group(1))
    return changes


def run_range_diff(
    project: Project, old: str = "HEAD", new: str | None = None
) -> RangeDiff:
    with tempfile.TemporaryDirectory(prefix="xpu-range-diff-") as tmp:
        sides = {}
        for label, rev in (("old", old), ("new", new)):
            if rev is None:
                side = project
            else:
                root = Path(tmp) / label
                _export_revision(project, rev, root)
                side = Project(root, build_root=project.build_dir)
            sides[label] = _materialize(side, label)
    old_git, new_git = sides["old"], sides["new"]
    new_git.run(
        "fetch", "-q", str(old_git.repo), "+HEAD:refs/range-diff/old",
        f"+refs/tags/{UPSTREAM_TAG}:refs/range-diff/old-base",
    )  # fmt: skip
    result = new_git.run(
        "range-diff", "--no-color", "--creation-factor=100",
        "refs/range-diff/old-base..refs/range-diff/old",
        f"{UPSTREAM_TAG}..HEAD",
    )  # fmt: skip
    return RangeDiff(old, new or WORKTREE, summarize(result.stdout), result.stdout)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("old", nargs="?", default="HEAD", help="revision (default HEAD)")
    p.add_argument(
        "new", nargs="?", default=None, help="revision (default: the working tree)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print the range-diff")


def execute(ctx: Context) -> Output:
    project = ctx.project()
    diff = run_range_diff(project, ctx.args.old, ctx.args.new)
    out = Output(data=diff.to_json())
    out.out.append(f"patches/ at {diff.old} -> {diff.new}")
    rows = [
        [
            c.change,
            c.subject,
            ", ".join(f.removeprefix("python/sglang/") for f in c.files) or "-",
        ]
        for c in diff.changes
    ]
    out.out.append(table(["change", "patch", "files"], rows))
    if ctx.args.verbose:
        out.out.append(diff.text)
    op = project.operations.load()
    if op is not None and op.kind == "rebase":
        # The rebase writes patches/ only when it finishes: say so, or an
        # all-unchanged table reads as "the rebase changed nothing".
        note = (
            f"{op.described()} is in progress: patches/ is rewritten only when it "
            "finishes, so this compares the series as it was"
        )
        out.err.append(f"note: {note}")
        out.data["operation_in_progress"] = note
    out.code = ExitCode.OK
    return out
