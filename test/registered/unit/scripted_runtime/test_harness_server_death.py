"""A scripted-runtime server that dies while starting fails the test at once, with
the server's own error, instead of after the harness's whole accept timeout."""

import io
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

import psutil
import zmq
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import sock_send, wrap_as_pickle
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.scripted_runtime import http_server
from sglang.test.scripted_runtime.io_struct import HookReady, OutOfBandError
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "standin"))
import cpu_standin  # noqa: E402

register_cpu_ci(est_time=90, suite="base-a-test-cpu")

# Long enough for a server to die on a busy machine (CI runs servers side by
# side). A harness that waits it out is failed sooner than that: AFTER_DEATH_S
# after its server process is gone, if it is still waiting. The patched harness
# notices within HANDSHAKE_POLL_INTERVAL_S (0.5 s); the unpatched one waits all
# of AFTER_DEATH_S, in verify and in the matrix, so it is no longer than that.
ACCEPT_TIMEOUT_S = 300.0
AFTER_DEATH_S = 8.0


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _server_processes(me: psutil.Process, before: set[int]) -> list[psutil.Process]:
    """The children started since `before`, but not multiprocessing's resource
    tracker, which outlives every server."""
    out = []
    for child in me.children():
        if child.pid in before:
            continue
        try:
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.Error:
            pass
        out.append(child)
    return out


def _die_with_a_log(log_path: str, lines: int, code: int) -> None:
    """A server process that writes its last words to its log and exits."""
    with open(log_path, "a") as log:
        for i in range(1, lines + 1):
            log.write(f"server line {i}\n")
    os._exit(code)


def _stay_alive(seconds: float) -> None:
    time.sleep(seconds)


def _launch_that_prints(*args, **kwargs) -> None:
    os.write(1, b"from stdout\n")
    os.write(2, b"from stderr\n")


def _child_launch(oob_path: str) -> None:
    """The server process's entry point with launch_server replaced by a print."""
    with envs.SGLANG_TEST_SCRIPTED_RUNTIME_OUT_OF_BAND_ERROR_PATH.override(oob_path):
        with mock.patch.object(http_server, "launch_server", _launch_that_prints):
            http_server._launch_scripted_http_server(model_path="unused")


class TestHandshakeWatchesTheServerProcess(CustomTestCase):
    """The harness side, against stand-in server processes (no sglang server)."""

    def setUp(self):
        self.folder = Path(tempfile.mkdtemp(prefix="harness-death-"))
        self.addCleanup(shutil.rmtree, self.folder, ignore_errors=True)
        self.oob = self.folder / "oob.json"
        self.oob.write_text("")
        self.log = http_server._server_log_path(self.oob)
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, linger=0)
        self.socket = self.ctx.socket(zmq.PAIR)
        self.socket.bind("tcp://127.0.0.1:*")

    def _process(self, target, *args):
        process = mp.get_context("fork").Process(target=target, args=args)
        process.start()
        self.addCleanup(process.kill)
        return process

    def _server(self, process) -> http_server.ScriptedHttpServer:
        return http_server.ScriptedHttpServer(
            ctx=self.ctx,
            socket=self.socket,
            server_process=process,
            out_of_band_error_path=self.oob,
            http_port=1,
        )

    def _dead_server(self, lines: int = 50, code: int = 3):
        process = self._process(_die_with_a_log, str(self.log), lines, code)
        process.join(timeout=30)
        return self._server(process)

    def test_a_dead_server_fails_the_handshake_with_its_exit_code_and_log(self):
        server = self._dead_server()
        with mock.patch.object(http_server, "LISTENER_ACCEPT_TIMEOUT_S", 30.0):
            with self.assertRaises(RuntimeError) as caught:
                server._await_handshake()
        report = str(caught.exception)
        self.assertIn("exit code 3", report)
        self.assertIn("before it connected", report)
        quoted = [line for line in report.splitlines() if line.startswith("server")]
        # The last DEATH_LOG_TAIL_LINES (40) lines, in order.
        self.assertEqual(quoted, [f"server line {i}" for i in range(11, 51)])

    def test_the_out_of_band_error_is_quoted_too(self):
        self.oob.write_text(OutOfBandError(traceback="the hook failed here").to_json())
        server = self._dead_server(lines=1)
        with self.assertRaises(RuntimeError) as caught:
            server._await_handshake()
        self.assertIn("the hook failed here", str(caught.exception))
        self.assertIn("server line 1", str(caught.exception))

    def test_a_death_during_http_startup_is_reported_the_same_way(self):
        server = self._dead_server(lines=2, code=5)
        with self.assertRaises(RuntimeError) as caught:
            server._await_http_ready()
        report = str(caught.exception)
        self.assertIn("exit code 5", report)
        self.assertIn("during HTTP startup", report)
        self.assertIn("server line 2", report)

    def test_a_live_server_that_never_connects_still_times_out(self):
        server = self._server(self._process(_stay_alive, 30))
        with mock.patch.object(http_server, "LISTENER_ACCEPT_TIMEOUT_S", 1.0):
            with self.assertRaises(TimeoutError):
                server._await_handshake()

    def test_a_slow_live_server_gets_the_whole_timeout(self):
        server = self._server(self._process(_stay_alive, 30))
        endpoint = self.socket.getsockopt(zmq.LAST_ENDPOINT).decode()

        def connect_late():
            time.sleep(2.0)
            peer = self.ctx.socket(zmq.PAIR)
            peer.connect(endpoint)
            sock_send(peer, wrap_as_pickle(HookReady()))

        threading.Thread(target=connect_late, daemon=True).start()
        with mock.patch.object(http_server, "LISTENER_ACCEPT_TIMEOUT_S", 20.0):
            server._await_handshake()  # no TimeoutError: it connected in time

    def test_the_server_process_writes_its_output_to_the_log(self):
        process = self._process(_child_launch, str(self.oob))
        process.join(timeout=30)
        self.assertEqual(self.log.read_text(), "from stdout\nfrom stderr\n")

    def test_teardown_copies_the_log_to_stderr_and_removes_it(self):
        server = self._dead_server(lines=3)
        stderr = io.StringIO()
        with mock.patch("sys.stderr", stderr):
            server._teardown()
        self.assertEqual(
            stderr.getvalue(), "server line 1\nserver line 2\nserver line 3\n"
        )
        self.assertFalse(self.log.exists())
        self.assertFalse(self.oob.exists())

    def test_teardown_of_a_server_that_never_wrote_a_log_is_quiet(self):
        process = self._process(_stay_alive, 0)
        process.join(timeout=30)
        server = self._server(process)
        stderr = io.StringIO()
        with mock.patch("sys.stderr", stderr):
            server._teardown()
        self.assertEqual(stderr.getvalue(), "")
        self.assertFalse(self.oob.exists())


class TestServerDeathBeforeHandshake(CustomTestCase):
    """Real servers on the CPU stand-in, each broken in one place."""

    def _start_fails(self, model: Path) -> str:
        """Start a broken server; the harness must raise RuntimeError soon after
        the server process is gone (not the TimeoutError of waiting it out)."""
        kwargs = dict(cpu_standin.engine_kwargs(), model_path=str(model))
        raised: list[BaseException] = []

        def start() -> None:
            try:
                http_server.ScriptedHttpServer.start(**kwargs)
            except BaseException as exc:  # noqa: BLE001 - judged below
                raised.append(exc)

        me = psutil.Process()
        before = {child.pid for child in me.children()}
        with mock.patch.object(
            http_server, "LISTENER_ACCEPT_TIMEOUT_S", ACCEPT_TIMEOUT_S
        ):
            # A daemon: a harness that never notices keeps waiting after the
            # test has failed it, and must not keep pytest from exiting.
            waiting = threading.Thread(target=start, daemon=True)
            waiting.start()
            died_at = None
            while waiting.is_alive():
                waiting.join(0.5)
                servers = _server_processes(me, before)
                if servers and all(_gone(p) for p in servers):
                    died_at = died_at or time.monotonic()
                    if (
                        waiting.is_alive()
                        and time.monotonic() - died_at > AFTER_DEATH_S
                    ):
                        self.fail(
                            f"the server process died {AFTER_DEATH_S:.0f} s ago and "
                            "the harness is still waiting for it"
                        )
        self.assertTrue(raised, "the broken server's start did not fail")
        self.assertIsInstance(raised[0], RuntimeError, repr(raised[0]))
        return str(raised[0])

    def _model_copy(self, *, weights: bool, config: dict | None = None) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="standin-broken-"))
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        for path in cpu_standin.model_dir().iterdir():
            if weights or not path.name.endswith(".safetensors"):
                shutil.copy(path, folder / path.name)
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        return folder

    def test_an_error_in_the_server_process_is_quoted(self):
        model = self._model_copy(weights=True, config={"model_type": "no-such-arch"})
        report = self._start_fails(model)
        self.assertIn("server process exited", report)
        self.assertIn("no-such-arch", report)

    def test_a_scheduler_that_dies_loading_weights_is_quoted(self):
        model = self._model_copy(weights=False)
        report = self._start_fails(model)
        self.assertIn("server process exited", report)
        # The scheduler's own error (another process) is in the quoted log.
        self.assertIn("weights", report.lower())
        self.assertIn(str(model), report)


if __name__ == "__main__":
    unittest.main()
