"""status: the pin, the tree, which patches are applied, and local edits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.tree import APPLIED_REF, UPSTREAM_TAG, read_record


@dataclass
class TreeStatus:
    """What `status` found."""

    pin: dict[str, str]
    tree: str
    exists: bool
    upstream: dict[str, str] = field(default_factory=dict)
    patches: list[dict[str, str]] = field(default_factory=list)
    local_edits: list[str] = field(default_factory=list)
    unexported_commits: list[str] = field(default_factory=list)
    series_changed: bool = False

    @property
    def ok(self) -> bool:
        return (
            self.exists
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
            "ok": self.ok,
        }


def run_status(project: Project, tree: Path) -> TreeStatus:
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
    status.upstream = {
        "version": record.get("version", ""),
        "sha256": record.get("sha256", ""),
        "commit": git.rev(UPSTREAM_TAG) or "",
        "pinned": str(record.get("sha256") == pin.sha256).lower(),
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
            state, commit = "applied", by_subject[subject]
            matched.add(subject)
        elif recorded.get(patch.name, {}).get("status") == "absorbed":
            state, commit = "absorbed", ""
        else:
            state, commit = "pending", ""
        status.patches.append({"name": patch.name, "status": state, "commit": commit})
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
