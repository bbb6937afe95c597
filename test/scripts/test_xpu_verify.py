"""scripts/xpu-verify against a fake OpenAI-compatible server on loopback."""

from __future__ import annotations

import doctest
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import SCRIPTS, load_script

verify_script = load_script("xpu-verify")


def _handler(answer: dict | None, hang_chat: bool = False):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server API)
            self._send({"data": [{"id": "Qwen/Qwen3-0.6B"}]})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["model"] == "Qwen/Qwen3-0.6B"
            if hang_chat:
                time.sleep(30)  # accepted, never answered (a TP all-reduce hang)
                return
            self._send({"choices": [{"message": answer}]})

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def serve() -> Iterator:
    servers = []

    def start(answer: dict | None = None, hang_chat: bool = False) -> int:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer, hang_chat))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run(
    port: int, *extra: str, timeout: float = 20, env: dict | None = None
) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "xpu-verify"), "--port", str(port), *extra],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        env=env,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_good_answer_passes(serve) -> None:
    port = serve({"content": "Hi! I am a small language model, happy to help."})
    code, out, _ = run(port)
    assert code == 0, out
    assert "READY after" in out and "content: Hi! I am" in out
    assert "SMOKE TEST PASS" in out


def test_reasoning_content_is_used_when_content_is_empty(serve) -> None:
    port = serve({"content": "", "reasoning_content": "The user wants a greeting."})
    code, out, _ = run(port)
    assert code == 0, out
    assert "content: The user wants a greeting." in out


def test_run_of_bangs_is_garbage(serve) -> None:
    port = serve({"content": "!!!!!!!!!!!!!!!!!!!!!!!!"})
    code, out, _ = run(port)
    assert code == 1
    assert "GARBAGE: a run of '!'" in out and "next:" in out


def test_raw_channel_tokens_are_garbage(serve) -> None:
    port = serve({"content": "<|channel|>analysis<|message|>The user says hi"})
    code, out, _ = run(port)
    assert code == 1
    assert "GARBAGE: raw <|channel|> tokens" in out


def test_empty_answer_is_garbage(serve) -> None:
    code, out, _ = run(serve({"content": ""}))
    assert code == 1 and "GARBAGE: empty content" in out


def test_server_that_never_answers_fails_within_the_bound(serve) -> None:
    port = serve(hang_chat=True)
    code, out, elapsed = run(port, "--timeout", "4")
    assert code == 1
    assert "WARMUP TIMED OUT" in out and "tp_collective_probe" in out
    assert elapsed < 10


def test_absent_server_is_not_ready(tmp_path) -> None:
    code, out, elapsed = run(free_port(), "--timeout", "3")
    assert code == 1
    assert "NOT READY" in out and "next:" in out
    assert elapsed < 10


def test_dead_container_is_reported_as_died(tmp_path) -> None:
    # A docker CLI whose `ps` lists no running containers.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text("#!/bin/sh\nexit 0\n")
    (fake / "docker").chmod(0o755)
    env_path = f"{fake}:/usr/bin:/bin"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "xpu-verify"), "--port", str(free_port()),
         "--container", "sglang-xpu", "--timeout", "20"],
        capture_output=True, text=True, env={"PATH": env_path}, timeout=40,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "DIED: container sglang-xpu is not running" in proc.stdout
    assert "docker logs --tail 50 sglang-xpu" in proc.stdout
    assert time.monotonic() - start < 10


def test_doctests() -> None:
    result = doctest.testmod(verify_script)
    assert result.attempted >= 3 and result.failed == 0


def _docker_exec(tmp_path, answer: str, code: int = 0) -> dict:
    """A docker CLI whose `ps` lists the container and whose `exec` answers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "answer").write_text(answer)
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = ps ]; then echo srv; exit 0; fi\n'
        f'if [ "$1" = exec ]; then cat {tmp_path / "answer"}; exit {code}; fi\n'
    )
    (bin_dir / "docker").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_the_fork_container_says_which_series_it_serves(serve, tmp_path) -> None:
    status = {
        "ok": True,
        "version": "0.5.23+xpu.sabc",
        "provenance": {
            "series_sha256": "abcdef0123456789" * 4,
            "release": "0.5.23",
            "patches": [{"name": "0003-x.patch"}, {"name": "0005-y.patch"}],
        },
        "files": [{"path": "sglang/a.py", "state": "intact"}],
    }
    port = serve({"content": "Hi there, nice to meet you today!"})
    env = _docker_exec(tmp_path, json.dumps(status))
    code, out, _ = run(port, "--container", "srv", env=env)
    assert code == 0, out
    assert (
        "SERIES: sglang-xpu abcdef012345 on sglang 0.5.23 (2 patches, files intact)"
        in out
    )


def test_a_stock_container_is_said_to_serve_upstream(serve, tmp_path) -> None:
    port = serve({"content": "Hi there, nice to meet you today!"})
    env = _docker_exec(tmp_path, "exec: xpu-series: not found", code=127)
    code, out, _ = run(port, "--container", "srv", env=env)
    assert code == 0, out
    assert "SERIES: upstream sglang as released" in out
