"""The pin: which upstream wheel the series applies to, and how it maps to a tree."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from xpu_series.errors import UsageError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TAG = re.compile(r"^cp3[0-9]{1,2}$")


@dataclass(frozen=True)
class Pin:
    """One upstream release, named by its wheel file and that file's sha256."""

    project: str
    version: str
    wheel: str
    sha256: str
    layout: tuple[tuple[str, str], ...]
    git_tag: str = ""
    python_version: str = "3.11"
    platform: str = "manylinux_2_34_x86_64"
    # The oldest release the series still serves (each has an official XPU
    # image); older releases than the pin get the retired patches they need.
    serves_from: str = ""
    # [wheels."V"] cpXY = sha256: the release wheel per CPython tag for each
    # served release, which `xpu-series wheel` builds from: (release, tag, sha256).
    wheels: tuple[tuple[str, str, str], ...] = ()

    def for_version(self, version: str) -> Pin:
        """A request for another release; its hash is unknown until fetched."""
        if version == self.version:
            return self
        wheel = self.wheel.replace(f"-{self.version}-", f"-{version}-", 1)
        return replace(
            self, version=version, wheel=wheel, sha256="", git_tag=f"v{version}"
        )

    @property
    def pinned(self) -> bool:
        return bool(self.sha256)

    @property
    def python_tag(self) -> str:
        """The CPython tag of the pinned file (`3.11` -> `cp311`)."""
        return "cp" + self.python_version.replace(".", "")

    def for_wheel(self, version: str, tag: str) -> Pin:
        """Release `version`'s wheel for CPython `tag`, pinned by its sha256 in
        [wheels] (the pin's own file by [upstream]); unpinned if neither has it.

        >>> pin = Pin("sglang", "1.0", "sglang-1.0-cp311-cp311-any.whl", "a" * 64,
        ...           (), wheels=(("0.9", "cp312", "b" * 64),))
        >>> old = pin.for_wheel("0.9", "cp312")
        >>> old.wheel, old.python_version, old.sha256[:2]
        ('sglang-0.9-cp312-cp312-any.whl', '3.12', 'bb')
        >>> pin.for_wheel("1.0", "cp311").sha256[:2]
        'aa'
        >>> pin.for_wheel("0.9", "cp311").pinned
        False
        """
        mine = self.python_tag
        wheel = self.wheel.replace(f"-{self.version}-", f"-{version}-", 1).replace(
            f"-{mine}-{mine}-", f"-{tag}-{tag}-", 1
        )
        sha = next((s for v, t, s in self.wheels if (v, t) == (version, tag)), "")
        if not sha and (version, tag) == (self.version, mine):
            sha = self.sha256
        return replace(
            self,
            version=version,
            wheel=wheel,
            sha256=sha,
            git_tag=f"v{version}",
            python_version=f"{tag[2]}.{tag[3:]}",
        )

    def serves(self, version: str) -> bool:
        """Whether `version` lies between `serves-from` and the pin, inclusive.

        >>> pin = Pin("sglang", "0.5.23", "w.whl", "", (), serves_from="0.5.20")
        >>> [pin.serves(v) for v in ("0.5.19", "0.5.20", "0.5.23", "0.5.24", "main")]
        [False, True, True, False, False]
        """
        have = version_tuple(version)
        top = version_tuple(self.version)
        low = version_tuple(self.serves_from or self.version)
        if have is None or top is None or low is None:
            return False
        return low <= have <= top

    def member_of(self, tree_path: str) -> str | None:
        """The wheel member a tree path comes from (the layout, inverted).

        >>> pin = Pin("sglang", "1", "w.whl", "", (("sglang/", "python/sglang/"),))
        >>> pin.member_of("python/sglang/srt/utils.py"), pin.member_of("README.md")
        ('sglang/srt/utils.py', None)
        """
        for source, target in self.layout:
            if tree_path.startswith(target):
                return source + tree_path[len(target) :]
        return None

    def map_member(self, member: str) -> str | None:
        """Tree path of a wheel member, or None when the layout does not carry it.

        >>> pin = Pin("sglang", "1", "w.whl", "", (("sglang/", "python/sglang/"),))
        >>> pin.map_member("sglang/srt/utils.py")
        'python/sglang/srt/utils.py'
        >>> pin.map_member("sglang-1.dist-info/RECORD") is None
        True
        """
        for source, target in self.layout:
            if member.startswith(source):
                return target + member[len(source) :]
        return None


def version_tuple(version: str) -> tuple[int, ...] | None:
    """Numeric release tuple, or None for anything else (a checkout, a tag).

    >>> version_tuple("0.5.20"), version_tuple("0.5.20rc1"), version_tuple("main")
    ((0, 5, 20), None, None)
    """
    parts = version.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def load_pin(path: Path) -> Pin:
    """Read `patches/upstream.toml`; every missing or malformed key is a usage error."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"{path} does not exist",
            hint="run xpu-series from the project root or pass -C <project>",
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    upstream = data.get("upstream", {})
    missing = [
        k for k in ("project", "version", "wheel", "sha256") if k not in upstream
    ]
    if missing:
        raise UsageError(f"{path}: [upstream] lacks {', '.join(missing)}")
    sha = str(upstream["sha256"]).lower()
    if not _SHA256.match(sha):
        raise UsageError(f"{path}: sha256 {sha!r} is not 64 hex digits")
    layout = data.get("layout", {})
    if not layout:
        raise UsageError(f"{path}: [layout] must map wheel folders to tree folders")
    for source, target in layout.items():
        for part in (source, target):
            if (
                part.startswith("/")
                or ".." in Path(part).parts
                or not part.endswith("/")
            ):
                raise UsageError(
                    f"{path}: layout entry {source!r} = {target!r} must be relative "
                    "folders ending in '/' without '..'"
                )
    python_version = str(upstream.get("python-version", "3.11"))
    wheels = _load_wheels(path, data.get("wheels", {}))
    own = ("cp" + python_version.replace(".", ""), str(upstream["version"]))
    for version, tag, recorded in wheels:
        if (tag, version) == own and recorded != sha:
            raise UsageError(
                f'{path}: [wheels."{version}"] {tag} = {recorded[:12]}... is not '
                f"the pinned file's sha256 {sha[:12]}... in [upstream]",
                hint="the two name one file: make them agree",
            )
    return Pin(
        project=str(upstream["project"]),
        version=str(upstream["version"]),
        wheel=str(upstream["wheel"]),
        sha256=sha,
        layout=tuple((str(k), str(v)) for k, v in layout.items()),
        git_tag=str(upstream.get("git-tag", "")),
        python_version=python_version,
        platform=str(upstream.get("platform", "manylinux_2_34_x86_64")),
        serves_from=str(upstream.get("serves-from", "")),
        wheels=wheels,
    )


def _load_wheels(path: Path, table: object) -> tuple[tuple[str, str, str], ...]:
    """[wheels."V"] tables: a sha256 per CPython tag; anything else is an error."""
    if not isinstance(table, dict):
        raise UsageError(f'{path}: [wheels] must hold [wheels."VERSION"] tables')
    found: list[tuple[str, str, str]] = []
    for version, tags in sorted(table.items()):
        if version_tuple(version) is None or not isinstance(tags, dict):
            raise UsageError(
                f'{path}: [wheels."{version}"] must name a release and hold '
                'cpXY = "sha256" lines'
            )
        for tag, sha in sorted(tags.items()):
            if not _TAG.match(tag) or not _SHA256.match(str(sha).lower()):
                raise UsageError(
                    f'{path}: [wheels."{version}"] {tag} = {sha!r}: want a CPython '
                    "tag (cp312) and 64 hex digits"
                )
            found.append((version, tag, str(sha).lower()))
    return tuple(found)
