"""refresh: export the tree's commits upstream..HEAD into patches/, byte-stable."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output, add_tree
from xpu_series.errors import TreeError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.stack.operation import require_idle
from xpu_series.stack.series import PatchName
from xpu_series.stack.tree import (
    APPLIED_REF,
    UPSTREAM_TAG,
    export_commit,
    read_record,
    write_record,
)

HELP = "export the tree's commits into patches/, byte-stable"


@dataclass
class RefreshResult:
    """Which patch files changed."""

    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    check_only: bool = False

    @property
    def ok(self) -> bool:
        """A --check passes only when refresh would change nothing."""
        return not self.check_only or not (self.written or self.removed)

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "check": self.check_only,
            "ok": self.ok,
        }


def slugify(subject: str) -> str:
    """File-name slug of a subject.

    >>> slugify("[XPU] Run encoder-only layers non-causal")
    'run-encoder-only-layers-non-causal'
    """
    text = re.sub(r"^\[[^\]]*\]\s*", "", subject).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    return slug[:52].rstrip("-") or "patch"


def _new_name(taken: set[str], subject: str) -> PatchName:
    """A fresh `NNNN-slug.patch` numbered after every name in use."""
    numbers = [int(n[:4]) for n in taken if n[:4].isdigit()]
    number = max(numbers, default=0) + 1
    return PatchName(f"{number:04d}-{slugify(subject)}.patch")


def match_names(
    subjects: list[str],
    entries: list[tuple[str, str]],
    reserved: frozenset[str] = frozenset(),
) -> list[str]:
    """The series name of each commit: identity survives reorders and rewordings.

    A commit takes the entry with its subject; the commits left take the entries
    left in series order (a reworded subject keeps its file); any commit beyond
    that is new, numbered after every name in use, the `reserved` ones too (the
    retired patches: an older release still carries them by their number).
    `entries` is (name, subject) in series order.

    >>> match_names(["B", "A2"], [("0001-a.patch", "A"), ("0002-b.patch", "B")])
    ['0002-b.patch', '0001-a.patch']
    """
    by_subject: dict[str, str] = {}
    for name, subject in entries:
        by_subject.setdefault(subject, name)
    names: list[str | None] = []
    used: set[str] = set()
    for subject in subjects:
        name = by_subject.get(subject)
        if name is not None and name not in used:
            used.add(name)
            names.append(name)
        else:
            names.append(None)
    left = [name for name, _subject in entries if name not in used]
    taken = {name for name, _subject in entries} | set(reserved)
    out: list[str] = []
    for subject, name in zip(subjects, names, strict=True):
        if name is None:
            name = left.pop(0) if left else _new_name(taken, subject)
            taken.add(name)
        out.append(name)
    return out


def run_refresh(
    project: Project, tree: Path, *, prune: bool = False, check_only: bool = False
) -> RefreshResult:
    """Write one patch per commit upstream..HEAD; never delete a patch silently.

    With an operation in progress, or when the tree holds fewer patch commits
    than the series lists (absorbed ones aside), it refuses unless `prune`.
    """
    require_idle(project.operations, "refresh")
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
    absorbed = {
        a["name"]
        for a in read_record(git).get("applied", [])
        if a.get("status") == "absorbed"
    }
    entries = [
        (p.name, p.header.subject if p.exists else "")
        for p in series.patches
        if p.name not in absorbed
    ]
    shas = git.out("rev-list", "--reverse", f"{UPSTREAM_TAG}..HEAD").split()
    subjects = [git.out("log", "-1", "--format=%s", sha) for sha in shas]
    if len(shas) < len(entries) and not prune:
        missing = [name for name, _s in entries[len(shas) :]]
        raise TreeError(
            f"{tree} holds {len(shas)} patch commits but patches/series lists "
            f"{len(entries)}; refresh would delete patch files "
            f"(e.g. {', '.join(missing[:3])})",
            hint="finish applying the series first ('xpu-series status' shows "
            "what is missing), or pass --prune if dropping patches is what you want",
        )
    retired = frozenset(
        path.name
        for folder in ("upstreamed", "dropped")
        for path in (project.patches_dir / folder).glob("*.patch")
    )
    names = match_names(subjects, entries, retired)
    result = RefreshResult(check_only=check_only)
    for name, sha in zip(names, shas, strict=True):
        text = export_commit(git, sha)
        path = project.patches_dir / name
        if path.is_file() and path.read_bytes() == text.encode("utf-8"):
            result.unchanged.append(name)
        else:
            if not check_only:
                path.write_text(text, encoding="utf-8")
            result.written.append(name)
    kept = [p.name for p in series.patches if p.name in absorbed]
    for patch in series.patches:
        if patch.name not in names and patch.name not in kept and patch.exists:
            if not check_only:
                patch.path.unlink()
            result.removed.append(patch.name)
    series_file = project.patches_dir / "series"
    series_text = _series_text(series_file, names + kept)
    if series_file.read_bytes() != series_text.encode("utf-8"):
        result.written.append("series")
        if not check_only:
            series_file.write_text(series_text, encoding="utf-8")
    if check_only:
        return result
    # Every commit is in patches/ now: a later apply may reset over them safely.
    git.run("update-ref", APPLIED_REF, "HEAD")
    record = read_record(git)
    record["series"] = project.series().digest()
    write_record(git, record)
    return result


def _series_text(path: Path, names: list[str]) -> str:
    """The series file: its comment lines (normalised) and then the names."""
    header = [
        line.rstrip()
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith("#")
    ]
    return "\n".join([*header, *names]) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_tree(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming the files refresh would change",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="allow deleting patch files that no commit in the tree carries",
    )


def execute(ctx: Context) -> Output:
    project = ctx.project()
    result = run_refresh(
        project, ctx.tree(project), prune=ctx.args.prune, check_only=ctx.args.check
    )
    out = Output(data=result.to_json())
    if result.check_only:
        for name in result.written:
            out.err.append(f"error: patches/{name} differs from what refresh writes")
        for name in result.removed:
            out.err.append(f"error: patches/{name} has no commit in the tree")
        if not result.ok:
            out.err.append(
                "hint: patch files are generated: edit the commits in the tree, "
                "then run 'xpu-series refresh'"
            )
            out.code = 1
        else:
            out.out.append(
                f"ok: patches/ is what refresh writes ({len(result.unchanged)} patches)"
            )
        return out
    out.out += [f"wrote {name}" for name in result.written]
    out.out += [
        f"removed {name} (--prune: no commit carries it)" for name in result.removed
    ]
    out.out.append(f"{len(result.unchanged)} unchanged, {len(result.written)} written")
    return out
