"""Containers without a registry, for scripts/check_image.py: buildah and mmdebstrap.

Images are built as root with chroot isolation (no daemon, no user namespaces),
in a storage of their own under the project's cache: on the kernel's overlay
driver where it mounts (layers shared, not copied), else on vfs. The stand-in
base's root filesystem is made from Debian's packages by mmdebstrap. Everything
made is kept by the content it was made from: `content_key` of what went in names
the tarball or the image, so a warm run finds it and builds nothing.
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# Bumped when what a key stands for changes (a new build recipe).
FORMAT = "1"
TOOLS = ("buildah", "mmdebstrap")
# A progress line at least this often while the root filesystem is made.
HEARTBEAT_S = 15.0
INSTALL_HINT = "apt-get install buildah mmdebstrap (as root; Debian's packages)"
# apt's words when the archive cannot be reached (mmdebstrap runs apt too).
_UNREACHABLE = (
    "Temporary failure resolving",
    "Could not resolve",
    "Failed to fetch",
    "Unable to connect",
    "Network is unreachable",
    "Connection failed",
)


class BuildFailed(Exception):
    """A command of the build failed; the message has its command and output."""


class Unreachable(Exception):
    """The Debian archive cannot be reached: said, and the build is skipped."""


def content_key(*parts: object) -> str:
    """The sha256 of what something is made from (JSON-encoded parts).

    >>> content_key("a", 1) == content_key("a", 1) != content_key("a", 2)
    True
    """
    text = json.dumps([FORMAT, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def tree_digest(root: Path, names: Iterable[str]) -> str:
    """The sha256 of the files under each name (a file or a folder), by path and
    content; bytecode caches are not content."""
    h = hashlib.sha256()
    for name in names:
        top = root / name
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in files:
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def unreachable(text: str) -> bool:
    return any(marker in text for marker in _UNREACHABLE)


def tools_missing(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    return [tool for tool in TOOLS if which(tool) is None]


def install_tools(say: Callable[[str], None]) -> None:
    """apt-get the missing tools (CI's machines start without them)."""
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", *TOOLS],
    ):
        say("installing: " + " ".join(cmd))
        start = time.monotonic()
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        )
        if proc.returncode != 0:
            text = proc.stdout[-2000:] + proc.stderr[-2000:]
            if unreachable(text):
                raise Unreachable(
                    f"{' '.join(cmd)}: the Debian archive cannot be reached"
                )
            raise BuildFailed(f"{' '.join(cmd)} exited {proc.returncode}\n{text}")
        say(f"installing: done in {time.monotonic() - start:.1f}s")
    missing = tools_missing()
    if missing:
        raise BuildFailed(
            f"apt-get install ran, but {', '.join(missing)} is still not on PATH"
        )


@dataclass(frozen=True)
class RootfsSpec:
    """What the stand-in base's root filesystem is made of."""

    suite: str
    packages: tuple[str, ...]
    variant: str = "essential"
    # Documentation and translations: nothing the image runs reads them.
    excludes: tuple[str, ...] = (
        "/usr/share/doc/*",
        "/usr/share/man/*",
        "/usr/share/locale/*",
        "/usr/share/info/*",
    )

    def command(self, target: Path) -> list[str]:
        cmd = ["mmdebstrap", f"--variant={self.variant}", "--format=tar"]
        cmd += [f"--include={','.join(self.packages)}"]
        # The files are unpacked into a scratch folder and tarred: no fsync.
        cmd += ["--dpkgopt=force-unsafe-io"]
        cmd += [f"--dpkgopt=path-exclude={glob}" for glob in self.excludes]
        return [*cmd, self.suite, str(target)]

    def key(self) -> str:
        return content_key("rootfs", self.command(Path("-")), _version("mmdebstrap"))


def _version(tool: str) -> str:
    try:
        proc = subprocess.run([tool, "--version"], capture_output=True, text=True)
    except OSError:
        return ""
    return proc.stdout.strip()


def _lines(stream: IO[str], quiet_s: float) -> Iterator[str | None]:
    """The stream's lines as they come, and None after each `quiet_s` without one."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=quiet_s)
        except queue.Empty:
            yield None
            continue
        if line is None:
            return
        yield line


def make_rootfs(spec: RootfsSpec, folder: Path, say: Callable[[str], None]) -> Path:
    """The root filesystem tarball for `spec`, made once (its progress said line by
    line as mmdebstrap tells it) and then reused."""
    key = spec.key()
    target = folder / f"{key}.tar"
    if target.is_file():
        say(f"rootfs: cached {target.name[:16]} ({target.stat().st_size >> 20} MiB)")
        return target
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".{key}.part.tar"
    cmd = spec.command(part)
    say("rootfs: " + " ".join(cmd))
    start = time.monotonic()
    # Its scratch folder on tmpfs when there is one: unpacking is most of its time.
    env = dict(os.environ)
    if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK):
        env["TMPDIR"] = "/dev/shm"
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    tail: list[str] = []
    for line in _lines(proc.stdout, HEARTBEAT_S):
        took = time.monotonic() - start
        if line is None:  # mmdebstrap says nothing while it unpacks: we do
            say(f"rootfs: {took:5.1f}s ... {tail[-1].strip() if tail else 'starting'}")
            continue
        tail = [*tail[-40:], line]
        say(f"rootfs: {took:5.1f}s {line.rstrip()}")
    if proc.wait() != 0:
        part.unlink(missing_ok=True)
        text = "".join(tail)
        if unreachable(text):
            raise Unreachable("mmdebstrap: the Debian archive cannot be reached")
        raise BuildFailed(f"mmdebstrap exited {proc.returncode}\n{text}")
    os.replace(part, target)
    (folder / f"{key}.json").write_text(
        json.dumps({"command": cmd[:-1], "seconds": time.monotonic() - start}) + "\n"
    )
    for old in folder.glob("*.tar"):
        if old != target:  # an older recipe's: never read again
            old.unlink()
            old.with_suffix(".json").unlink(missing_ok=True)
    size = target.stat().st_size >> 20
    say(f"rootfs: made in {time.monotonic() - start:.1f}s, {size} MiB")
    return target


# Where the kernel mounts overlay (as root on ext4 or xfs), a layer is a
# mount; on vfs each layer is a full copy of the image, which made most of the
# image step's system time.
DRIVERS = ("overlay", "vfs")
DRIVER_ENV = "XPU_SERIES_BUILDAH_DRIVER"


def storage_driver(folder: Path) -> str:
    """The storage driver buildah can use under `folder`: overlay when a probe
    store there can make a container, vfs otherwise ($XPU_SERIES_BUILDAH_DRIVER
    chooses)."""
    chosen = os.environ.get(DRIVER_ENV, "").strip()
    if chosen:
        if chosen not in DRIVERS:
            raise BuildFailed(
                f"{DRIVER_ENV}={chosen}: not a storage driver here "
                f"(one of {', '.join(DRIVERS)})"
            )
        return chosen
    probe = folder / "probe"
    base = [
        "buildah", "--root", str(probe / "storage"), "--runroot",
        str(probe / "run"), "--storage-driver", "overlay",
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    try:
        made = subprocess.run(
            [*base, "from", "--quiet", "scratch"], capture_output=True, text=True
        )
        if made.returncode == 0:
            subprocess.run([*base, "rm", made.stdout.strip()], capture_output=True)
    except OSError:
        return "vfs"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return "overlay" if made.returncode == 0 else "vfs"


class Buildah:
    """buildah on a storage of its own (chroot isolation, as root), one per
    storage driver (a store cannot change its driver)."""

    def __init__(self, folder: Path, driver: str | None = None) -> None:
        self.folder = folder
        self.driver = driver or storage_driver(folder)
        # vfs keeps the folder it always had, so an existing store stays valid.
        name = "storage" if self.driver == "vfs" else f"storage-{self.driver}"
        self.base = [
            "buildah",
            "--root", str(folder / name),
            "--runroot", str(folder / f"run-{self.driver}"),
            "--storage-driver", self.driver,
        ]  # fmt: skip
        self.env = dict(os.environ, BUILDAH_ISOLATION="chroot")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.base, *args], capture_output=True, text=True, env=self.env
        )
        if check and proc.returncode != 0:
            raise BuildFailed(
                f"buildah {' '.join(args)} exited {proc.returncode}\n"
                f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        return proc

    def stream(
        self, args: list[str], say: Callable[[str], None], prefix: str
    ) -> tuple[int, str]:
        """Run buildah, telling its output line by line; its exit code and output."""
        proc = subprocess.Popen(
            [*self.base, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            say(f"{prefix}{line.rstrip()}")
        return proc.wait(), "".join(lines)

    def inspect(self, image: str) -> dict | None:
        """The image's buildah inspect record, or None when the store lacks it."""
        proc = self.run("inspect", "--type", "image", image, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def image_id(self, image: str) -> str | None:
        data = self.inspect(image)
        return data["FromImageID"] if data else None

    def config(self, image: str) -> dict:
        """The OCI config of an image: User, Env, Cmd, Entrypoint, Labels."""
        data = self.inspect(image)
        if data is None:
            raise BuildFailed(f"the store has no image {image}")
        return data["OCIv1"].get("config", {})

    def images(self, repository: str) -> list[str]:
        """Every tag of `repository` (e.g. localhost/x/fork) in the store."""
        proc = self.run("images", "--json", check=False)
        found = []
        for image in json.loads(proc.stdout or "[]"):
            found += [
                n for n in image.get("names") or [] if n.startswith(repository + ":")
            ]
        return found

    def container(self, image: str) -> str:
        """A working container of `image` (remove it with `rm`)."""
        return self.run("from", "--pull=never", "--quiet", image).stdout.strip()

    def inside(
        self, container: str, *cmd: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run(
            "run", "--isolation", "chroot", container, "--", *cmd, check=check
        )


def log(text: str) -> None:
    """One progress line, now (the step runner relays it as it comes)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
