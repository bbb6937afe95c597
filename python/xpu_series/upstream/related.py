"""Related upstream work per carried patch (patches/upstream-work.toml): upstream
pull requests and issues as last seen, and upstream's own tests that pin what a
patch changes."""

from __future__ import annotations

import datetime
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.errors import UsageError
from xpu_series.project import Project

WORK_FILE = "upstream-work.toml"
# What an entry says of a pull request or issue when it was last looked at.
STATES = ("open", "closed-unmerged", "merged")
_URL = re.compile(r"^https://github\.com/([\w.-]+/[\w.-]+)/(pull|issues)/(\d+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# One line of our own words: long enough for a reason, short enough to stay one.
_MAX_LINE = 240
_RELATED_KEYS = {"patch", "url", "state", "seen", "differs"}
_TEST_KEYS = {"patch", "path", "seen", "commit", "breaks"}
UPSTREAM_REPO = "sgl-project/sglang"


@dataclass(frozen=True)
class RelatedWork:
    """An upstream pull request or issue that touches what a patch fixes."""

    patch: str  # the patch's stem, as in patches/series without .patch
    url: str
    state: str
    seen: datetime.date
    differs: str  # how our patch differs, in our own words

    @property
    def label(self) -> str:
        """`#123` for upstream's own repository, else `owner/repo#123`."""
        match = _URL.match(self.url)
        assert match is not None  # validated on load
        repo, _kind, number = match.groups()
        return f"#{number}" if repo == UPSTREAM_REPO else f"{repo}#{number}"


@dataclass(frozen=True)
class UpstreamTest:
    """A test in upstream's tree that pins the behaviour a patch changes."""

    patch: str
    path: str
    seen: datetime.date
    breaks: str  # what it asserts that the patch changes
    commit: str = ""  # the upstream commit it was read at


@dataclass(frozen=True)
class UpstreamWork:
    """Everything patches/upstream-work.toml records, by patch stem."""

    related: tuple[RelatedWork, ...] = ()
    tests: tuple[UpstreamTest, ...] = ()
    # When upstream's pull requests, issues and tests were last searched for
    # each patch: a searched patch with no entry had nothing to record.
    searched: dict[str, datetime.date] = field(default_factory=dict)

    def related_to(self, stem: str) -> list[RelatedWork]:
        return [r for r in self.related if r.patch == stem]

    def tests_of(self, stem: str) -> list[UpstreamTest]:
        return [t for t in self.tests if t.patch == stem]


def patch_stems(project: Project) -> tuple[list[str], list[str]]:
    """The carried patches' stems, series order, and the retired ones'."""
    carried = [p.name.removesuffix(".patch") for p in project.series().patches]
    retired = [
        path.stem
        for folder in ("upstreamed", "dropped")
        for path in sorted((project.patches_dir / folder).glob("*.patch"))
    ]
    return carried, retired


def load_upstream_work(project: Project) -> UpstreamWork:
    """patches/upstream-work.toml, checked entry by entry (none when the file
    is absent); entries of retired patches are kept out."""
    path = project.patches_dir / WORK_FILE
    if not path.is_file():
        return UpstreamWork()
    data = _read_toml(path)
    carried, retired = patch_stems(project)
    unknown = set(data) - {"related", "upstream-test", "searched"}
    if unknown:
        raise _bad(
            f"unknown table {sorted(unknown)[0]!r}",
            "related, upstream-test and searched are the tables it holds",
        )
    related = []
    for n, entry in enumerate(_entries(data, "related"), start=1):
        where = f"[[related]] entry {n}"
        _keys(entry, _RELATED_KEYS, set(), where)
        stem = _patch(entry, where, carried, retired)
        url = _text(entry, "url", where)
        if not _URL.match(url):
            raise _bad(
                f"{where}: url {url!r} is not a GitHub pull request or issue",
                "write it as https://github.com/OWNER/REPO/pull/N (or /issues/N)",
            )
        state = _text(entry, "state", where)
        if state not in STATES:
            raise _bad(
                f"{where} ({url}): state {state!r} is not one of {', '.join(STATES)}",
                "write the state the pull request "
                "or issue had when you last looked at it",
            )
        item = RelatedWork(
            stem, url, state, _date(entry, where), _line(entry, "differs", where)
        )
        if stem in carried:
            related.append(item)
    tests = []
    for n, entry in enumerate(_entries(data, "upstream-test"), start=1):
        where = f"[[upstream-test]] entry {n}"
        _keys(entry, _TEST_KEYS, {"commit"}, where)
        stem = _patch(entry, where, carried, retired)
        test_path = _text(entry, "path", where)
        if not (test_path.startswith("test/") and test_path.endswith(".py")):
            raise _bad(
                f"{where}: path {test_path!r} is not a test file of upstream's tree",
                "give its path from the repository "
                "root, e.g. test/registered/unit/.../test_x.py",
            )
        commit = str(entry.get("commit", ""))
        if commit and not _COMMIT.match(commit):
            raise _bad(
                f"{where}: commit {commit!r} is not a full commit id",
                "give the 40 hex digits of the commit it was read at",
            )
        item_test = UpstreamTest(
            stem, test_path, _date(entry, where), _line(entry, "breaks", where), commit
        )
        if stem in carried:
            tests.append(item_test)
    searched: dict[str, datetime.date] = {}
    table = data.get("searched", {})
    if not isinstance(table, dict):
        raise _bad(
            "[searched] is not a table",
            'write `[searched]` and then one "STEM" = YYYY-MM-DD line per patch',
        )
    for key, value in table.items():
        stem = _patch({"patch": key}, "[searched]", carried, retired)
        if stem in carried:
            searched[stem] = _date({"seen": value}, f"[searched] {key}")
    return UpstreamWork(tuple(related), tuple(tests), searched)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(
            f"patches/{path.name} is not valid TOML: {exc}",
            hint=f"fix patches/{path.name} (a TOML file kept by hand)",
        ) from exc


def _bad(message: str, hint: str) -> UsageError:
    return UsageError(f"patches/{WORK_FILE}: {message}", hint=hint)


def _entries(data: dict[str, Any], table: str) -> list[dict[str, Any]]:
    entries = data.get(table, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _bad(
            f"{table} is not an array of tables",
            f"write each entry under its own [[{table}]] line",
        )
    return entries


def _keys(
    entry: dict[str, Any], known: set[str], optional: set[str], where: str
) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise _bad(
            f"{where}: unknown key {unknown[0]!r}",
            f"an entry holds {', '.join(sorted(known))}",
        )
    missing = sorted(known - optional - set(entry))
    if missing:
        raise _bad(
            f"{where}: no {missing[0]!r}", f"an entry holds {', '.join(sorted(known))}"
        )


def _text(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _bad(
            f"{where}: {key} is empty or not a string", f"give {key} as a quoted string"
        )
    return value.strip()


def _line(entry: dict[str, Any], key: str, where: str) -> str:
    text = _text(entry, key, where)
    if "\n" in text or len(text) > _MAX_LINE:
        raise _bad(
            f"{where}: {key} is not one line of at most {_MAX_LINE} characters",
            "say it in one line, in our own words; the "
            "pull request's own text stays upstream",
        )
    return text


def _date(entry: dict[str, Any], where: str) -> datetime.date:
    value = entry.get("seen")
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    raise _bad(
        f"{where}: seen {value!r} is not a date",
        "write the day you last looked, as YYYY-MM-DD",
    )


def _patch(
    entry: dict[str, Any], where: str, carried: list[str], retired: list[str]
) -> str:
    """The stem an entry names; a retired patch's is accepted (and its
    entries ignored), anything else is refused with the names to use."""
    stem = _text(entry, "patch", where).removesuffix(".patch")
    if stem in carried or stem in retired:
        return stem
    raise _bad(
        f"{where}: {stem!r} is not a patch of the series",
        "name a patch by its stem, as in patches/series without "
        f".patch: {', '.join(carried) or 'none carried'}",
    )
