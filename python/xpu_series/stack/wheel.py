"""Get the upstream wheel into the cache, prove its hash, and unpack it safely."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from xpu_series.errors import IntegrityError, NetworkError, WheelError
from xpu_series.git import run_command
from xpu_series.stack.pin import Pin

_CHUNK = 1 << 20
# pip's own words when the index cannot be reached or does not have the file.
_NETWORK_MARKERS = (
    "Failed to establish a new connection",
    "Connection refused",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Max retries exceeded",
    "ConnectTimeout",
    "NewConnectionError",
)
_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")


@dataclass(frozen=True)
class FetchedWheel:
    """A wheel in the cache whose hash has been computed (and checked, if pinned)."""

    path: Path
    sha256: str
    version: str
    pinned: bool
    source: str  # "cache", "download" or "local"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _quarantine(path: Path, cache: Path, digest: str) -> Path:
    """Move a bad download aside so it is never used again, without deleting it."""
    rejected = cache / "rejected"
    rejected.mkdir(parents=True, exist_ok=True)
    target = rejected / f"{path.name}.{digest[:12]}"
    os.replace(path, target)
    return target


def cached_path(cache: Path, name: str, digest: str) -> Path:
    """Where a verified wheel lives: content-addressed, so no file ever replaces
    another with different bytes."""
    return cache / "wheels" / digest / name


def _mismatch(
    path: Path, digest: str, pin: Pin, origin: str, where: str
) -> IntegrityError:
    hints = {
        "local": f"{path} is not the pinned file: get {pin.wheel} with the "
        "'pip download' line in patches/upstream.toml",
        "index": "the package index served a different file, or the pin is wrong: "
        "check patches/upstream.toml before trusting this wheel",
        "cache": f"run 'xpu-series fetch' to download {pin.wheel} again",
    }
    whose = {
        "local": "the file you passed",
        "index": "the file the package index served",
        "cache": "the cached file",
    }[origin]
    return IntegrityError(
        f"{path.name}: {whose} has sha256 {digest}, but the pin says "
        f"{pin.sha256}{where}",
        hint=hints[origin],
    )


def _store(source: Path, dest: Path, *, move: bool, origin: str) -> None:
    """Put a verified file at its content-addressed place (copy, then rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    if move:
        os.replace(source, tmp)
    else:
        shutil.copyfile(source, tmp)
    os.replace(tmp, dest)
    (dest.parent / "origin").write_text(origin + "\n")


def _hint_version(pin: Pin) -> str:
    return "" if pin.pinned else f" --upstream {pin.version}"


def _cached(pin: Pin, cache: Path) -> FetchedWheel | None:
    """The verified wheel for `pin` already in the cache, if any."""
    wheels = cache / "wheels"
    legacy = wheels / pin.wheel  # the layout before content addressing
    if legacy.is_file():
        digest = sha256_file(legacy)
        if pin.pinned and digest != pin.sha256:
            where = f"; the file was moved to {_quarantine(legacy, cache, digest)}"
            raise _mismatch(legacy, digest, pin, "cache", where)
        if pin.pinned or _readable(legacy, pin):
            _store(legacy, cached_path(cache, pin.wheel, digest), move=True,
                   origin="cache")  # fmt: skip
        else:
            _quarantine(legacy, cache, digest)
    if pin.pinned:
        candidates = [cached_path(cache, pin.wheel, pin.sha256)]
    else:
        # Several files may carry one name (a local build, the index's): the one
        # the index served wins, then the newest.
        candidates = sorted(
            wheels.glob(f"*/{pin.wheel}"),
            key=lambda p: (_origin(p) == "index", p.stat().st_mtime),
            reverse=True,
        )
    for path in candidates:
        if not path.is_file():
            continue
        digest = sha256_file(path)
        if digest != path.parent.name:
            where = f"; the file was moved to {_quarantine(path, cache, digest)}"
            if pin.pinned:
                raise _mismatch(path, digest, pin, "cache", where)
            raise WheelError(
                f"the cached {path.name} was changed on disk{where}",
                hint=f"run 'xpu-series fetch{_hint_version(pin)}' to get it again",
            )
        return FetchedWheel(path, digest, pin.version, pin.pinned, "cache")
    return None


def _origin(path: Path) -> str:
    try:
        return (path.parent / "origin").read_text().strip()
    except OSError:
        return ""


def _readable(path: Path, pin: Pin) -> bool:
    try:
        check_wheel(path, pin)
    except WheelError:
        return False
    return True


def _network_error(pin: Pin, text: str) -> NetworkError:
    versions = _VERSIONS.search(text)
    listed = (
        []
        if not versions
        else [v.strip() for v in versions.group(1).split(",") if v.strip() != "none"]
    )
    if listed:
        if pin.version not in listed:
            return NetworkError(
                f"{pin.project} {pin.version} does not exist on the package index; "
                f"the newest release is {listed[-1]}",
                hint=f"pick a listed release, e.g. --upstream {listed[-1]}",
            )
        return NetworkError(
            f"the package index has {pin.project} {pin.version}, but no file "
            f"{pin.wheel} (python {pin.python_version}, {pin.platform})",
            hint="check python-version and platform in patches/upstream.toml",
        )
    if any(m in text for m in _NETWORK_MARKERS) or versions:
        # pip lists no release at all when it reaches no index.
        return NetworkError(
            f"could not reach the package index to get {pin.wheel} (pip saw no "
            f"{pin.project} release at all), and it is not in the cache",
            hint=f"copy the file from a machine that has it and run "
            f"'xpu-series fetch{_hint_version(pin)} --wheel PATH/{pin.wheel}'",
        )
    lines = text.strip().splitlines()
    return NetworkError(
        f"pip could not download {pin.project}=={pin.version}: "
        f"{lines[-1] if lines else 'no output'}",
        hint=f"download {pin.wheel} yourself and pass --wheel PATH",
    )


def _pip_download(pin: Pin, dest: Path, *, progress: bool) -> None:
    args = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        "--only-binary=:all:", "--python-version", pin.python_version,
        "--implementation", "cp", "--platform", pin.platform,
        "--dest", str(dest), "--disable-pip-version-check",
        f"{pin.project}=={pin.version}",
    ]  # fmt: skip
    if not progress:
        args.insert(4, "--progress-bar=off")
    result = run_command(args, capture=not progress)
    if not result.ok and progress:
        # The bar went to the terminal, and so did pip's reason: ask again, quietly,
        # to tell a missing release from an unreachable index.
        args.insert(4, "--progress-bar=off")
        result = run_command(args)
    if not result.ok:
        raise _network_error(pin, result.stderr + result.stdout)


def fetch_wheel(
    pin: Pin,
    cache: Path,
    *,
    local: Path | None = None,
    progress: bool = False,
    sha256: str | None = None,
    offline: bool = False,
) -> FetchedWheel:
    """The wheel from a local file, the cache, or the index (in that order).

    The hash is checked before the file is used for anything. The cache is
    content-addressed (`wheels/<sha256>/<name>`): an unpinned file is checked to
    be a readable sglang wheel first, and no file ever replaces another. A pinned
    download that does not match is moved to `<cache>/rejected/`; a user's own
    --wheel file is never moved. `sha256` names the exact file an operation
    already chose for an unpinned release; `offline` never asks the index.
    """
    if sha256 and not pin.pinned:
        known = cached_path(cache, pin.wheel, sha256)
        if known.is_file() and sha256_file(known) == sha256:
            return FetchedWheel(known, sha256, pin.version, False, "cache")
    if local is not None:
        if not local.is_file():
            raise WheelError(f"{local} is not a file", hint="pass the path of a .whl")
        digest = sha256_file(local)
        if pin.pinned and digest != pin.sha256:
            raise _mismatch(local, digest, pin, "local", "")
        check_wheel(local, pin)
        target = cached_path(cache, pin.wheel, digest)
        if not target.is_file():
            _store(local, target, move=False, origin=f"local {local}")
        return FetchedWheel(target, digest, pin.version, pin.pinned, "local")
    found = _cached(pin, cache)
    if found is not None:
        return found
    if offline:
        raise NetworkError(f"{pin.wheel} is not in the cache")
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as tmp:
        _pip_download(pin, Path(tmp), progress=progress)
        got_all = sorted(Path(tmp).glob(f"{pin.project}-{pin.version}-*.whl"))
        if not got_all:
            raise NetworkError(
                f"pip finished but left no {pin.project} {pin.version} wheel",
                hint="pass --wheel PATH",
            )
        got = got_all[0]
        if pin.pinned and got.name != pin.wheel:
            raise IntegrityError(
                f"pip fetched {got.name}, but the pin names {pin.wheel}",
                hint="check python-version and platform in patches/upstream.toml",
            )
        digest = sha256_file(got)
        if pin.pinned and digest != pin.sha256:
            where = f"; the file was moved to {_quarantine(got, cache, digest)}"
            raise _mismatch(got, digest, pin, "index", where)
        check_wheel(got, pin)
        target = cached_path(cache, got.name, digest)
        _store(got, target, move=True, origin="index")
    return FetchedWheel(target, digest, pin.version, pin.pinned, "download")


def _open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise WheelError(
            f"{path.name} is not a readable wheel ({exc})",
            hint=f"{path} is damaged: get the file again",
        ) from None


def check_wheel(path: Path, pin: Pin) -> None:
    """A readable zip whose names are safe and that carries the layout's folders."""
    archive = _open_wheel(path)
    with archive:
        _mapped_members(archive, path, pin)


def _mapped_members(
    archive: zipfile.ZipFile, path: Path, pin: Pin
) -> list[tuple[zipfile.ZipInfo, str]]:
    """(member, tree path) for what the layout carries; every name is checked
    before any content is read."""
    members: list[tuple[zipfile.ZipInfo, str]] = []
    for info in archive.infolist():
        pure = PurePosixPath(info.filename)
        if pure.is_absolute() or ".." in pure.parts:
            raise WheelError(
                f"{path.name} holds an unsafe member name {info.filename!r}",
                hint="this wheel was not built by upstream; do not use it",
            )
        target = None if info.is_dir() else pin.map_member(info.filename)
        if target is not None:
            members.append((info, target))
    if not members:
        tops = sorted({PurePosixPath(i.filename).parts[0] for i in archive.infolist()})
        raise WheelError(
            f"{path.name} is not an {pin.project} wheel: it holds nothing under "
            f"{', '.join(src for src, _ in pin.layout)} (it holds "
            f"{', '.join(tops[:4]) or 'nothing'})",
            hint=f"pass a wheel of {pin.project}",
        )
    return members


def wheel_files(path: Path, pin: Pin) -> Iterator[tuple[str, bool, bytes]]:
    """Yield (tree path, executable, content) for every file the layout carries.

    Reading each member checks its CRC, so a truncated or corrupt wheel fails
    here with a clear error; the caller builds into a staging folder, so a
    failure leaves nothing behind.
    """
    archive = _open_wheel(path)
    with archive:
        for info, target in _mapped_members(archive, path, pin):
            try:
                data = archive.read(info)
            except (zipfile.BadZipFile, EOFError, OSError) as exc:
                raise WheelError(
                    f"{path.name} is truncated or corrupt ({exc})",
                    hint=f"{path} is damaged: get the file again",
                ) from None
            # git tracks only the executable bit; keep it, drop the rest.
            yield target, bool((info.external_attr >> 16) & 0o111), data


def index_releases(pin: Pin) -> list[str]:
    """Every release of `pin.project` the package index lists for the pin's
    Python and platform, oldest first (pip's own list, asked with a version that
    cannot exist)."""
    args = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar=off",
        "--only-binary=:all:", "--python-version", pin.python_version,
        "--implementation", "cp", "--platform", pin.platform,
        "--dest", tempfile.gettempdir(), "--disable-pip-version-check",
        f"{pin.project}==0.0.0.dev0",
    ]  # fmt: skip
    result = run_command(args)
    text = result.stderr + result.stdout
    found = _VERSIONS.search(text)
    listed = (
        []
        if not found
        else [
            v.strip()
            for v in found.group(1).split(",")
            if v.strip() not in ("", "none")
        ]
    )
    if not listed:
        raise NetworkError(
            f"could not reach the package index to list {pin.project} releases",
            hint="name the releases: 'xpu-series matrix 0.5.20 0.5.23' (with "
            "--wheel PATH for each when offline)",
        )
    return listed
