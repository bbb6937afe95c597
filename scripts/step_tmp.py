"""Where the steps of scripts/test keep their temporary files: on a tmpfs when
the machine has one with room, in a folder made for the run and removed after
it. Standard library only (see run_steps.py).

Why: this machine's root filesystem is ext4 without a journal, and there ext4
skips every inode freed in the last 5 s (300 s while its inode table block is
dirty) when it allocates one, reading inode table blocks as it goes. A run
creates and deletes files by the hundred thousand (worktrees, pytest's
folders, git's objects), so each new file costs more as the run goes on. In a
perf profile of test/unit/test_apply.py, half of git's CPU was kernel time, most
of it in ext4's find_inode_bit, recently_deleted and find_get_block. The
tool's own tests, side by side: 22.8 s of system time with TMPDIR on /tmp,
13.1 s on /dev/shm (docs/design.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

# Where a tmpfs is looked for, and how much room it must have left.
CANDIDATES = (Path("/dev/shm"),)
MIN_FREE = 8 << 30
PREFIX = "xpu-series-steps-"


def tmpfs_mounts(mounts: str) -> set[Path]:
    """The mount points of every tmpfs in /proc/mounts' text.

    >>> sorted(tmpfs_mounts("tmpfs /dev/shm tmpfs rw 0 0\\n/dev/vda / ext4 rw 0 0"))
    [PosixPath('/dev/shm')]
    """
    found = set()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "tmpfs":
            found.add(Path(fields[1].replace("\\040", " ")))
    return found


def _mounts() -> str:
    try:
        return Path("/proc/mounts").read_text()
    except OSError:
        return ""


def scratch_dir(
    environ: Mapping[str, str],
    candidates: tuple[Path, ...] | None = None,
    mounts: str | None = None,
) -> Path | None:
    """A new folder for the run's temporary files on a tmpfs with MIN_FREE
    bytes free, or None: when the caller set TMPDIR (theirs is kept), or no
    candidate is a writable tmpfs with room."""
    if environ.get("TMPDIR"):
        return None
    tmpfs = tmpfs_mounts(_mounts() if mounts is None else mounts)
    for place in CANDIDATES if candidates is None else candidates:
        if place not in tmpfs or not os.access(place, os.W_OK):
            continue
        try:
            stat = os.statvfs(place)
        except OSError:
            continue
        if stat.f_bavail * stat.f_frsize < MIN_FREE:
            continue
        return Path(tempfile.mkdtemp(prefix=PREFIX, dir=place))
    return None


def remove(folder: Path | None) -> None:
    """Remove the run's folder (what its steps left there goes with it)."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
