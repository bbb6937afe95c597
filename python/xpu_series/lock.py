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
            try:
                holder = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                holder = {}
            pid = int(holder.get("pid", 0) or 0)
            same_host = holder.get("host") == me["host"]
            if pid and same_host and not _alive(pid):
                path.unlink(missing_ok=True)
                continue
            raise TreeError(
                f"{tree} is locked by pid {pid or '?'} on {holder.get('host', '?')} "
                f"('{holder.get('command', '?')}', since {holder.get('since', '?')})",
                hint=f"wait for it to finish; if that process is gone, remove {path}",
            ) from None
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
