"""The on-disk state of a multi-step operation (apply, rebase), as git keeps
`rebase-apply/`: one at a time per project, resumable, reversible byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import TreeError
from xpu_series.git import Git
from xpu_series.lock import described, holder

STATE = "state.json"
# A byte copy of patches/ taken before anything changes: the source of the patches
# the operation carries, and what --abort puts back.
PATCHES_BACKUP = "patches.orig"
RECORD_BACKUP = "record.orig"
# Where the operation points tree refs it must be able to restore.
ORIG_HEAD_REF = "refs/xpu-series/orig-head"
ORIG_UPSTREAM_REF = "refs/xpu-series/orig-upstream"


def article(words: str) -> str:
    """`words` after 'a' or 'an'.

    >>> article("rebase onto 0.5.23"), article("apply")
    ('a rebase onto 0.5.23', 'an apply')
    """
    return ("an " if words[:1] in ("a", "e", "i", "o", "u") else "a ") + words


def op_dir(build_dir: Path) -> Path:
    return build_dir / "operation"


@dataclass
class Operation:
    """What an apply or rebase has done so far, and what is left.

    `phase` is the step that was under way when the state was last written:
    fetch, base, patches, stopped (a patch needs a human), write (rebase only:
    the new patches/ is being put in place). Every step can be redone from the
    state alone, so a killed process loses nothing.
    """

    kind: str
    tree: str
    phase: str = "start"
    target: dict[str, Any] = field(default_factory=dict)
    orig: dict[str, Any] = field(default_factory=dict)
    todo: list[str] = field(default_factory=list)
    done: list[dict[str, Any]] = field(default_factory=list)
    current: str = ""
    current_detail: str = ""
    last_good: str = ""
    # The maintainer's decisions (plan.Decision.to_json), by patch, in plan order.
    plan: list[dict[str, Any]] = field(default_factory=list)
    # At a plan's `edit` stop: the commit as carried, before the human's edit.
    carried: str = ""
    started: str = ""
    pid: int = 0

    @property
    def stopped(self) -> bool:
        return self.phase == "stopped"

    def what(self) -> str:
        """'apply onto sglang 0.5.23', say."""
        return f"{self.kind} onto sglang {self.target.get('version', '?')}"

    def describe(self) -> str:
        what = self.what()
        if self.stopped:
            return f"{what} stopped at {self.current} ({self.current_detail})"
        return f"{what} interrupted during {self.phase}"

    def described(self) -> str:
        """describe() with its article: 'an apply ...', 'a rebase ...'."""
        return article(self.describe())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class OperationStore:
    """Reads and writes the state folder of one project (`build/operation/`)."""

    def __init__(self, build_dir: Path, patches_dir: Path) -> None:
        self.dir = op_dir(build_dir)
        self.patches_dir = patches_dir

    @property
    def patches_backup(self) -> Path:
        return self.dir / PATCHES_BACKUP

    def load(self) -> Operation | None:
        try:
            data = json.loads((self.dir / STATE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise TreeError(
                f"{self.dir / STATE} is unreadable ({exc})",
                hint=f"move {self.dir} aside; it holds a copy of patches/ as it was",
            ) from None
        return Operation(**data)

    def save(self, op: Operation) -> None:
        """Write the state atomically: a reader sees the old or the new, never half."""
        tmp = self.dir / f".{STATE}.tmp"
        tmp.write_text(json.dumps(op.to_json(), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.dir / STATE)

    def begin(self, op: Operation, git: Git | None) -> None:
        """Snapshot patches/ and the tree's record, then write the state.

        The state file is written last: until it exists there is no operation,
        and a leftover folder without it is cleared by the next begin.
        """
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        copy_patches(self.patches_dir, self.patches_backup)
        if git is not None:
            record = git.git_dir() / "xpu-series.json"
            if record.is_file():
                shutil.copyfile(record, self.dir / RECORD_BACKUP)
        op.started = op.started or time.strftime("%Y-%m-%d %H:%M:%S")
        op.pid = os.getpid()
        self.save(op)

    def end(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def restore_record(self, git: Git) -> None:
        backup = self.dir / RECORD_BACKUP
        record = git.git_dir() / "xpu-series.json"
        if backup.is_file():
            shutil.copyfile(backup, record)
        else:
            record.unlink(missing_ok=True)


def require_idle(store: OperationStore, verb: str) -> None:
    """Refuse to start `verb` while an operation runs, is stopped or was
    interrupted."""
    op = store.load()
    if op is None:
        return
    running = holder(Path(op.tree)) if op.tree else None
    if running is not None:
        # Its process still holds the tree: nothing to continue or abort yet.
        raise TreeError(
            f"cannot {verb}: {article(op.what())} is running ({described(running)})",
            hint=f"wait for it to finish, then run 'xpu-series {verb}' again",
        )
    raise TreeError(
        f"cannot {verb}: {op.described()} is in progress",
        hint=f"finish it with 'xpu-series {op.kind} --continue', "
        f"or undo it with 'xpu-series {op.kind} --abort'",
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` by relative path (for byte-for-byte checks)."""
    if not directory.is_dir():
        return {}
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def copy_patches(source: Path, dest: Path) -> None:
    """Copy a patches folder (files and subfolders) byte for byte via a staging
    folder, so `dest` is either absent or complete."""
    staging = dest.with_name(f".{dest.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(source, staging, copy_function=shutil.copy2)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(staging, dest)


def swap_in(new: Path, target: Path, old: Path) -> None:
    """Put folder `new` at `target`; what was at `target` goes to `old`.

    Two renames on one filesystem. If the process dies between them, `target`
    is absent and `new` still complete: the caller's --continue or --abort
    redoes the swap from its own copies.
    """
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
