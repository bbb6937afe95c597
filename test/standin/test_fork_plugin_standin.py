"""The fork wheel's `sglang.srt.plugins` entry point on a real SGLang server on the
CPU stand-in: the series' line is in the server's log (from each process that loads
plugins, with no warning: the running files are the series'), and SGLANG_PLUGINS
naming another plugin keeps it out."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import cpu_standin
import pytest

from xpu_series.fork.wheel import WheelRequest, build_fork_wheel
from xpu_series.project import Project

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "sglang" / "python"
READY_TIMEOUT_S = 300
LINE = re.compile(
    r"sglang-xpu: series s([0-9a-f]{12}) \((\d+) patches, .* on sglang (\S+)"
)


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pin's fork wheel, less its sglang/ (the server imports build/sglang, the
    same bytes): the plugin package and the dist-info whose entry point names it."""
    if not (TREE.parent / ".git").exists():
        pytest.skip("no patched tree at build/sglang: run scripts/bootstrap first")
    out = tmp_path_factory.mktemp("wheel")
    built = build_fork_wheel(Project(ROOT), WheelRequest(out=out))
    dest = tmp_path_factory.mktemp("plugins")
    with zipfile.ZipFile(built.path) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if not n.startswith("sglang/")])
    return dest


def _env(plugin_path: Path, **extra: str) -> dict[str, str]:
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


def _serve_once(env: dict[str, str], log: Path) -> str:
    """Start a stand-in server, wait until it answers, stop it; return its log."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "sglang.launch_server", *cpu_standin.launch_args(),
        "--port", str(port),
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
                )
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"server not ready:\n{log.read_text()[-3000:]}")
                time.sleep(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return log.read_text()


def test_the_server_logs_the_series_in_every_process_that_loads_plugins(
    plugin_path: Path, tmp_path: Path
) -> None:
    dist = next(plugin_path.glob("sglang-*.dist-info"))
    identity = json.loads((dist / "xpu_series.json").read_text())
    stale = [
        rel
        for rel, sha in identity["files"].items()
        if sha and hashlib.sha256((TREE / rel).read_bytes()).hexdigest() != sha
    ]
    assert not stale, (
        f"build/sglang is not the series: run 'xpu-series apply' ({stale})"
    )
    text = _serve_once(_env(plugin_path), tmp_path / "server.log")
    found = [m.groups() for m in LINE.finditer(text)]
    # The launcher, the scheduler and the detokenizer each load plugins.
    assert len(found) >= 3, text[-3000:]
    series = identity["series_sha256"][:12]
    assert set(found) == {(series, str(len(identity["patches"])), identity["version"])}
    # The server runs build/sglang, whose files are the series' (checked above).
    assert "differs from the series' file" not in text
    assert "is missing" not in text and "cannot describe" not in text


def _load_plugins(env: dict[str, str]) -> str:
    """What sglang's own loader (the one each server process calls) prints."""
    code = "from sglang.srt.plugins import load_plugins; load_plugins()"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_sglang_plugins_naming_another_plugin_keeps_the_line_out(
    plugin_path: Path,
) -> None:
    kept = _load_plugins(_env(plugin_path, SGLANG_PLUGINS="xpu_series"))
    assert LINE.search(kept), kept[-3000:]
    other = _load_plugins(_env(plugin_path, SGLANG_PLUGINS="someone_else"))
    assert not LINE.search(other), other[-3000:]
