"""What a human does at a stopped apply or rebase: resolve and --continue, --skip
the patch, or --abort everything back to how it was (the Runner's hand steps)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from xpu_series.errors import TreeError, UsageError
from xpu_series.result import ExitCode, PatchStatus
from xpu_series.stack.engine import (
    _abort_am,
    _am_in_progress,
    files_with_markers,
    unmerged_paths,
)
from xpu_series.stack.operation import (
    ORIG_HEAD_REF,
    ORIG_UPSTREAM_REF,
    copy_patches,
    snapshot,
    swap_in,
)
from xpu_series.stack.series import Patch
from xpu_series.stack.tree import APPLIED_REF, UPSTREAM_TAG, partial_trees, repair

if TYPE_CHECKING:
    from xpu_series.git import Git
    from xpu_series.project import Project
    from xpu_series.stack.operation import Operation, OperationStore

# The detail of a stop the plan's `edit` asked for.
EDIT_STOP = "stopped to edit (the plan asked)"


class Unresolved(TreeError):
    """--continue while the stopped patch still has unmerged files or conflict
    markers: the operation stays stopped at a conflict a human must resolve."""

    exit_code = ExitCode.CONFLICT


class HandSteps:
    """The steps of an operation that follow a human: the Runner's state (its
    operation, tree, store and project) is what they read and save."""

    op: Operation
    git: Git
    store: OperationStore
    project: Project

    def patch(self, name: str) -> Patch:
        raise NotImplementedError

    def save(self, phase: str | None = None) -> None:
        raise NotImplementedError

    def _done(
        self, patch: Patch, status: PatchStatus, detail: str, commit: str
    ) -> dict:
        raise NotImplementedError

    # -- resume --------------------------------------------------------------

    def resolve_current(self) -> None:
        """Commit the human's resolution of the stopped patch, or refuse."""
        op, git = self.op, self.git
        patch = self.patch(op.current)
        if op.current_detail.endswith(EDIT_STOP):
            self._take_edit(patch)
            return
        unmerged = unmerged_paths(git)
        marked = files_with_markers(git, sorted({*patch.files, *unmerged}))
        if unmerged or marked:
            raise Unresolved(
                f"{op.current} is not resolved yet: "
                + "; ".join(
                    part
                    for part in (
                        f"unmerged: {', '.join(unmerged)}" if unmerged else "",
                        f"conflict markers in {', '.join(marked)}" if marked else "",
                    )
                    if part
                ),
                hint=f"edit the files in {op.tree}, 'git -C {op.tree} add' them, "
                f"then run 'xpu-series {op.kind} --continue'",
            )
        head = git.rev("HEAD")
        if _am_in_progress(git):
            result = git.run("am", "--continue", check=False)
            if not result.ok:
                text = (result.stdout + result.stderr).strip().splitlines()
                if any("No changes" in line for line in text):
                    raise TreeError(
                        f"nothing is staged for {op.current}: its change is not "
                        f"in the index of {op.tree}",
                        hint=f"make the change, 'git -C {op.tree} add' it, then run "
                        f"'xpu-series {op.kind} --continue'",
                    )
                raise TreeError(
                    f"git am --continue failed for {op.current}: "
                    f"{text[-1] if text else 'no output'}",
                    hint=f"'git -C {op.tree} add' the resolved files; if upstream "
                    f"already has this change, run 'xpu-series {op.kind} --skip'",
                )
        new_head = git.rev("HEAD")
        if new_head == head or new_head == op.last_good:
            raise TreeError(
                f"{op.current} was not committed in {op.tree}",
                hint=f"apply its change there and 'git add' it, then run "
                f"'xpu-series {op.kind} --continue' (or --skip to drop it)",
            )
        done = self._done(patch, PatchStatus.MERGED, "resolved by hand", new_head or "")
        # Recorded at the write-out, keyed by the tree the patch met.
        done["resolved_on"] = git.out("rev-parse", f"{op.last_good}^{{tree}}")
        op.done.append(done)
        op.last_good = new_head or op.last_good
        op.todo.pop(0)
        op.current = op.current_detail = ""
        self.save("patches")

    def _take_edit(self, patch: Patch) -> None:
        """--continue after an `edit` stop: HEAD (amended or not) is the patch."""
        op, git = self.op, self.git
        if git.dirty_paths():
            raise TreeError(
                f"{op.tree} has changes that are not committed",
                hint=f"'git -C {op.tree} commit --amend -a' them (or 'git -C "
                f"{op.tree} checkout .' to drop them), then run "
                f"'xpu-series {op.kind} --continue'",
            )
        head = git.out("rev-parse", "HEAD")
        if head == op.last_good:
            raise TreeError(
                f"{op.current} has no commit on {op.tree} any more",
                hint=f"use 'xpu-series {op.kind} --skip --reason TEXT' to drop it",
            )
        status = op.current_detail.split(":", 1)[0]
        edited = git.out("rev-parse", "HEAD^{tree}") != git.out(
            "rev-parse", f"{op.carried}^{{tree}}"
        )
        done = self._done(
            patch,
            PatchStatus.MERGED if edited else PatchStatus(status),
            "edited by hand" if edited else "",
            head,
        )
        if edited:  # an edit is recorded and replayed like a resolution
            done["resolved_on"] = git.out("rev-parse", f"{op.last_good}^{{tree}}")
        op.done.append(done)
        op.last_good = head
        op.todo.pop(0)
        op.current = op.current_detail = op.carried = ""
        self.save("patches")

    def skip_current(self, record: dict) -> None:
        op, git = self.op, self.git
        if not op.stopped:
            raise UsageError(
                f"nothing to skip: the {op.kind} is not stopped at a patch",
                hint=f"run 'xpu-series {op.kind} --continue'",
            )
        _abort_am(git)
        git.run("reset", "-q", "--hard", op.last_good)
        patch = self.patch(op.current)
        done = self._done(patch, PatchStatus.SKIPPED, record.get("reason", ""), "")
        done.update(record)
        op.done.append(done)
        op.todo.pop(0)
        op.current = op.current_detail = ""
        self.save("patches")

    def reset_to_last_good(self) -> None:
        """After an interrupt in phase patches: drop the half-made patch."""
        repair(self.git)
        self.git.run("reset", "-q", "--hard", self.op.last_good)

    # -- abort ---------------------------------------------------------------

    def abort(self) -> list[str]:
        """Put the tree and patches/ back as they were when the operation began."""
        op, git, store = self.op, self.git, self.store
        notes: list[str] = []
        tree = Path(op.tree)
        notes += self._keep_hand_work()
        if op.orig.get("existed"):
            if git.is_repo():
                repair(git)
            orig = op.orig
            if orig.get("upstream"):
                git.run("update-ref", f"refs/tags/{UPSTREAM_TAG}", orig["upstream"])
            if orig.get("head"):
                if orig.get("branch"):
                    git.run("checkout", "-q", "-f", "-B", orig["branch"], orig["head"])
                else:
                    git.run("checkout", "-q", "-f", "--detach", orig["head"])
                git.run("reset", "-q", "--hard", orig["head"])
            if orig.get("applied_ref"):
                git.run("update-ref", APPLIED_REF, orig["applied_ref"])
            else:
                git.run("update-ref", "-d", APPLIED_REF, check=False)
            store.restore_record(git)
            for ref in (ORIG_HEAD_REF, ORIG_UPSTREAM_REF):
                git.run("update-ref", "-d", ref, check=False)
        else:
            for path in [tree, *partial_trees(tree)]:
                if path.exists():
                    shutil.rmtree(path)
            notes.append(f"removed {tree}, which the {op.kind} had created")
        notes += self.restore_patches()
        return notes

    def _keep_hand_work(self) -> list[str]:
        """Put the commits a human resolved on a branch before the tree is reset:
        --abort undoes the operation, not the work (it would be in the reflog only)."""
        op, git = self.op, self.git
        resolved = [d["name"] for d in op.done if d.get("resolved_on")]
        if not resolved or not git.is_repo() or not op.last_good:
            return []
        branch = f"xpu-series/aborted-{op.kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        if not git.run("branch", "-f", branch, op.last_good, check=False).ok:
            return []
        return [
            f"your resolution of {', '.join(resolved)} is kept on branch {branch} "
            f"(git -C {op.tree} log {branch})"
        ]

    def restore_patches(self) -> list[str]:
        """patches/ byte for byte as at the start; anything the user changed there
        meanwhile is kept aside, never lost."""
        store, patches = self.store, self.project.patches_dir
        backup = store.patches_backup
        if snapshot(patches) == snapshot(backup):
            return []
        notes = []
        if patches.exists() and self.op.phase != "write":
            keep = self.project.build_dir / (
                f"aborted-{self.op.kind}-{time.strftime('%Y%m%d-%H%M%S')}"
            )
            copy_patches(patches, keep / "patches")
            notes.append(f"your edits to patches/ were kept in {keep / 'patches'}")
        staging = store.dir / "patches.restore"
        copy_patches(backup, staging)
        swap_in(staging, patches, store.dir / "patches.replaced")
        notes.append("patches/ restored byte for byte")
        return notes
