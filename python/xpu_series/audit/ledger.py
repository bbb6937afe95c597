"""patches/xpu-reports.toml: the upstream XPU reports the fork knows, and whether
their code is still where the ledger says, on the release being audited.

Each `[[report]]` has the report's `url`, a locator (`file`, `function`, `api`,
shell patterns matched like triage entries, never a line), its `kind` (an audit
kind, or "kernel-bug" / "other"), and per served release a status in
`[report.releases]`: "present", "fixed-upstream:V" or "answered-by:NNNN" (a
patch of the series). The audit re-checks every locator on the release it
audits: an entry whose file or function is gone is stale; a "present" entry of
an audit kind that no finding of that kind matches is unseen (the audit misses
a bug upstream reported, or the locator names it differently).
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from xpu_series.audit.scan_records import KINDS
from xpu_series.errors import UsageError

_KEYS = {"url", "title", "kind", "file", "function", "api", "part", "note", "releases"}
_OTHER_KINDS = ("kernel-bug", "other")
_STATUS = re.compile(r"^(present|fixed-upstream:\d+\.\d+\.\d+|answered-by:\d{4})$")
_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$")


@dataclass(frozen=True)
class Report:
    """One upstream report and where its code is."""

    line: int
    url: str
    kind: str
    file: str
    function: str
    api: str
    releases: dict[str, str]
    title: str = ""

    def describe(self) -> str:
        return f"{self.file.removeprefix('python/')}: {self.function} ({self.api})"


@dataclass
class LedgerCheck:
    """The ledger re-checked on one release."""

    path: str
    release: str
    reports: list[Report]
    stale: list[tuple[Report, str]] = field(default_factory=list)
    unseen: list[Report] = field(default_factory=list)
    unlisted: list[Report] = field(default_factory=list)  # no status for release

    def statuses(self) -> dict[str, int]:
        return dict(
            Counter(
                r.releases[self.release].split(":")[0]
                for r in self.reports
                if self.release in r.releases
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "release": self.release,
            "reports": len(self.reports),
            "urls": len({r.url for r in self.reports}),
            "status": self.statuses(),
            "stale": [
                {
                    "line": r.line,
                    "url": r.url,
                    "file": r.file,
                    "function": r.function,
                    "api": r.api,
                    "why": why,
                }
                for r, why in self.stale
            ],
            "unseen": [
                {"line": r.line, "url": r.url, "kind": r.kind, "api": r.api}
                for r in self.unseen
            ],
            "unlisted": [r.line for r in self.unlisted],
        }


def _entry_lines(text: str) -> list[int]:
    return [
        n for n, line in enumerate(text.splitlines(), 1) if line.strip() == "[[report]]"
    ]


def load_ledger(path: Path) -> list[Report]:
    """The reports of `path` (none when it does not exist); a malformed ledger is
    a usage error naming the line."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    hint = (
        "each [[report]] has url, file, function, api, kind and a "
        '[report.releases] table ("0.5.23" = "present" | "fixed-upstream:V" | '
        '"answered-by:NNNN")'
    )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}", hint=hint) from None
    extra = sorted(set(data) - {"report"})
    if extra or not isinstance(data.get("report", []), list):
        raise UsageError(
            f"{path}: unknown table {(extra or ['report'])[0]!r} (only [[report]])",
            hint=hint,
        )
    lines = _entry_lines(text)
    out = []
    for index, raw in enumerate(data.get("report", [])):
        where = f"{path}:{lines[index] if index < len(lines) else 0}"
        out.append(_report(raw, where, lines[index] if index < len(lines) else 0, hint))
    return out


def _report(raw: dict[str, Any], where: str, line: int, hint: str) -> Report:
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise UsageError(
            f"{where}: unknown key {unknown[0]!r} in [[report]]", hint=hint
        )
    for key in ("url", "file", "function", "api", "kind"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise UsageError(
                f"{where}: [[report]] needs a non-empty {key!r}", hint=hint
            )
    if not _URL.match(raw["url"]):
        raise UsageError(
            f"{where}: url {raw['url']!r} is not a GitHub issue or pull request",
            hint=hint,
        )
    if raw["kind"] not in KINDS + _OTHER_KINDS:
        raise UsageError(
            f"{where}: unknown kind {raw['kind']!r}",
            hint=f"one of {', '.join(KINDS + _OTHER_KINDS)}",
        )
    releases = raw.get("releases")
    if not isinstance(releases, dict) or not releases:
        raise UsageError(f"{where}: [[report]] needs [report.releases]", hint=hint)
    for version, status in releases.items():
        if not isinstance(status, str) or not _STATUS.match(status):
            raise UsageError(
                f"{where}: release {version}: status {status!r} is not present, "
                "fixed-upstream:V or answered-by:NNNN",
                hint=hint,
            )
    return Report(
        line,
        raw["url"],
        raw["kind"],
        raw["file"],
        raw["function"],
        raw["api"],
        dict(releases),
        raw.get("title", ""),
    )


def _defines(text: str, function: str) -> bool:
    """Whether `text` defines the qualified function (`Class.method`, patterns
    allowed); `*` and `<module>` ask for nothing."""
    if function in ("*", "<module>"):
        return True
    for part in function.split("."):
        if "*" in part or "?" in part:
            continue
        if not re.search(
            rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(part)}\b", text, re.M
        ):
            return False
    return True


def check_ledger(
    reports: list[Report],
    path: str,
    release: str,
    texts: dict[str, str],
    findings: list[Any],
) -> LedgerCheck:
    """Re-check each report's locator on `release`: `texts` are the audited
    tree's files (path -> text, at least those the locators name), `findings`
    the audit's findings of that tree."""
    check = LedgerCheck(path, release, reports)
    for report in reports:
        status = report.releases.get(release)
        if status is None:
            check.unlisted.append(report)
            continue
        files = [p for p in texts if fnmatchcase(p, report.file)]
        if not files:
            check.stale.append((report, "no file matches"))
            continue
        if not any(_defines(texts[p], report.function) for p in files):
            check.stale.append((report, f"{report.function} is not defined there"))
            continue
        if report.kind in KINDS and status == "present":
            hit = any(
                f.kind == report.kind
                and fnmatchcase(f.file, report.file)
                and fnmatchcase(f.function, report.function)
                and fnmatchcase(f.api, report.api)
                for f in findings
            )
            if not hit:
                check.unseen.append(report)
    return check


def wanted(reports: list[Report], paths: list[str]) -> list[str]:
    """The tree's paths some report's file pattern names (the texts to read)."""
    return [p for p in paths if any(fnmatchcase(p, r.file) for r in reports)]
