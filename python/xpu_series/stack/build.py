"""Building a tree: the pinned (or another) release plus one commit per patch.

The user's tree is an operation (see sequencer.py): it stops at a conflict with
the markers in place and goes on with `--continue`, or goes back with `--abort`.
Scratch trees (check, verify, matrix, overlay, range-diff) report every patch
instead, and an unchanged one answers from its record.
"""

from __future__ import annotations

import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import TreeError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.result import PatchOutcome, PatchStatus, Report, UpstreamInfo
from xpu_series.stack.bytecode import prime
from xpu_series.stack.engine import ProgressHook, apply_patches
from xpu_series.stack.operation import Operation, copy_patches, require_idle
from xpu_series.stack.sequencer import (
    Outcome,
    Runner,
    borrow_pin_objects,
    record_applied,
    resume,
)
from xpu_series.stack.series import (
    Series,
    dropped_test_problems,
    format_problems,
    metadata_problems,
    static_problems,
    test_problems,
)
from xpu_series.stack.tree import (
    APPLIED_REF,
    UPSTREAM_TAG,
    BaseInfo,
    materialize_base,
    read_record,
    repair,
    write_record,
)
from xpu_series.stack.wheel import fetch_wheel

PTH_NAME = "xpu-series-tree.pth"


@dataclass(frozen=True)
class ScratchRequest:
    """A tree the tool owns (check, verify, matrix, overlay, range-diff): every
    patch is reported, and leftovers are discarded, not kept."""

    tree: Path
    version: str | None = None
    wheel: Path | None = None
    progress: bool = False


@dataclass(frozen=True)
class TreeRequest:
    """The user's tree: an operation that stops at a conflict and keeps edits."""

    tree: Path
    version: str | None = None
    wheel: Path | None = None
    force: bool = False
    progress: bool = False


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


def _stamp(git: Git) -> str:
    head = git.rev("HEAD") or ""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{head[:8]}"


def save_local_edits(git: Git, force: bool) -> list[str]:
    """Refuse to reset a tree with edits, or (with force) keep them reachable."""
    notes: list[str] = []
    if (git.repo / ".git" / "index.lock").exists():
        raise TreeError(
            f"{git.repo} has a .git/index.lock: a git command is running there, "
            "or one was killed",
            hint=f"if no git command is running in {git.repo}, remove "
            f"{git.repo / '.git' / 'index.lock'} and run the same command again",
        )
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
    stamp = _stamp(git)
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


def keep_foreign_head(git: Git, series: Series) -> str:
    """A HEAD that apply did not build from the current patches/ goes on a backup
    branch before apply replaces it (it costs one ref). Returns the branch."""
    head, upstream = git.rev("HEAD"), git.rev(UPSTREAM_TAG)
    if head is None or head == upstream:
        return ""
    built_here = head == git.rev(APPLIED_REF) and (
        read_record(git).get("series") == series.digest()
    )
    if built_here:
        return ""
    branch = f"xpu-series/backup-{_stamp(git)}"
    git.run("branch", "-f", branch, head)
    return branch


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


# Bumped whenever what a scratch run reports changes, so no old answer is reused.
SCRATCH_FORMAT = "1"


def scratch_key(wheel_sha: str, series: Series) -> str:
    """What a scratch tree's answer depends on: the base, the series, the engine."""
    return f"{SCRATCH_FORMAT}:{wheel_sha}:{series.digest()}"


def reusable(git: Git, key: str, slot: str) -> dict | None:
    """The answer a scratch tree recorded under `slot` for `key`, if the tree is
    still exactly as that run left it (same HEAD, nothing changed)."""
    if not git.is_repo() or (git.repo / ".git" / "index.lock").exists():
        return None
    saved = read_record(git).get(slot)
    if not saved or saved.get("key") != key or git.rev("HEAD") != saved.get("head"):
        return None
    if git.run("status", "--porcelain", check=False).stdout.strip():
        return None
    return saved


def remember(git: Git, key: str, slot: str, data: dict) -> None:
    record = read_record(git)
    record[slot] = {"key": key, "head": git.rev("HEAD"), **data}
    write_record(git, record)


def _run_scratch(
    project: Project, request: ScratchRequest, series: Series, on_patch: ProgressHook
) -> Report:
    """Apply into a tree the tool owns and report every patch (no stopping).

    An unchanged tree for the same wheel and series answers from its record: a
    warm check or matrix applies nothing again.
    """
    tree = request.tree
    prefixes = allowed_prefixes(project)
    with tree_lock(tree, "xpu-series apply (scratch)"):
        git = Git(tree)
        notes: list[str] = []
        pin = project.pin.for_version(request.version or project.pin.version)
        wheel = fetch_wheel(
            pin, project.cache_dir, local=request.wheel, progress=request.progress
        )
        upstream = UpstreamInfo(wheel.version, wheel.sha256, pinned=pin.pinned)
        key = scratch_key(wheel.sha256, series)
        saved = reusable(git, key, "scratch_report")
        if saved is not None:
            outcomes = [
                PatchOutcome(
                    o["name"],
                    PatchStatus(o["status"]),
                    o["concern"],
                    tuple(o["files"]),
                    o["detail"],
                    o["commit"],
                )  # fmt: skip
                for o in saved["patches"]
            ]
            notes.append("unchanged since the last run: its answer is reused")
            return Report(
                upstream, outcomes, notes=notes, tree=str(tree), head=saved["head"]
            )
        if git.is_repo():
            repair(git)
            git.run("clean", "-q", "-fdx")
        base: BaseInfo = materialize_base(wheel, pin, tree, project.cache_dir)
        notes.append(f"base from {base.source} ({base.commit[:12]})")
        unsafe = static_problems(series, tree, prefixes)
        if unsafe:
            report = _refused_report(series, unsafe, tree)
            report.upstream = upstream
            return report
        if upstream.version != project.pin.version:
            notes += borrow_pin_objects(project, git)
        outcomes = apply_patches(
            git,
            series.patches,
            upstream_version=upstream.version,
            exact=upstream.version == project.pin.version,
            on_patch=on_patch,
        )
        head = git.out("rev-parse", "HEAD")
        remember(git, key, "scratch_report",
                 {"patches": [o.to_json() for o in outcomes]})  # fmt: skip
    return Report(upstream, outcomes, notes=notes, tree=str(tree), head=head)


def finish_apply(runner: Runner) -> None:
    record_applied(runner, runner.series().digest())
    # The tree is what tests and servers import sglang from, process after process.
    prime(Git(Path(runner.op.tree)), runner.project.cache_dir)


def _older_note(project: Project, version: str | None, series: Series) -> str:
    """What an older release also gets: the retired patches above it."""
    retired = [p.name for p in series.patches if p.retired]
    if not retired:
        return ""
    return (
        f"sglang {version} is older than the pin {project.pin.version}: it "
        f"also gets the retired {', '.join(retired)} (Applied-Upstream above it)"
    )


def build_scratch(
    project: Project, request: ScratchRequest, on_patch: ProgressHook | None = None
) -> Report:
    """Build `request.tree` = upstream + one commit per patch, in a tree the tool
    owns, and report every patch (no stopping)."""
    series = project.series(request.version or project.pin.version)
    problems = static_problems(series, None, allowed_prefixes(project))
    if problems:
        return _refused_report(series, problems, request.tree)
    request.tree.parent.mkdir(parents=True, exist_ok=True)
    report = _run_scratch(project, request, series, on_patch)
    older = _older_note(project, request.version, series)
    if older:
        report.notes.append(older)
    return report


def build_tree(
    project: Project, request: TreeRequest, on_patch: ProgressHook | None = None
) -> Report | Outcome:
    """Build the user's tree `request.tree` = upstream + one commit per patch.

    Returns an Outcome (finished or stopped at a conflict), or a Report when the
    series has problems and nothing was tried.
    """
    series = project.series(request.version or project.pin.version)
    tree = request.tree
    problems = static_problems(series, None, allowed_prefixes(project))
    if problems:
        return _refused_report(series, problems, tree)
    tree.parent.mkdir(parents=True, exist_ok=True)
    older = _older_note(project, request.version, series)
    store = project.operations
    previous = store.load()
    half_built = (
        previous is not None
        and previous.kind == "apply"
        and not previous.stopped
        and previous.tree == str(tree)
    )
    if not half_built:
        require_idle(store, "apply")
    with tree_lock(tree, "xpu-series apply"):
        git = Git(tree)
        notes: list[str] = []
        is_checkout = git.is_repo() and not read_record(git).get("sha256")
        if half_built and git.is_repo():
            notes += repair(git)
            notes.append("rebuilt the tree an interrupted apply left half-built")
            backup = ""
        elif git.is_repo():
            notes += save_local_edits(git, request.force)
            backup = keep_foreign_head(git, series) if not is_checkout else ""
        else:
            backup = ""
        old_head = git.rev("HEAD") if git.is_repo() else None
        version = request.version or project.pin.version
        target: dict = {"version": version}
        if request.wheel:
            target["local"] = str(request.wheel.resolve())
        if is_checkout:
            target = {"version": "checkout", "checkout": True}
        op = Operation(kind="apply", tree=str(tree), target=target)
        runner = Runner(project, op, on_patch, request.progress)
        if half_built and previous is not None:
            # Keep what the tree was before the first, interrupted, try (and the
            # record saved then); only the copy of patches/ is taken anew.
            op.orig = previous.orig
            copy_patches(project.patches_dir, store.patches_backup)
            store.save(op)
        else:
            runner.begin()
        try:
            runner.prepare()
        except KeyboardInterrupt:
            runner.save()
            raise runner.interrupted() from None
        unsafe = static_problems(runner.series(), tree, allowed_prefixes(project))
        if unsafe:
            project.operations.end()
            report = _refused_report(series, unsafe, tree)
            report.upstream = runner.upstream_info()
            return report
        runner.notes = notes + runner.notes + ([older] if older else [])
        outcome = resume(runner, finish_apply)
        if backup:
            if git.rev("HEAD") == old_head:
                git.run("branch", "-D", backup, check=False)
            else:
                outcome.report.notes.append(
                    f"the tree's previous HEAD was not built from the current "
                    f"patches/: it is kept on branch {backup}"
                )
    return outcome


def scratch_tree(project: Project, version: str) -> Path:
    return project.build_dir / "check" / version


def run_check(
    project: Project,
    version: str | None = None,
    wheel: Path | None = None,
    progress: bool = False,
) -> Report:
    """Apply the series into a scratch tree under build/check/; the user's tree is
    never touched. Static problems are reported without applying anything."""
    version = version or project.pin.version
    request = ScratchRequest(
        tree=scratch_tree(project, version), version=version, wheel=wheel,
        progress=progress,
    )  # fmt: skip
    report = build_scratch(project, request)
    series = project.series(version)
    # What apply can live with but a reviewer should not: a series file that
    # needs normalising, Tests: that name nothing.
    report.problems += (
        format_problems(series)
        + test_problems(series, project.root)
        + dropped_test_problems(series, project.root)
        + metadata_problems(series, project.pin.version)
    )
    return report
