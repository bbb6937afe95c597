"""Hard-link the settled entries of a content-addressed cache that others write.

Every writer of `build/cache` builds an entry beside its final name, under a name
that starts with a dot (`.KEY.tmp`, `.NAME.part`, `.base-*`, `.download-*`), and
renames it in: an entry with its final name is whole (a later write replaces it
whole). `cp -al` of such a cache while a writer works fails on a staging file
renamed away between the listing and the link ("cannot stat"). `link_settled`
links only what has its final name, and takes an entry that vanishes between
the two as one it never saw: a second project then reads what was settled when
it looked, and nothing half-written. Across filesystems (a scratch project on a
tmpfs) a file is copied instead: a link cannot cross, and the entry is settled,
so its copy is whole too.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


def link_settled(source: Path, dest: Path) -> int:
    """Hard-link every settled file under `source` to the same place under `dest`
    (made as needed; copied where `dest` is on another filesystem); the number
    of files linked or copied. A missing `source` links none."""
    try:
        entries = list(os.scandir(source))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    linked = 0
    for entry in entries:
        if entry.name.startswith("."):
            continue  # being written: it is renamed in when whole
        target = dest / entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                linked += link_settled(Path(entry.path), target)
            else:
                _link_or_copy(entry.path, target)
                linked += 1
        except FileNotFoundError:
            continue  # replaced or removed since the listing
    return linked


def _link_or_copy(source: str, target: Path) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copy2(source, target, follow_symlinks=False)
