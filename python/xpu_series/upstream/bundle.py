"""Bundles (patches/bundles.toml): several carried patches exported as one
feature pull request, with a title and a motivation of their own."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

from xpu_series.errors import UsageError
from xpu_series.project import Project
from xpu_series.upstream.export import resolve

BUNDLES_FILE = "bundles.toml"
# A folder name under build/upstream/ that no patch stem (NNNN-...) can take.
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
_KEYS = {"name", "title", "motivation", "patches"}


@dataclass(frozen=True)
class Bundle:
    """Patches that upstream should review together, as one feature."""

    name: str
    title: str  # "" for a bundle named only on the command line
    motivation: str  # our own words; "" likewise
    patches: tuple[str, ...]  # patch file names, in series order
    declared: bool = True  # exactly as patches/bundles.toml declares it


def check_name(name: str) -> str:
    """The bundle name, or a usage error.

    >>> check_name("pd-disaggregation-xpu")
    'pd-disaggregation-xpu'
    """
    if not _NAME.match(name):
        raise UsageError(
            f"bundle name {name!r} is not lower-case letters, digits and dashes "
            "starting with a letter",
            hint="name it like a folder, e.g. speculative-decoding-xpu",
        )
    return name


def load_bundles(project: Project) -> list[Bundle]:
    """patches/bundles.toml, every bundle checked (none when it is absent)."""
    path = project.patches_dir / BUNDLES_FILE
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise _bad(f"not valid TOML: {exc}", "fix the file") from exc
    if set(data) - {"bundle"}:
        raise _bad(
            f"unknown table {sorted(set(data) - {'bundle'})[0]!r}",
            "declare each bundle under its own [[bundle]] line",
        )
    entries = data.get("bundle", [])
    if not isinstance(entries, list):
        raise _bad("bundle is not an array of tables", "use [[bundle]] lines")
    bundles: list[Bundle] = []
    for n, entry in enumerate(entries, start=1):
        bundle = _bundle(project, entry, f"[[bundle]] entry {n}")
        if any(b.name == bundle.name for b in bundles):
            raise _bad(
                f"two bundles are called {bundle.name!r}", "give each its own name"
            )
        bundles.append(bundle)
    return bundles


def find_bundle(project: Project, name: str, words: list[str]) -> Bundle:
    """The bundle `name` declares, or the patches `words` name under that name
    (the declared title and motivation stay when the name is declared)."""
    check_name(name)
    declared = {b.name: b for b in load_bundles(project)}
    known = declared.get(name)
    if not words:
        if known is None:
            raise UsageError(
                f"no bundle called {name!r} in patches/{BUNDLES_FILE}; declared: "
                + (", ".join(declared) or "none"),
                hint=f"name its patches ('xpu-series upstream --bundle {name} "
                f"PATCH PATCH'), or declare it in patches/{BUNDLES_FILE}",
            )
        return known
    patches = _in_series_order(project, [resolve(project, w)[1].name for w in words])
    if len(patches) < 2:
        raise UsageError(
            f"--bundle {name} names {len(patches)} patch; a bundle takes two or more",
            hint="export a single patch without --bundle: 'xpu-series upstream PATCH'",
        )
    if known is None:
        return Bundle(name, "", "", patches, declared=False)
    return Bundle(
        name, known.title, known.motivation, patches, patches == known.patches
    )


def _bundle(project: Project, entry: Any, where: str) -> Bundle:
    if not isinstance(entry, dict):
        raise _bad(f"{where} is not a table", "use [[bundle]] lines")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise _bad(f"{where}: unknown key {unknown[0]!r}", _HOLDS)
    missing = sorted(_KEYS - set(entry))
    if missing:
        raise _bad(f"{where}: no {missing[0]!r}", _HOLDS)
    name = entry["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            f"{where}: name {name!r} is not lower-case letters, digits and dashes",
            "name it like a folder, e.g. speculative-decoding-xpu",
        )
    where = f"bundle {name!r}"
    title, motivation = entry["title"], entry["motivation"]
    if not isinstance(title, str) or not title.strip() or "\n" in title.strip():
        raise _bad(f"{where}: title is not one line", "give the pull request title")
    if not isinstance(motivation, str) or not motivation.strip():
        raise _bad(
            f"{where}: motivation is empty",
            "say, in our own words, what fails on XPU without the bundle",
        )
    words = entry["patches"]
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise _bad(f"{where}: patches is not a list of names", _HOLDS)
    patches = []
    for word in words:
        try:
            patches.append(resolve(project, word)[1].name)
        except UsageError as exc:
            raise UsageError(
                f"patches/{BUNDLES_FILE}: {where}: {exc.message}", hint=exc.hint
            ) from exc
    ordered = _in_series_order(project, patches)
    if len(ordered) < 2:
        raise _bad(
            f"{where} names fewer than two patches", "a bundle takes two or more"
        )
    return Bundle(name, title.strip(), motivation.strip(), ordered)


_HOLDS = (
    "a bundle holds name, title, motivation and patches (stems, as in patches/series)"
)


def _in_series_order(project: Project, names: list[str]) -> tuple[str, ...]:
    """The named patches, once each, bottom of the stack first: the order the
    export applies them in."""
    order = [p.name for p in project.series().patches]
    return tuple(sorted(set(names), key=order.index))


def _bad(message: str, hint: str) -> UsageError:
    return UsageError(f"patches/{BUNDLES_FILE}: {message}", hint=hint)
