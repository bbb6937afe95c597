"""Parse a git format-patch file: its subject, description, DEP-3 fields and paths."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FIELD = re.compile(r"^([A-Z][A-Za-z-]+):\s*(.*)$")
# Fields we interpret; any other `Key: value` line in the description is kept verbatim.
KNOWN_FIELDS = (
    "Upstream-Status",
    "Applied-Upstream",
    # The first release a patch applies to (a fix of code older releases lack).
    "Applies-From",
    "Forwarded",
    "Concern",
    "Origin",
    "Tests",
    "Fast-Tests",
)
# DEP-3's values: Pending, Submitted [where], Backport [version], Inappropriate [why].
_STATUS = re.compile(
    r"^(Pending|Submitted( \[[^\]]+\])?|Backport \[[^\]]+\]|Inappropriate \[[^\]]+\])$"
)
_BACKPORT = re.compile(r"^Backport \[([^\]]+)\]$")


@dataclass(frozen=True)
class PatchHeader:
    """The reviewer-facing part of a patch file."""

    subject: str
    description: str
    fields: tuple[tuple[str, str], ...] = field(default=())

    def get(self, key: str) -> str:
        for name, value in self.fields:
            if name == key:
                return value
        return ""

    def get_all(self, key: str) -> list[str]:
        return [value for name, value in self.fields if name == key]

    @property
    def concern(self) -> str:
        return self.get("Concern")

    def _listed(self, key: str) -> list[str]:
        out: list[str] = []
        for value in self.get_all(key):
            out.extend(v for v in value.replace(",", " ").split() if v)
        return out

    @property
    def tests(self) -> list[str]:
        return self._listed("Tests")

    @property
    def fast_tests(self) -> list[str]:
        """What runs many times (per mutant in `verify --mutants`, per release in
        `matrix --behaviour`): `Fast-Tests:` when the patch names some, else its
        `Tests:`. A patch whose `Tests:` start real servers names the ones that do
        not; `verify` still runs all of `Tests:` with and without the patch.

        >>> fields = (("Tests", "t/a.py t/b.py"), ("Fast-Tests", "t/a.py::Fast"))
        >>> PatchHeader("s", "d", fields).fast_tests
        ['t/a.py::Fast']
        """
        return self._listed("Fast-Tests") or self.tests


def parse_header(text: str) -> PatchHeader:
    """Split the mail header and the commit message out of a format-patch file.

    >>> h = parse_header("From: a <a@b>\\nSubject: [XPU] Fix it\\n\\nWhy.\\n\\n"
    ...     "Concern: device-gates\\nTests: t/a.py\\nTests: t/b.py\\n---\\n")
    >>> (h.subject, h.concern, h.tests)
    ('[XPU] Fix it', 'device-gates', ['t/a.py', 't/b.py'])
    """
    lines = text.splitlines()
    subject_parts: list[str] = []
    i = 0
    in_subject = False
    while i < len(lines) and lines[i].strip():
        line = lines[i]
        if line.startswith("Subject:"):
            subject_parts = [line[len("Subject:") :].strip()]
            in_subject = True
        elif in_subject and line[:1] in (" ", "\t"):
            subject_parts.append(line.strip())
        else:
            in_subject = False
        i += 1
    body: list[str] = []
    for line in lines[i + 1 :]:
        if line == "---" or line.startswith("diff --git "):
            break
        body.append(line)
    fields: list[tuple[str, str]] = []
    description: list[str] = []
    for line in body:
        match = _FIELD.match(line)
        if match and match.group(1) in KNOWN_FIELDS:
            fields.append((match.group(1), match.group(2).strip()))
        else:
            description.append(line)
    return PatchHeader(
        subject=" ".join(subject_parts),
        description="\n".join(description).strip(),
        fields=tuple(fields),
    )


def header_problems(header: PatchHeader) -> list[str]:
    """What a reviewer would reject in a header (empty when it is well formed)."""
    problems: list[str] = []
    if not header.subject:
        problems.append("has no Subject line")
    elif not header.subject.startswith("[XPU] "):
        problems.append(f"subject {header.subject!r} does not start with '[XPU] '")
    if not header.description:
        problems.append("has no description for a reviewer")
    status = header.get("Upstream-Status")
    if not status:
        problems.append("has no Upstream-Status field")
    elif not _STATUS.match(status):
        problems.append(
            f"Upstream-Status {status!r} is not one of: Pending, Submitted [where], "
            "Backport [version], Inappropriate [reason]"
        )
    if not header.concern:
        problems.append("has no Concern field")
    return problems


def _strip_prefix(raw: str, prefix: str) -> str:
    raw = raw.strip()
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    if raw.startswith(prefix):
        raw = raw[len(prefix) :]
    return raw


def patch_paths(text: str) -> list[str]:
    """Every path a diff names, in order of first appearance, without a/ b/ prefixes.

    >>> patch_paths("diff --git a/x/y.py b/x/y.py\\n--- a/x/y.py\\n+++ b/x/y.py\\n")
    ['x/y.py']
    """
    seen: dict[str, None] = {}
    in_file_header = False  # ---/+++ lines count only between `diff --git` and `@@`
    for line in text.splitlines():
        if line.startswith("diff --git "):
            in_file_header = True
            rest = line[len("diff --git ") :]
            # `a/<p> b/<p>`: split on the last ' b/' so spaces in names survive.
            cut = rest.rfind(" b/")
            if cut < 0:
                seen.setdefault(rest, None)
                continue
            seen.setdefault(_strip_prefix(rest[:cut], "a/"), None)
            seen.setdefault(_strip_prefix(rest[cut + 1 :], "b/"), None)
            continue
        if line.startswith("@@"):
            in_file_header = False
            continue
        if not in_file_header:
            continue
        if line.startswith(("--- ", "+++ ")):
            raw = line[4:].split("\t", 1)[0]
            if raw.strip() == "/dev/null":
                continue
            seen.setdefault(_strip_prefix(raw, "a/" if line[0] == "-" else "b/"), None)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            seen.setdefault(_strip_prefix(line.split(" ", 2)[2], ""), None)
    return list(seen)


def backport_version(header: PatchHeader) -> str:
    """X of `Upstream-Status: Backport [X]`, or ''.

    >>> fields = (("Upstream-Status", "Backport [0.5.20]"),)
    >>> backport_version(PatchHeader("s", "d", fields))
    '0.5.20'
    """
    match = _BACKPORT.match(header.get("Upstream-Status"))
    return match.group(1) if match else ""
