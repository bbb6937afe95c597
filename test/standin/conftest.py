"""test/standin: the CPU stand-in's module is importable from its tests, and the
real servers its tests share: two stand-in servers (chunked and not) with the
fork wheel's plugin on their path, started once for the whole run (a server
start costs most of a minute of CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_standin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "sglang" / "python"
# The chunk size of the "on" server.
CHUNK = 64
READY_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pin's fork wheel, less its sglang/ (the servers import build/sglang,
    the same bytes): the plugin package and the dist-info whose entry point
    names it."""
    if not (TREE.parent / ".git").exists():
        pytest.skip("no patched tree at build/sglang: run scripts/bootstrap first")
    from xpu_series.fork.wheel import WheelRequest, build_fork_wheel
    from xpu_series.project import Project

    out = tmp_path_factory.mktemp("wheel")
    built = build_fork_wheel(Project(ROOT), WheelRequest(out=out))
    dest = tmp_path_factory.mktemp("plugins")
    with zipfile.ZipFile(built.path) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if not n.startswith("sglang/")])
    return dest


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


def _start(chunk: int, log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "sglang.launch_server", *cpu_standin.launch_args(),
        "--port", str(port), "--chunked-prefill-size", str(chunk),
        "--random-seed", "1",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
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


@pytest.fixture(scope="session")
def servers(
    tmp_path_factory: pytest.TempPathFactory, plugin_path: Path
) -> Iterator[dict]:
    """Two servers on the stand-in, started together, the fork's plugin on
    their path: chunked (CHUNK) and not. Their URLs under "on" and "off", the
    files their output goes to under "logs"."""
    folder = tmp_path_factory.mktemp("servers")
    logs = {name: folder / f"{name}.log" for name in ("on", "off")}
    env = plugin_env(plugin_path)
    started = [_start(CHUNK, logs["on"], env), _start(-1, logs["off"], env)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s, n: _wait_ready(*s, logs[n]), started,
                          ["on", "off"]))  # fmt: skip
        yield {"on": started[0][1], "off": started[1][1], "logs": logs}
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
