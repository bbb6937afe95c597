"""apply: materialize the pinned upstream as a git tree and commit each patch on it."""

from __future__ import annotations

import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from xpu_series.engine import ProgressHook, apply_patches
from xpu_series.errors import TreeError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.result import PatchOutcome, PatchStatus, Report, UpstreamInfo
from xpu_series.series import Series, static_problems
from xpu_series.tree import (
    APPLIED_REF,
    PIN_BASE_REF,
    UPSTREAM_TAG,
    BaseInfo,
    checkout_base,
    ensure_base_cache,
    materialize_base,
    read_record,
    write_record,
)
from xpu_series.wheel import fetch_wheel

PTH_NAME = "xpu-series-tree.pth"


@dataclass(frozen=True)
class ApplyOptions:
    """What the user asked `apply` to do."""

    tree: Path
    version: str | None = None
    wheel: Path | None = None
    force: bool = False
    progress: bool = False
    # A tree the tool owns (check, verify): its leftovers are discarded, not kept.
    scratch: bool = False


def allowed_prefixes(project: Project) -> tuple[str, ...]:
    return tuple(target for _source, target in project.pin.layout)


def _refused_report(series: Series, problems: list[str], tree: Path) -> Report:
    outcomes = [
        PatchOutcome(
            p.name,
            PatchStatus.SKIPPED if p.exists else PatchStatus.MISSING,
            concern=p.concern,
            files=p.files if p.exists else (),
            detail="not tried: the series has problems",
        )
        for p in series.patches
    ]
    return Report(None, outcomes, problems=problems, tree=str(tree))


def save_local_edits(git: Git, force: bool) -> list[str]:
    """Refuse to reset a tree with edits, or (with force) keep them reachable."""
    notes: list[str] = []
    dirty = git.dirty_paths()
    head = git.rev("HEAD")
    recorded = git.rev(APPLIED_REF)
    upstream = git.rev(UPSTREAM_TAG)
    unexported = None not in (head, upstream) and head not in (recorded, upstream)
    if not dirty and not unexported:
        return notes
    what = []
    if dirty:
        what.append(f"{len(dirty)} changed or untracked files (first: {dirty[0][3:]})")
    if unexported:
        what.append("commits that no apply made (not exported with refresh)")
    if not force:
        raise TreeError(
            f"{git.repo} has local edits: {'; '.join(what)}",
            hint="commit and run 'xpu-series refresh' to keep them in the series, "
            "or re-run with --force to set them aside (stash and backup branch)",
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if unexported:
        branch = f"xpu-series/backup-{stamp}"
        git.run("branch", "-f", branch, "HEAD")
        notes.append(f"commits on top were kept on branch {branch}")
    if dirty:
        git.run("stash", "push", "-q", "-u", "-m", f"xpu-series apply --force {stamp}")
        notes.append(
            f"local edits were stashed: see "
            f"'git -C {git.repo} stash show -p stash@{{0}}'"
        )
    return notes


def _borrow_pin_objects(project: Project, git: Git) -> list[str]:
    """Make the pinned base's blobs available so `git am -3` can merge patches
    made against it onto another upstream. Best effort: only from the cache."""
    pin = project.pin
    if not (project.cache_dir / "wheels" / pin.wheel).is_file():
        return ["the pinned wheel is not cached: no 3-way merge fallback"]
    wheel = fetch_wheel(pin, project.cache_dir)
    cache_repo, _built = ensure_base_cache(wheel, pin, project.cache_dir)
    git.run("fetch", "-q", str(cache_repo), f"+refs/tags/{UPSTREAM_TAG}:{PIN_BASE_REF}")
    return []


def link_venv(project: Project, tree: Path) -> Path | None:
    """Make the project's own virtualenv import sglang from `tree` (no copy).

    Only a virtualenv inside the project is touched, so running the tool from
    another environment (or against a scratch project in a test) changes nothing.
    """
    prefix = Path(sys.prefix).resolve()
    if sys.prefix == sys.base_prefix or not prefix.is_relative_to(project.root):
        return None
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / PTH_NAME
    pth.write_text(str((tree / "python").resolve()) + "\n")
    return pth


def run_apply(
    project: Project, options: ApplyOptions, on_patch: ProgressHook | None = None
) -> Report:
    """Build `options.tree` = upstream + one commit per patch; report every patch."""
    series = project.series()
    tree = options.tree
    prefixes = allowed_prefixes(project)
    problems = static_problems(series, None, prefixes)
    if problems:
        return _refused_report(series, problems, tree)
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tree_lock(tree, "xpu-series apply"):
        git = Git(tree)
        notes: list[str] = []
        is_checkout = git.is_repo() and not read_record(git).get("sha256")
        if git.is_repo() and options.scratch:
            git.run("reset", "-q", "--hard")
            git.run("clean", "-q", "-fdx")
        elif git.is_repo():
            notes += save_local_edits(git, options.force)
        upstream: UpstreamInfo
        base: BaseInfo
        if is_checkout:
            base = checkout_base(tree)
            upstream = UpstreamInfo(base.version, "", pinned=False, source="checkout")
        else:
            pin = project.pin.for_version(options.version or project.pin.version)
            wheel = fetch_wheel(
                pin, project.cache_dir, local=options.wheel, progress=options.progress
            )
            base = materialize_base(wheel, pin, tree, project.cache_dir)
            upstream = UpstreamInfo(wheel.version, wheel.sha256, pinned=pin.pinned)
            if not pin.pinned:
                notes.append(
                    f"{pin.wheel} is not the pin; its sha256 {wheel.sha256} was "
                    "recorded, not checked"
                )
        notes.append(f"base from {base.source} ({base.commit[:12]})")
        # Symlinks can only be judged once the tree exists; still before any patch.
        unsafe = static_problems(series, tree, prefixes)
        if unsafe:
            report = _refused_report(series, unsafe, tree)
            report.upstream = upstream
            return report
        if upstream.version != project.pin.version and not is_checkout:
            notes += _borrow_pin_objects(project, git)
        outcomes = apply_patches(
            git, series.patches, upstream_version=upstream.version, on_patch=on_patch
        )
        head = git.out("rev-parse", "HEAD")
        git.run("update-ref", APPLIED_REF, head)
        record = read_record(git)
        record["applied"] = [
            {"name": o.name, "status": str(o.status), "commit": o.commit}
            for o in outcomes
        ]
        record["series"] = series.digest()
        write_record(git, record)
    return Report(upstream, outcomes, notes=notes, tree=str(tree), head=head)
