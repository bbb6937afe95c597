"""The patch stack: a quilt `series` file naming one format-patch file per concern."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath

from xpu_series.errors import SeriesError
from xpu_series.stack.header import (
    PatchHeader,
    backport_version,
    header_problems,
    parse_header,
    patch_paths,
)
from xpu_series.stack.pin import version_tuple

_NAME = re.compile(r"^[0-9]{4}-[a-z0-9][a-z0-9.-]*\.patch$")


class PatchName(str):
    """A validated patch file name: `NNNN-slug.patch`, no folders.

    >>> PatchName("0001-xpu-attention-causal.patch")
    '0001-xpu-attention-causal.patch'
    >>> PatchName("../evil.patch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    xpu_series.errors.SeriesError: '../evil.patch' is not a patch name ...
    """

    def __new__(cls, value: str) -> PatchName:
        if not _NAME.match(value):
            raise SeriesError(
                f"{value!r} is not a patch name of the form NNNN-slug.patch",
                hint="rename the file and its line in patches/series",
            )
        return super().__new__(cls, value)


@dataclass(frozen=True)
class Patch:
    """One entry of the series; its header and paths are read lazily."""

    name: PatchName
    path: Path
    # Retired (patches/upstreamed/), carried only onto a release older than the
    # one its Applied-Upstream names.
    retired: bool = False

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    @cached_property
    def text(self) -> str:
        return read_text(self.path)

    @cached_property
    def header(self) -> PatchHeader:
        return parse_header(self.text)

    @cached_property
    def files(self) -> tuple[str, ...]:
        return tuple(patch_paths(self.text))

    @property
    def concern(self) -> str:
        return self.header.concern if self.exists else ""


@dataclass(frozen=True)
class Series:
    """The ordered patches named by `patches/series`, plus what the folder holds."""

    directory: Path
    patches: tuple[Patch, ...]
    duplicates: tuple[str, ...]
    invalid_names: tuple[str, ...]
    # Lines that needed normalising (CRLF, trailing blanks): read fine, but
    # refresh rewrites them and check reports them.
    untidy: tuple[str, ...] = ()
    # Listed, but left out on this release: it starts later (Applies-From).
    not_yet: tuple[str, ...] = ()

    def digest(self) -> str:
        """A hash of the series file and every patch; changes when anything does."""
        h = hashlib.sha256()
        h.update((self.directory / "series").read_bytes())
        for patch in self.patches:
            h.update(patch.name.encode())
            if patch.exists:
                h.update(patch.path.read_bytes())
        return h.hexdigest()

    def unlisted(self) -> list[str]:
        listed = {p.name for p in self.patches} | set(self.not_yet)
        return sorted(
            f.name for f in self.directory.glob("*.patch") if f.name not in listed
        )


def load_series(directory: Path) -> Series:
    """Read a quilt series file: one name per line, '#' comments, an optional -pN."""
    series_file = directory / "series"
    if not series_file.is_file():
        raise SeriesError(
            f"{series_file} does not exist",
            hint="create it with one patch file name per line",
        )
    patches: list[Patch] = []
    seen: set[str] = set()
    duplicates: list[str] = []
    invalid: list[str] = []
    untidy: list[str] = []
    for number, raw in enumerate(read_text(series_file).splitlines(True), start=1):
        if raw.endswith("\r\n") or raw.endswith("\r"):
            untidy.append(f"line {number} ends in CRLF")
        elif raw.rstrip("\n") != raw.rstrip():
            untidy.append(f"line {number} has trailing whitespace")
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        word = parts[0]
        if len(parts) > 1 and parts[1:] != ["-p1"]:
            invalid.append(
                f"{word}: only '-p1' is supported, got {' '.join(parts[1:])}"
            )
        if word in seen:
            duplicates.append(word)
            continue
        seen.add(word)
        try:
            name = PatchName(word)
        except SeriesError as exc:
            invalid.append(exc.message)
            continue
        patches.append(Patch(name, directory / name))
    return Series(
        directory, tuple(patches), tuple(duplicates), tuple(invalid), tuple(untidy)
    )


def read_text(path: Path) -> str:
    """A series or patch file as text; bytes that are not UTF-8 are our error."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SeriesError(
            f"{path} is not UTF-8 text (byte {exc.start})",
            hint="patch files are written by 'xpu-series refresh'; regenerate it",
        ) from None
    except OSError as exc:
        raise SeriesError(f"cannot read {path}: {exc.strerror}") from None


def format_problems(series: Series) -> list[str]:
    """Lines of `series` that read fine but are not in refresh's form."""
    name = series.directory / "series"
    return [
        f"{name}: {what} (read as if clean; 'xpu-series refresh' rewrites it)"
        for what in series.untidy
    ]


def test_problems(series: Series, root: Path) -> list[str]:
    """Every `Tests:` path that names no file in the project."""
    problems = []
    for patch in series.patches:
        if not patch.exists:
            continue
        try:
            tests = patch.header.tests
        except SeriesError:
            continue  # static_problems reports the unreadable file
        for test in tests:
            if not (root / test.split("::")[0]).exists():
                problems.append(f"{patch.name}: Tests: {test} does not exist")
    return problems


def path_problem(path: str, tree: Path | None) -> str | None:
    """Why a patch may not touch `path`, or None when it stays inside the tree.

    >>> path_problem("/etc/passwd", None)
    'absolute path /etc/passwd'
    >>> path_problem("python/../../x", None)
    "path python/../../x contains '..'"
    """
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("~"):
        return f"absolute path {path}"
    if ".." in pure.parts:
        return f"path {path} contains '..'"
    if tree is None:
        return None
    root = os.path.realpath(tree)
    # Walk each existing prefix: a symlink anywhere on the way may point outside.
    current = Path(tree)
    for part in pure.parts:
        current = current / part
        if current.is_symlink() or current.exists():
            real = os.path.realpath(current)
            if real != root and not real.startswith(root + os.sep):
                return f"path {path} reaches outside the tree through a symlink"
        else:
            break
    return None


def static_problems(
    series: Series, tree: Path | None = None, allowed_prefixes: tuple[str, ...] = ()
) -> list[str]:
    """Every problem that can be seen without applying anything."""
    problems: list[str] = []
    series_file = series.directory / "series"
    problems.extend(f"{series_file}: {msg}" for msg in series.invalid_names)
    problems.extend(
        f"{series_file} lists {name} more than once" for name in series.duplicates
    )
    for patch in series.patches:
        if not patch.exists:
            problems.append(f"{series_file} lists {patch.name}, which does not exist")
            continue
        try:
            _ = patch.text
        except SeriesError as exc:
            problems.append(exc.message)
            continue
        if not patch.files:
            problems.append(f"{patch.name} contains no diff")
        problems.extend(f"{patch.name} {msg}" for msg in header_problems(patch.header))
        for path in patch.files:
            problem = path_problem(path, tree)
            if problem:
                problems.append(f"{patch.name}: {problem}")
            elif allowed_prefixes and not path.startswith(allowed_prefixes):
                problems.append(
                    f"{patch.name}: {path} is outside {', '.join(allowed_prefixes)}"
                )
    problems.extend(
        f"{series.directory / name} is not listed in {series_file}"
        for name in series.unlisted()
    )
    return problems


def dropped_test_problems(series: Series, root: Path) -> list[str]:
    """Test files that only a dropped patch (patches/dropped/) names, still on disk:
    they test a change the series no longer makes."""
    carried = {t.split("::")[0] for p in series.patches if p.exists for t in _tests(p)}
    problems = []
    for path in sorted((series.directory / "dropped").glob("*.patch")):
        dropped = Patch(PatchName(path.name), path)
        for test in _tests(dropped):
            rel = test.split("::")[0]
            if rel not in carried and (root / rel).exists():
                problems.append(
                    f"{rel} still runs, but only the dropped patch {path.name} "
                    "names it: remove it, or name it in a carried patch's Tests:"
                )
    return problems


def _tests(patch: Patch) -> list[str]:
    try:
        return patch.header.tests
    except SeriesError:
        return []


def metadata_problems(series: Series, pin_version: str) -> list[str]:
    """The headers checked against reality: DEP-3's Origin named, one concern per
    patch, and no carried patch that claims upstream has it at or below the pin."""
    problems: list[str] = []
    concerns: dict[str, str] = {}
    pin = version_tuple(pin_version)
    later = [Patch(PatchName(n), series.directory / n) for n in series.not_yet]
    for patch in (*series.patches, *later):
        if not patch.exists or patch.retired:
            continue  # a retired patch carried onto an older release is expected
        try:
            header = patch.header
        except SeriesError:
            continue
        if not header.get("Origin"):
            problems.append(
                f"{patch.name} has no Origin field (the upstream change it comes "
                "from, DEP-3)"
            )
        concern = header.concern
        if concern and concern in concerns:
            problems.append(
                f"{patch.name} and {concerns[concern]} share Concern: {concern}; "
                "give each patch its own"
            )
        concerns.setdefault(concern, patch.name)
        start = header.get("Applies-From")
        if start and version_tuple(start) is None:
            problems.append(
                f"{patch.name} says Applies-From {start!r}, which is not a release "
                "number (e.g. 0.5.23)"
            )
        elif start and pin is not None and version_tuple(start) > pin:
            problems.append(
                f"{patch.name} says Applies-From {start}, above the pin "
                f"{pin_version}: it could not apply here"
            )
        for field, version in (
            ("Applied-Upstream", header.get("Applied-Upstream")),
            ("Upstream-Status: Backport", backport_version(header)),
        ):
            have = version_tuple(version) if version else None
            if pin is not None and have is not None and have <= pin:
                problems.append(
                    f"{patch.name} says {field} {version}, at or below the pin "
                    f"{pin_version}: upstream has it, so it should not be carried "
                    "(retire it with 'xpu-series rebase' or fix the header)"
                )
    return problems


RETIRED_DIR = "upstreamed"


def applies_from(patch: Patch) -> tuple[int, ...] | None:
    """The first release a patch applies to (`Applies-From:`), or None: all."""
    if not patch.exists:
        return None
    try:
        return version_tuple(patch.header.get("Applies-From"))
    except SeriesError:
        return None


def _starts_after(patch: Patch, version: tuple[int, ...]) -> bool:
    start = applies_from(patch)
    return start is not None and version < start


def _number(name: str) -> int | None:
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def load_series_for(
    directory: Path, version: str | None, pin_version: str, every_retired: bool = False
) -> Series:
    """The series as it applies to `version`: on a release older than the pin it
    also carries each retired patch (patches/upstreamed/) whose `Applied-Upstream:`
    is above that release, placed by its number among the others. With
    `every_retired` (the matrix) every retired patch is listed on every release:
    where upstream has it, its header marks it absorbed and its tests speak for
    upstream's behaviour."""
    series = load_series(directory)
    have, pin = version_tuple(version or ""), version_tuple(pin_version)
    if have is None or pin is None:
        return series
    # A patch that fixes code older releases lack starts at its Applies-From.
    patches = [p for p in series.patches if not _starts_after(p, have)]
    later = tuple(p.name for p in series.patches if _starts_after(p, have))
    series = dataclasses.replace(series, not_yet=later)
    if have >= pin and not every_retired:
        return dataclasses.replace(series, patches=tuple(patches))
    for path in sorted((directory / RETIRED_DIR).glob("*.patch")):
        try:
            patch = Patch(PatchName(path.name), path, retired=True)
        except SeriesError:
            continue
        since = version_tuple(patch.header.get("Applied-Upstream"))
        number = _number(patch.name)
        if since is None or number is None or (since <= have and not every_retired):
            continue
        at = next(
            (i for i, p in enumerate(patches) if (_number(p.name) or 0) > number),
            len(patches),
        )
        patches.insert(at, patch)
    return dataclasses.replace(series, patches=tuple(patches))
