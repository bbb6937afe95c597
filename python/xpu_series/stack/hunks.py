"""Apply a format-patch to file contents in memory, exactly, without git.

The overlay writes into an installed sglang where git may be absent. It needs no
fuzz: each file's pre-image is checked against the blob id the patch names
(`index OLD..NEW`) before any hunk is applied, and the result is checked against
the post-image id, so a hunk either lands where it says or the patch is refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from xpu_series.errors import SeriesError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: [0-7]+)?$")
ZERO_BLOB = "0" * 40


def preimages(text: str) -> set[str]:
    """The blob ids a patch's `index OLD..NEW` lines name as what it applies to.

    >>> sorted(preimages("index 1a2b..3c4d 100644\\n--- a/x\\nindex 5e6f..7a8b\\n"))
    ['1a2b', '5e6f']
    """
    return {m.group(1) for line in text.splitlines() if (m := _INDEX.match(line))}


def blob_id(data: bytes) -> str:
    """The git blob id of `data` (what `git hash-object` prints).

    >>> blob_id(b"")
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
    """
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def same_blob(named: str, data: bytes | None) -> bool:
    """Whether `data` (None: absent) is the blob a patch names, full or abbreviated."""
    if data is None:
        return set(named) == {"0"}
    return blob_id(data).startswith(named) and set(named) != {"0"}


@dataclass
class Hunk:
    old_start: int
    old_lines: list[bytes] = field(default_factory=list)
    new_lines: list[bytes] = field(default_factory=list)


@dataclass
class FileDiff:
    """One file of a patch: where it goes, its blob ids and its hunks."""

    path: str
    old_blob: str
    new_blob: str
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def creates(self) -> bool:
        return set(self.old_blob) == {"0"}

    @property
    def deletes(self) -> bool:
        return set(self.new_blob) == {"0"}


def _strip_prefix(path: str, side: str) -> str:
    return path[2:] if path.startswith(f"{side}/") else path


def parse_patch(text: str, name: str = "patch") -> list[FileDiff]:
    """Every file diff of a format-patch, in order; refuses what it cannot apply."""
    lines = text.encode("utf-8").splitlines(keepends=True)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i].decode("utf-8", "replace").rstrip("\n")
        i += 1
        if not line.startswith("diff --git "):
            continue
        path = _strip_prefix(line.rsplit(" ", 1)[-1], "b")
        current: FileDiff | None = None
        while i < len(lines):
            meta = lines[i].decode("utf-8", "replace").rstrip("\n")
            if meta.startswith(("diff --git ", "@@")):
                break
            i += 1
            if meta.startswith(("rename ", "copy ", "GIT binary patch", "Binary ")):
                raise SeriesError(
                    f"{name} changes {path} in a way the overlay cannot write "
                    f"({meta.split(' ', 2)[0:2]!r})",
                    hint="keep the series to text edits of .py files",
                )
            index = _INDEX.match(meta)
            if index:
                current = FileDiff(path, index.group(1), index.group(2))
        if current is None:
            raise SeriesError(
                f"{name} has no 'index OLD..NEW' line for {path}",
                hint="re-export the series with 'xpu-series refresh'",
            )
        while i < len(lines) and lines[i].startswith(b"@@"):
            i = _read_hunk(lines, i, current, name)
        files.append(current)
    return files


def _read_hunk(lines: list[bytes], i: int, diff: FileDiff, name: str) -> int:
    match = _HUNK.match(lines[i].decode("utf-8", "replace"))
    if not match:
        raise SeriesError(f"{name}: malformed hunk header in {diff.path}")
    old_count = int(match.group(2) or 1)
    new_count = int(match.group(4) or 1)
    hunk = Hunk(int(match.group(1)))
    i += 1
    last: list[bytes] | None = None
    while i < len(lines) and (old_count > 0 or new_count > 0 or _is_eof(lines[i])):
        raw = lines[i]
        i += 1
        if _is_eof(raw):
            # "\ No newline at end of file" belongs to the line before it.
            if last:
                last[-1] = last[-1].rstrip(b"\n")
            continue
        # An empty context line may have lost its leading space in transit.
        kind, body = (b" ", raw) if raw in (b"\n", b"\r\n") else (raw[:1], raw[1:])
        if kind == b" ":
            hunk.old_lines.append(body)
            hunk.new_lines.append(body)
            old_count -= 1
            new_count -= 1
            last = hunk.new_lines
        elif kind == b"-":
            hunk.old_lines.append(body)
            old_count -= 1
            last = hunk.old_lines
        elif kind == b"+":
            hunk.new_lines.append(body)
            new_count -= 1
            last = hunk.new_lines
        else:
            raise SeriesError(f"{name}: hunk in {diff.path} ends early")
        if kind == b" " and i < len(lines) and _is_eof(lines[i]):
            # A context line without newline ends both sides.
            hunk.old_lines[-1] = hunk.old_lines[-1].rstrip(b"\n")
    if old_count or new_count:
        raise SeriesError(f"{name}: hunk in {diff.path} is truncated")
    diff.hunks.append(hunk)
    return i


def _is_eof(raw: bytes) -> bool:
    return raw.startswith(b"\\ ")


def apply_diff(diff: FileDiff, data: bytes | None, name: str) -> bytes | None:
    """The post-image of one file; raises SeriesError unless every hunk fits."""
    if not same_blob(diff.old_blob, data):
        raise SeriesError(
            f"{name}: {diff.path} is not the file this patch was made against"
        )
    if diff.deletes:
        return None
    lines = (data or b"").splitlines(keepends=True)
    out: list[bytes] = []
    at = 0
    for hunk in diff.hunks:
        start = max(hunk.old_start - 1, 0) if hunk.old_lines else hunk.old_start
        if start < at or lines[start : start + len(hunk.old_lines)] != hunk.old_lines:
            raise SeriesError(f"{name}: a hunk of {diff.path} does not fit")
        out.extend(lines[at:start])
        out.extend(hunk.new_lines)
        at = start + len(hunk.old_lines)
    out.extend(lines[at:])
    result = b"".join(out)
    if not same_blob(diff.new_blob, result):
        raise SeriesError(
            f"{name}: {diff.path} came out different from the blob the patch names"
        )
    return result
