"""status: the pin, the tree, which patches are applied, and local edits."""

from __future__ import annotations

import argparse
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output, add_tree
from xpu_series.errors import GitError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.stack.build import PTH_NAME
from xpu_series.stack.tree import APPLIED_REF, UPSTREAM_TAG, read_record
from xpu_series.ui import table

HELP = "show the pin, the tree, applied patches, local edits"


@dataclass
class TreeStatus:
    """What `status` found."""

    pin: dict[str, str]
    tree: str
    exists: bool
    upstream: dict[str, Any] = field(default_factory=dict)
    patches: list[dict[str, str]] = field(default_factory=list)
    local_edits: list[str] = field(default_factory=list)
    unexported_commits: list[str] = field(default_factory=list)
    series_changed: bool = False
    operation: dict[str, Any] = field(default_factory=dict)
    broken: str = ""
    # Where this interpreter's `import sglang` goes, when that is not `tree`.
    imports_from: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.exists
            and not self.operation
            and not self.broken
            and not self.local_edits
            and not self.unexported_commits
            and not self.series_changed
            and all(p["status"] != "pending" for p in self.patches)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pin": self.pin,
            "tree": self.tree,
            "exists": self.exists,
            "upstream": self.upstream,
            "patches": self.patches,
            "local_edits": self.local_edits,
            "unexported_commits": self.unexported_commits,
            "series_changed": self.series_changed,
            "operation": self.operation,
            "broken": self.broken,
            "imports_from": self.imports_from,
            "ok": self.ok,
        }


def run_status(project: Project, tree: Path) -> TreeStatus:
    """What the tree holds; a tree git cannot read is reported, not raised."""
    op = project.operations.load()
    try:
        status = _status(project, tree)
    except GitError as exc:
        status = TreeStatus(
            pin=_pin(project), tree=str(tree), exists=True, broken=exc.message
        )
    if op is not None:
        status.operation = {
            "kind": op.kind,
            "phase": op.phase,
            "describe": op.describe(),
            "tree": op.tree,
            "stopped_at": op.current,
        }
        if Path(op.tree) == tree:
            status.patches = _operation_patches(op)
    status.imports_from = _foreign_import(tree)
    return status


def _operation_patches(op: Any) -> list[dict[str, str]]:
    """The patches as the operation sees them: done (with how), the one it
    stopped at, and what it has not tried yet."""
    rows = [
        {"name": d["name"], "status": d["status"], "commit": d.get("commit", "")}
        for d in op.done
    ]
    todo = list(op.todo)
    if op.stopped and todo:
        rows.append(
            {
                "name": todo.pop(0),
                "status": f"stopped ({op.current_detail.split(':', 1)[0]})",
                "commit": "",
            }
        )
    rows += [{"name": name, "status": "to do", "commit": ""} for name in todo]
    return rows


def _foreign_import(tree: Path) -> str:
    """The tree this interpreter's virtualenv imports sglang from (its
    xpu-series .pth), when it is another checkout's, or ''."""

    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    try:
        target = Path(pth.read_text(encoding="utf-8").strip())
    except OSError:
        return ""
    mine = (tree / "python").resolve()
    return "" if target.resolve() == mine else str(target)


def _pin(project: Project) -> dict[str, str]:
    pin = project.pin
    return {"version": pin.version, "wheel": pin.wheel, "sha256": pin.sha256}


def _status(project: Project, tree: Path) -> TreeStatus:
    pin = project.pin
    series = project.series()
    status = TreeStatus(
        pin={"version": pin.version, "wheel": pin.wheel, "sha256": pin.sha256},
        tree=str(tree),
        exists=False,
    )
    git = Git(tree)
    if not git.is_repo() or git.rev(UPSTREAM_TAG) is None:
        status.patches = [
            {"name": p.name, "status": "pending", "commit": ""} for p in series.patches
        ]
        return status
    status.exists = True
    record = read_record(git)
    # A tree built for an older release carries the retired patches it needs.
    series = project.series(record.get("version") or None)
    status.upstream = {
        "version": record.get("version", ""),
        "sha256": record.get("sha256", ""),
        "commit": git.rev(UPSTREAM_TAG) or "",
        "pinned": record.get("sha256") == pin.sha256,
    }
    log = git.out("log", "--format=%H%x00%s", f"{UPSTREAM_TAG}..HEAD")
    by_subject = {}
    for line in log.splitlines():
        sha, _, subject = line.partition("\0")
        by_subject[subject] = sha
    recorded = {a["name"]: a for a in record.get("applied", [])}
    matched: set[str] = set()
    for patch in series.patches:
        subject = patch.header.subject if patch.exists else ""
        if subject and subject in by_subject:
            # As the operation that built it said (a 3-way or hand merge).
            how = recorded.get(patch.name, {}).get("status")
            state = how if how in ("applied", "merged") else "applied"
            commit = by_subject[subject]
            matched.add(subject)
        elif recorded.get(patch.name, {}).get("status") == "absorbed":
            state, commit = "absorbed", ""
        else:
            state, commit = "pending", ""
        entry = {"name": patch.name, "status": state, "commit": commit}
        # DEP-3's Forwarded: the upstream pull request (`xpu-series upstream`).
        entry["forwarded"] = patch.header.get("Forwarded") if patch.exists else ""
        status.patches.append(entry)
    status.unexported_commits = [
        f"{sha[:12]} {subject}"
        for subject, sha in by_subject.items()
        if subject not in matched
    ]
    applied_ref = git.rev(APPLIED_REF)
    head = git.rev("HEAD")
    if applied_ref and head != applied_ref and not status.unexported_commits:
        status.unexported_commits = [f"HEAD {head[:12] if head else '?'} moved"]
    status.local_edits = git.dirty_paths()
    status.series_changed = bool(record.get("series")) and (
        record.get("series") != series.digest()
    )
    return status


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_tree(p)


def execute(ctx: Context) -> Output:
    project = ctx.project()
    status = run_status(project, ctx.tree(project))
    out = Output(data=status.to_json())
    pin = status.pin
    lines = out.out
    lines.append(
        f"pin: sglang {pin['version']} {pin['wheel']} sha256 {pin['sha256'][:12]}"
    )
    if status.operation:
        op = status.operation
        lines.append(f"in progress: {op['describe']}")
        kind = op["kind"]
        steps = [f"'xpu-series {kind} --continue'"]
        if kind == "rebase" and op.get("stopped_at"):
            steps.append(f"'xpu-series {kind} --skip --reason TEXT [--upstreamed]'")
        steps.append(f"'xpu-series {kind} --abort'")
        lines.append("  next: " + ", ".join(steps[:-1]) + " or " + steps[-1])
        if kind == "rebase":
            lines.append(
                "  patches/ is rewritten only when the rebase finishes: until then "
                "it is the series as it was"
            )
    if status.imports_from:
        lines.append(
            f"note: this Python's virtualenv imports sglang from "
            f"{status.imports_from}, not {status.tree}: run this checkout's own "
            ".venv/bin/xpu-series to use its tree"
        )
    if status.broken:
        lines.append(f"tree: {status.tree} cannot be read: {status.broken}")
        out.err.append(
            "hint: run 'xpu-series apply' to rebuild it"
            if not status.operation
            else f"hint: run 'xpu-series {status.operation['kind']} --continue' "
            "or '--abort'"
        )
        return out
    if not status.exists:
        lines.append(f"tree: {status.tree} (not materialized; run 'xpu-series apply')")
        return out
    up = status.upstream
    lines.append(f"tree: {status.tree} on sglang {up['version']} ({up['commit'][:12]})")
    rows = [[p["name"], p["status"], p["commit"][:12]] for p in status.patches]
    lines.append(table(["patch", "status", "commit"], rows))
    lines += [
        f"forwarded: {p['name']} {p['forwarded']}"
        for p in status.patches
        if p.get("forwarded")
    ]
    lines += [f"local edit: {line}" for line in status.local_edits]
    if status.operation:
        return out  # the tree is mid-operation: only --continue/--abort apply
    lines += [
        f"not exported: {line} (run 'xpu-series refresh')"
        for line in status.unexported_commits
    ]
    if status.series_changed:
        lines.append("patches/ changed since the last apply (run 'xpu-series apply')")
    return out
