"""Get the upstream wheel into the cache, prove its hash, and unpack it safely."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from xpu_series.errors import IntegrityError, NetworkError, WheelError
from xpu_series.git import run_command
from xpu_series.pin import Pin

_CHUNK = 1 << 20
# pip's own words when the index cannot be reached or does not have the file.
_NETWORK_MARKERS = (
    "Could not find a version",
    "No matching distribution",
    "Failed to establish a new connection",
    "Connection refused",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Max retries exceeded",
    "ConnectTimeout",
)


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


def _check_hash(path: Path, pin: Pin, cache: Path, *, owned: bool) -> str:
    digest = sha256_file(path)
    if pin.pinned and digest != pin.sha256:
        where = ""
        if owned:
            where = f"; the file was moved to {_quarantine(path, cache, digest)}"
        raise IntegrityError(
            f"{path.name} has sha256 {digest}, but the pin says {pin.sha256}{where}",
            hint="the index served a different file, or the pin is wrong: "
            "check patches/upstream.toml before trusting this wheel",
        )
    return digest


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
    if result.ok:
        return
    text = result.stderr + result.stdout
    if not progress and not any(m in text for m in _NETWORK_MARKERS):
        lines = text.strip().splitlines()
        raise NetworkError(
            f"pip could not download {pin.project}=={pin.version}: "
            f"{lines[-1] if lines else 'no output'}",
            hint=f"download {pin.wheel} yourself and pass --wheel PATH",
        )
    raise NetworkError(
        f"could not get {pin.wheel} from the package index (no network, or the "
        "index does not have it) and it is not in the cache",
        hint=f"copy the file from a machine that has it and run "
        f"'xpu-series fetch --wheel PATH/{pin.wheel}'",
    )


def fetch_wheel(
    pin: Pin, cache: Path, *, local: Path | None = None, progress: bool = False
) -> FetchedWheel:
    """The pinned wheel from the cache, a local file, or the index (in that order).

    The hash is checked before the file is used for anything. A pinned file that
    does not match is moved to `<cache>/rejected/` (never a user's own --wheel file).
    """
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    cached = wheels / pin.wheel
    if local is not None:
        if not local.is_file():
            raise WheelError(f"{local} is not a file", hint="pass the path of a .whl")
        digest = _check_hash(local, pin, cache, owned=False)
        if local.resolve() != cached.resolve():
            tmp = cached.with_suffix(".part")
            shutil.copyfile(local, tmp)
            os.replace(tmp, cached)
        return FetchedWheel(cached, digest, pin.version, pin.pinned, "local")
    if cached.is_file():
        digest = _check_hash(cached, pin, cache, owned=True)
        return FetchedWheel(cached, digest, pin.version, pin.pinned, "cache")
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as tmp:
        _pip_download(pin, Path(tmp), progress=progress)
        found = sorted(Path(tmp).glob(f"{pin.project}-{pin.version}-*.whl"))
        if not found:
            raise NetworkError(
                f"pip finished but left no {pin.project} {pin.version} wheel",
                hint="pass --wheel PATH",
            )
        got = found[0]
        if pin.pinned and got.name != pin.wheel:
            raise IntegrityError(
                f"pip fetched {got.name}, but the pin names {pin.wheel}",
                hint="check python-version and platform in patches/upstream.toml",
            )
        digest = _check_hash(got, pin, cache, owned=True)
        target = wheels / got.name
        os.replace(got, target)
    return FetchedWheel(target, digest, pin.version, pin.pinned, "download")


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
        raise WheelError(
            f"{path.name} holds nothing under "
            f"{', '.join(src for src, _ in pin.layout)}",
            hint="check [layout] in patches/upstream.toml",
        )
    return members


def wheel_files(path: Path, pin: Pin) -> Iterator[tuple[str, bool, bytes]]:
    """Yield (tree path, executable, content) for every file the layout carries.

    Reading each member checks its CRC, so a truncated or corrupt wheel fails
    here with a clear error; the caller builds into a staging folder, so a
    failure leaves nothing behind.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise WheelError(
            f"{path.name} is not a readable wheel ({exc})",
            hint=f"delete {path} and run 'xpu-series fetch' again",
        ) from None
    with archive:
        for info, target in _mapped_members(archive, path, pin):
            try:
                data = archive.read(info)
            except (zipfile.BadZipFile, EOFError, OSError) as exc:
                raise WheelError(
                    f"{path.name} is truncated or corrupt ({exc})",
                    hint=f"delete {path} and run 'xpu-series fetch' again",
                ) from None
            # git tracks only the executable bit; keep it, drop the rest.
            yield target, bool((info.external_attr >> 16) & 0o111), data
