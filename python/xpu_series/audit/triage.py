"""patches/audit.toml: findings accepted with a reason, by file, function and API."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from fnmatch import translate
from functools import cache
from pathlib import Path

from xpu_series.audit.scan_records import CUDA_KINDS, KINDS
from xpu_series.errors import UsageError

_KEYS = {"file", "function", "api", "kind", "reason"}


@cache
def _pattern(pattern: str) -> re.Pattern[str]:
    # fnmatch's own cache holds 256 patterns; audit.toml has more.
    return re.compile(translate(pattern))


def _match(name: str, pattern: str) -> bool:
    return _pattern(pattern).match(name) is not None


@dataclass(frozen=True)
class TriageEntry:
    """One accepted group of findings. `file`, `function` and `api` are shell
    patterns (`*` matches across dots and slashes); `function` and `api` are
    optional and narrow the entry. `kind` names the finding kind it accepts;
    without it, an entry accepts only the CUDA-call kinds (a reason written for
    a torch.cuda call says nothing about a collective or a kernel name). Never
    a line number: lines move."""

    line: int  # where the entry starts in audit.toml (for messages)
    file: str
    reason: str
    function: str = ""
    api: str = ""
    kind: str = ""

    def matches(self, file: str, function: str, api: str, kind: str = "") -> bool:
        if kind and (kind != self.kind if self.kind else kind not in CUDA_KINDS):
            return False
        return (
            _match(file, self.file)
            and (not self.function or _match(function, self.function))
            and (not self.api or _match(api, self.api))
        )

    def describe(self) -> str:
        parts = [self.file]
        if self.function:
            parts.append(f"function {self.function}")
        if self.api:
            parts.append(f"api {self.api}")
        if self.kind:
            parts.append(f"kind {self.kind}")
        return ", ".join(parts)


class TriageIndex:
    """The entries that can match each file, found once per file: an audit asks
    about thousands of findings in a few hundred files."""

    def __init__(self, entries: list[TriageEntry]) -> None:
        self.entries = entries
        self._by_file: dict[str, list[int]] = {}

    def first_match(
        self, file: str, function: str, api: str, kind: str = ""
    ) -> int | None:
        """The index of the first entry that matches, or None."""
        candidates = self._by_file.get(file)
        if candidates is None:
            candidates = [i for i, e in enumerate(self.entries) if _match(file, e.file)]
            self._by_file[file] = candidates
        for i in candidates:
            if self.entries[i].matches(file, function, api, kind):
                return i
        return None


def _entry_lines(text: str) -> list[int]:
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip().startswith("[[accept]]")
    ]


def load_triage(path: Path) -> list[TriageEntry]:
    """The entries of `path` (none when it does not exist); a malformed file is a
    usage error naming the line."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(
            f"{path} is not valid TOML: {exc}",
            hint="fix that line; each entry is [[accept]] with file, reason and "
            "optionally function, api and kind",
        ) from None
    extra = sorted(set(data) - {"accept"})
    if extra:
        raise UsageError(
            f"{path}: unknown table {extra[0]!r} (only [[accept]] entries)",
            hint="put each accepted finding in an [[accept]] entry",
        )
    lines = _entry_lines(text)
    entries: list[TriageEntry] = []
    raw_entries = data.get("accept", [])
    if not isinstance(raw_entries, list):
        raise UsageError(f"{path}: 'accept' must be [[accept]] entries")
    for index, raw in enumerate(raw_entries):
        line = lines[index] if index < len(lines) else 0
        where = f"{path}:{line}"
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise UsageError(
                f"{where}: unknown key {unknown[0]!r} in [[accept]]",
                hint="an entry has file, reason, and optionally function, api and "
                "kind (never a line number: lines move between releases)",
            )
        for key in ("file", "reason"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise UsageError(
                    f"{where}: [[accept]] needs a non-empty {key!r}",
                    hint="say which file and why the finding is accepted",
                )
        for key in ("function", "api", "kind"):
            if key in raw and not isinstance(raw[key], str):
                raise UsageError(f"{where}: {key!r} must be a string")
        kind = raw.get("kind", "").strip()
        if kind and kind not in KINDS:
            raise UsageError(
                f"{where}: unknown kind {kind!r} in [[accept]]",
                hint=f"the kinds are {', '.join(KINDS)} (without kind, an entry "
                "accepts the CUDA-call kinds)",
            )
        entries.append(
            TriageEntry(
                line=line,
                file=raw["file"].strip(),
                reason=" ".join(raw["reason"].split()),
                function=raw.get("function", "").strip(),
                api=raw.get("api", "").strip(),
                kind=kind,
            )
        )
    return entries
