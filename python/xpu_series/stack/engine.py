"""The one apply engine: classify and commit each patch of a series onto a tree."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from xpu_series.errors import Interrupted
from xpu_series.git import Git
from xpu_series.result import PatchOutcome, PatchStatus
from xpu_series.stack.header import patch_paths
from xpu_series.stack.pin import version_tuple
from xpu_series.stack.series import Patch

ProgressHook = Callable[[Patch, int, int], None]
_CONFLICT_FILE = re.compile(r"^CONFLICT \([^)]*\): Merge conflict in (\S+)", re.M)

# `git am -k` keeps "[XPU] ..." subjects verbatim; the committer date follows the
# author date so the same series on the same base always gives the same commits.
_AM = ("am", "-q", "-k", "--committer-date-is-author-date", "--no-gpg-sign")


def _am_in_progress(git: Git) -> bool:
    return (git.git_dir() / "rebase-apply").exists()


def _abort_am(git: Git) -> None:
    if _am_in_progress(git):
        git.run("am", "--abort", check=False)


def _check_apply(git: Git, patch: Path, *extra: str) -> bool:
    return git.run("apply", "--check", *extra, str(patch), check=False).ok


def _split_by_file(text: str) -> list[str]:
    chunks: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("diff --git ") and current:
            chunks.append("".join(current))
            current = []
        if line.startswith("diff --git ") or current:
            current.append(line)
    if current:
        chunks.append("".join(current))
    return chunks


def _partially_absorbed(git: Git, patch: Patch) -> bool:
    """True when some (not all) of the patch's file diffs are already upstream."""
    chunks = _split_by_file(patch.text)
    if len(chunks) < 2:
        return False
    absorbed = 0
    for chunk in chunks:
        result = git.run("apply", "--check", "-R", "-", check=False, input_text=chunk)
        absorbed += result.ok
    return 0 < absorbed < len(chunks)


def _three_way_in_scratch_index(git: Git, patch: Path) -> bool:
    """Would a 3-way apply succeed on HEAD? Uses a throwaway index, touches nothing."""
    with tempfile.TemporaryDirectory(prefix="xpu-series-index-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run("read-tree", "HEAD", env=env)
        result = git.run(
            "apply", "--cached", "--3way", str(patch), check=False, env=env
        )
        return result.ok


def classify_patch(
    git: Git, patch: Patch, upstream_version: str | None = None
) -> PatchStatus:
    """What applying `patch` on HEAD would give, without changing the tree (a
    header's `Applied-Upstream:` at or below `upstream_version` says absorbed)."""
    if declared_absorbed(patch, upstream_version):
        return PatchStatus.ABSORBED
    if _check_apply(git, patch.path):
        return PatchStatus.APPLIED
    if _check_apply(git, patch.path, "-R"):
        return PatchStatus.ABSORBED
    if _three_way_in_scratch_index(git, patch.path):
        return PatchStatus.MERGED
    if _partially_absorbed(git, patch):
        return PatchStatus.PARTIAL
    return PatchStatus.CONFLICT


def _renames(git: Git, patch: Patch) -> list[tuple[str, str]]:
    """(path the patch names, path the merge changed instead) for HEAD's commit."""
    changed = git.out("diff", "--name-only", "HEAD~1", "HEAD").splitlines()
    named = set(patch.files)
    lost = [f for f in patch.files if f not in changed]
    gained = [f for f in changed if f not in named]
    return list(zip(lost, gained, strict=False))


def commit_patch(
    git: Git, patch: Patch, *, exact: bool = False
) -> tuple[PatchStatus, str]:
    """Apply `patch` on HEAD as one commit; on failure the tree is back at HEAD.

    With `exact` (the pin) a patch must land on the paths it names: git's 3-way
    fallback finds the old blob by its `index` line and can follow it to another
    file, which is useful on a newer release (and said so), never on the pin.
    """
    if _check_apply(git, patch.path):
        result = git.run(*_AM, str(patch.path), check=False)
        if result.ok:
            return PatchStatus.APPLIED, ""
        _abort_am(git)
        return PatchStatus.CONFLICT, _last_line(result.stderr or result.stdout)
    if _check_apply(git, patch.path, "-R"):
        return PatchStatus.ABSORBED, "reverse-applies: upstream already has it"
    result = git.run(*_AM, "-3", str(patch.path), check=False)
    if result.ok:
        renames = _renames(git, patch)
        if not renames:
            return PatchStatus.MERGED, "needed a 3-way merge"
        moved = ", ".join(f"{a} -> {b}" for a, b in renames)
        if not exact:
            return PatchStatus.MERGED, f"followed rename {moved}"
        git.run("reset", "-q", "--hard", "HEAD~1")
        return PatchStatus.CONFLICT, (
            f"does not apply as written: git's 3-way merge moved it ({moved}); "
            "on the pin a patch must name the files it changes"
        )
    text = result.stdout + result.stderr
    _abort_am(git)
    if "No changes" in text or "already applied" in text:
        return PatchStatus.ABSORBED, "empty after a 3-way merge: upstream has it"
    if _partially_absorbed(git, patch):
        return PatchStatus.PARTIAL, "some file diffs are already upstream"
    conflicted = sorted(set(_CONFLICT_FILE.findall(text)))
    if not conflicted:
        # No 3-way merge was possible: name the files whose hunks failed.
        failed = _failed_files(git, patch)
        conflicted = failed or list(patch.files)
    return PatchStatus.CONFLICT, f"conflict in {', '.join(conflicted)}"


def stop_with_markers(git: Git, patch: Patch) -> list[str]:
    """Start `git am -3` of `patch` and leave it stopped for a human.

    Returns the unmerged paths (with conflict markers in the work tree); empty
    when git could not even start a merge, and the change must be made by hand.
    """
    git.run(*_AM, "-3", str(patch.path), check=False)
    return unmerged_paths(git)


def unmerged_paths(git: Git) -> list[str]:
    out = git.run("diff", "--name-only", "--diff-filter=U", check=False).stdout
    return [line for line in out.splitlines() if line]


_MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def files_with_markers(git: Git, paths: Sequence[str]) -> list[str]:
    """Which of `paths` in the work tree still hold conflict markers."""
    found = []
    for rel in paths:
        path = git.repo / rel
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except (OSError, IsADirectoryError):
            continue
        if _MARKER.search(text):
            found.append(rel)
    return found


def _failed_files(git: Git, patch: Patch) -> list[str]:
    out: list[str] = []
    for chunk in _split_by_file(patch.text):
        if not git.run("apply", "--check", "-", check=False, input_text=chunk).ok:
            paths = patch_paths(chunk)
            out.extend(p for p in paths[-1:] if p not in out)
    return out


def declared_absorbed(patch: Patch, upstream_version: str | None) -> str:
    """The patch header's claim that `upstream_version` already has the behaviour.

    Upstream rarely takes a backport byte for byte (other comments, other
    layout), so its diff neither applies nor reverse-applies there; the
    `Applied-Upstream:` field is how the series says so.
    """
    applied = patch.header.get("Applied-Upstream")
    have, want = version_tuple(applied), version_tuple(upstream_version or "")
    if have is None or want is None or want < have:
        return ""
    return f"Applied-Upstream: {applied} (<= {upstream_version})"


def settle(
    git: Git,
    patch: Patch,
    status: PatchStatus,
    detail: str,
    upstream_version: str | None,
) -> tuple[PatchStatus, str]:
    """Apply the header's `Applied-Upstream: X` on release X or later: the patch
    is absorbed there whatever its text does. If it still applied, its commit is
    taken back (upstream has the behaviour; the text need not match).
    """
    claim = declared_absorbed(patch, upstream_version)
    if not claim:
        return status, detail
    if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
        git.run("reset", "-q", "--hard", "HEAD~1")
        return (
            PatchStatus.ABSORBED,
            f"{claim}; its text still applies: its header retires it",
        )
    if status in (PatchStatus.CONFLICT, PatchStatus.PARTIAL):
        return PatchStatus.ABSORBED, f"{claim}; upstream's text differs"
    return status, detail


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def apply_patches(
    git: Git,
    patches: Sequence[Patch],
    *,
    upstream_version: str | None = None,
    exact: bool = False,
    on_patch: ProgressHook | None = None,
) -> list[PatchOutcome]:
    """Commit each patch in order; after a failure, only report the rest.

    Patches after the first failure are still classified against the last good
    state (so one run shows every problem), but none is committed: the tree stays
    at the last fully applied patch. A patch that touches a file of a failed
    patch is `skipped`, since its result would say nothing.
    """
    outcomes: list[PatchOutcome] = []
    failed_files: set[str] = set()
    first_failure = ""
    last_good = git.out("rev-parse", "HEAD")
    try:
        for index, patch in enumerate(patches):
            if on_patch:
                on_patch(patch, index, len(patches))
            if not patch.exists:
                outcomes.append(PatchOutcome(patch.name, PatchStatus.MISSING))
                first_failure = first_failure or patch.name
                continue
            base = dict(name=patch.name, concern=patch.concern, files=patch.files)
            if first_failure:
                if failed_files.intersection(patch.files):
                    outcomes.append(
                        PatchOutcome(
                            **base,
                            status=PatchStatus.SKIPPED,
                            detail=f"touches a file of {first_failure}, which failed",
                        )
                    )
                    continue
                status = classify_patch(git, patch, upstream_version)
                outcomes.append(
                    PatchOutcome(
                        **base,
                        status=status,
                        detail=f"checked only, not committed: {first_failure} failed",
                    )
                )
                continue
            status, detail = commit_patch(git, patch, exact=exact)
            status, detail = settle(git, patch, status, detail, upstream_version)
            commit = ""
            if status in (PatchStatus.APPLIED, PatchStatus.MERGED):
                last_good = commit = git.out("rev-parse", "HEAD")
            elif not status.ok:
                failed_files.update(patch.files)
                first_failure = patch.name
            outcomes.append(
                PatchOutcome(**base, status=status, detail=detail, commit=commit)
            )
    except KeyboardInterrupt:
        _abort_am(git)
        git.run("reset", "-q", "--hard", last_good, check=False)
        raise Interrupted(
            f"interrupted; {git.repo} was reset to the last fully applied patch "
            f"({last_good[:12]})",
            hint="run the same command again to finish",
        ) from None
    return outcomes
