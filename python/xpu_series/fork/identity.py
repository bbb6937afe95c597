"""What tells which series an install runs: its record, plugin and entry point."""

# The wheel and the overlay write these same bytes into an install, so both go
# through here; the plugin then reads one record shape whichever way it came.

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from xpu_series import __version__
from xpu_series.fork.plugin import RECORD_NAME as RECORD_NAME
from xpu_series.git import Git
from xpu_series.overlay.plan import local_version
from xpu_series.project import Project
from xpu_series.stack.series import Series

PLUGIN_PACKAGE = "sglang_xpu_series"  # the plugin's top-level package
PLUGIN_MODULE = f"{PLUGIN_PACKAGE}/__init__.py"  # its one file, as an install path
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "xpu_series"  # what SGLANG_PLUGINS names to keep it
ENTRY_POINTS = "entry_points.txt"  # in the dist-info
# RECORD_NAME (imported above) is the plugin's: it owns the name of what it reads.


def revision(root: Path) -> tuple[str, bool]:
    """The project's git HEAD and whether patches/ differs from it ('' and False
    where there is no git or no repository: nothing to record)."""
    git = Git(root)
    try:
        head = git.run("rev-parse", "--verify", "-q", "HEAD", check=False)
        if not head.ok:
            return "", False
        dirty = git.run("status", "--porcelain", "--", "patches", check=False)
    except OSError:
        return "", False
    return head.stdout.strip(), bool(dirty.stdout.strip())


def plugin_source() -> bytes:
    """The plugin module's bytes: an install carries them as its own package."""
    return Path(__file__).with_name("plugin.py").read_bytes()


def with_plugin(entry_points: bytes | None) -> bytes:
    """entry_points.txt gaining the plugin in its group (the group is added, or
    the entry goes right under its header)."""
    line = f"{PLUGIN_NAME} = {PLUGIN_PACKAGE}:announce\n"
    text = (entry_points or b"").decode("utf-8")
    header = f"[{PLUGIN_GROUP}]"
    lines = text.splitlines(keepends=True)
    for i, existing in enumerate(lines):
        if existing.strip() == header:
            return "".join([*lines[: i + 1], line, *lines[i + 1 :]]).encode("utf-8")
    if text and not text.endswith("\n"):
        text += "\n"
    sep = "\n" if text.strip() else ""
    return f"{text}{sep}{header}\n{line}".encode()


def describe_series(
    project: Project, release: str, series: Series, rev: str | None
) -> dict[str, Any]:
    """The record's common part: the series on `release`, its label, the tool and
    its revision (`rev`, else git's)."""
    recorded, dirty = (rev, False) if rev else revision(project.root)
    digest = series.digest()
    return {
        "format": 1,
        "tool": f"xpu-series {__version__}",
        "release": release,
        "version": local_version(release, digest),
        "series_sha256": digest,
        "pin": {"version": project.pin.version, "sha256": project.pin.sha256},
        "patches": [
            {
                "name": str(p.name),
                "sha256": hashlib.sha256(p.path.read_bytes()).hexdigest(),
                "retired": p.retired,
            }
            for p in series.patches
        ],
        "revision": recorded,
        "revision_dirty": dirty,
        "plugin": {"group": PLUGIN_GROUP, "name": PLUGIN_NAME},
    }


def record_bytes(record: dict[str, Any]) -> bytes:
    """The record as the plugin reads it from the dist-info."""
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
