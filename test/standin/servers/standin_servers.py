"""The stand-in servers' shared pieces: where the tree is, the plugin's
environment, and how a server is started and awaited (conftest.py makes the
session's servers from them)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import cpu_standin

ROOT = Path(__file__).resolve().parents[3]
TREE = ROOT / "build" / "sglang" / "python"
# The chunk size of the "on" server.
CHUNK = 64
# What the "off" server's SGLANG_PLUGINS names: a plugin that is not installed.
OTHER_PLUGIN = "someone_else"
READY_TIMEOUT_S = 300


def plugin_env(plugin_path: Path, **extra: str) -> dict[str, str]:
    """The stand-in's environment with the plugin importable; SGLANG_PLUGINS
    only when `extra` names it."""
    env = {**os.environ, **cpu_standin.ENVIRONMENT, **extra}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(plugin_path), os.environ.get("PYTHONPATH", "")) if p
    )
    if "SGLANG_PLUGINS" not in extra:
        env.pop("SGLANG_PLUGINS", None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    chunk: int, log: Path, env: dict[str, str]
) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "sglang.launch_server", *cpu_standin.launch_args(),
        "--port", str(port), "--chunked-prefill-size", str(chunk),
        "--random-seed", "1",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"server at {url} not ready:\n{log.read_text()[-3000:]}")


def build_plugin_path(out: Path, dest: Path) -> Path:
    """The pin's fork wheel built into `out`, extracted into `dest` less its
    sglang/ (the servers import build/sglang, the same bytes): the plugin
    package and the dist-info whose entry point names it."""
    from xpu_series.fork.wheel import WheelRequest, build_fork_wheel
    from xpu_series.project import Project

    built = build_fork_wheel(Project(ROOT), WheelRequest(out=out))
    with zipfile.ZipFile(built.path) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if not n.startswith("sglang/")])
    return dest
