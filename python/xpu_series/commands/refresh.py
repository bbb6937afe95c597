"""refresh: export the tree's commits upstream..HEAD into patches/, byte-stable."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import TreeError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.series import PatchName
from xpu_series.tree import APPLIED_REF, UPSTREAM_TAG, read_record, write_record

# Canonical export: no [PATCH] prefix, no real sha in the From line, no signature,
# full blob ids so `git am -3` can fall back to a 3-way merge on the same base.
_FORMAT = (
    "format-patch", "-1", "--stdout", "-k", "--zero-commit", "--no-signature",
    "--full-index", "--no-numbered", "--no-notes", "--stat=72",
)  # fmt: skip


@dataclass
class RefreshResult:
    """Which patch files changed."""

    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "ok": True,
        }


def slugify(subject: str) -> str:
    """File-name slug of a subject.

    >>> slugify("[XPU] Run encoder-only layers non-causal")
    'run-encoder-only-layers-non-causal'
    """
    text = re.sub(r"^\[[^\]]*\]\s*", "", subject).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    return slug[:52].rstrip("-") or "patch"


def export_commit(git: Git, sha: str) -> str:
    return git.run(*_FORMAT, sha).stdout


def run_refresh(project: Project, tree: Path) -> RefreshResult:
    """Write one patch per commit, reusing the series' names by subject."""
    git = Git(tree)
    if not git.is_repo() or git.rev(UPSTREAM_TAG) is None:
        raise TreeError(
            f"{tree} is not a tree made by 'xpu-series apply'",
            hint="run 'xpu-series apply' first, commit your change there, then refresh",
        )
    if git.dirty_paths():
        raise TreeError(
            f"{tree} has uncommitted edits; refresh exports commits only",
            hint=f"commit them ('git -C {tree} commit -a') or stash them first",
        )
    series = project.series()
    by_subject = {
        p.header.subject: p.name
        for p in series.patches
        if p.exists and p.header.subject
    }
    shas = git.out("rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()
    absorbed = {
        a["name"]
        for a in read_record(git).get("applied", [])
        if a.get("status") == "absorbed"
    }
    result = RefreshResult()
    names: list[str] = []
    for index, sha in enumerate(shas, start=1):
        subject = git.out("log", "-1", "--format=%s", sha)
        name = by_subject.get(subject) or PatchName(
            f"{index:04d}-{slugify(subject)}.patch"
        )
        text = export_commit(git, sha)
        path = project.patches_dir / name
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            result.unchanged.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            result.written.append(name)
        names.append(name)
    kept = [
        p.name for p in series.patches if p.name in absorbed and p.name not in names
    ]
    for patch in series.patches:
        if patch.name not in names and patch.name not in kept and patch.exists:
            patch.path.unlink()
            result.removed.append(patch.name)
    _write_series(project.patches_dir / "series", names + kept)
    # Every commit is in patches/ now: a later apply may reset over them safely.
    git.run("update-ref", APPLIED_REF, "HEAD")
    record = read_record(git)
    record["series"] = project.series().digest()
    write_record(git, record)
    return result


def _write_series(path: Path, names: list[str]) -> None:
    header = (
        [
            line
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")
        ]
        if path.is_file()
        else []
    )
    text = "\n".join([*header, *names]) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
