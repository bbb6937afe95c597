"""An exclusive lock per tree, so two runs never apply into the same tree at once."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xpu_series.errors import TreeError


def lock_path(tree: Path) -> Path:
    # Beside the tree, not inside it: the tree may not exist yet, and the lock
    # must never show up as an untracked file in it.
    return tree.parent / f".{tree.name}.xpu-series.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _held(holder: dict) -> bool:
    """Whether the holder may still run: its process lives, or it is on another
    host (which cannot be asked)."""
    pid = int(holder.get("pid", 0) or 0)
    if pid and holder.get("host") == socket.gethostname():
        return _alive(pid)
    return True


def described(found: dict) -> str:
    """A holder as messages name it: pid, host, command and since when."""
    return (
        f"pid {found.get('pid') or '?'} on {found.get('host', '?')} "
        f"('{found.get('command', '?')}', since {found.get('since', '?')})"
    )


def holder(tree: Path) -> dict | None:
    """Who holds the tree's lock (pid, host, command, since) while it may still
    run; None when no one does or its process is gone."""
    path = lock_path(tree)
    if not path.exists():
        return None
    found = _read(path)
    return found if _held(found) else None


@contextmanager
def tree_lock(tree: Path, command: str) -> Iterator[None]:
    """Hold the tree's lock; a stale lock (its process is gone) is taken over."""
    path = lock_path(tree)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    for _attempt in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            found = _read(path)
            pid = int(found.get("pid", 0) or 0)
            if pid and not _held(found):
                path.unlink(missing_ok=True)
                continue
            raise TreeError(
                f"{tree} is locked by {described(found)}",
                hint=f"wait for it to finish; if that process is gone, remove {path}",
            ) from None
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
