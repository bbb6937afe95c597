"""The pin: which upstream wheel the series applies to, and how it maps to a tree."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from xpu_series.errors import UsageError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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

    def for_version(self, version: str) -> Pin:
        """A request for another release; its hash is unknown until fetched."""
        if version == self.version:
            return self
        wheel = self.wheel.replace(f"-{self.version}-", f"-{version}-", 1)
        return Pin(
            project=self.project,
            version=version,
            wheel=wheel,
            sha256="",
            layout=self.layout,
            git_tag=f"v{version}",
            python_version=self.python_version,
            platform=self.platform,
            serves_from=self.serves_from,
        )

    @property
    def pinned(self) -> bool:
        return bool(self.sha256)

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
    return Pin(
        project=str(upstream["project"]),
        version=str(upstream["version"]),
        wheel=str(upstream["wheel"]),
        sha256=sha,
        layout=tuple((str(k), str(v)) for k, v in layout.items()),
        git_tag=str(upstream.get("git-tag", "")),
        python_version=str(upstream.get("python-version", "3.11")),
        platform=str(upstream.get("platform", "manylinux_2_34_x86_64")),
        serves_from=str(upstream.get("serves-from", "")),
    )
