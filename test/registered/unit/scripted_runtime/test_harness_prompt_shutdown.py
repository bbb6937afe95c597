"""Shutting a scripted-runtime server down stops its HTTP server once the scheduler
has had a moment to finish, instead of waiting for a process that never exits."""

import multiprocessing as mp
import os
import signal
import tempfile
import time
import unittest
from pathlib import Path
from unittest import mock

import zmq
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.scripted_runtime import http_server
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

EXITS_ON_ITS_OWN_AFTER_S = 30
STOPPED, WAITED_OUT = 0, 7


def _http_server_that_keeps_serving() -> None:
    """What the server process does after Shutdown: its scheduler is gone, its HTTP
    server serves on until it is told to stop (SIGTERM: a graceful exit)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(STOPPED))
    time.sleep(EXITS_ON_ITS_OWN_AFTER_S)
    os._exit(WAITED_OUT)


class TestShutdownStopsTheServer(CustomTestCase):
    def test_shutdown_stops_a_server_whose_http_side_keeps_running(self):
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, linger=0)
        socket = ctx.socket(zmq.PAIR)
        socket.bind("tcp://127.0.0.1:*")
        # The scheduler's end of the pair: without a peer, a release whose
        # shutdown sends Shutdown blocking (0.5.20) would wait forever. It has
        # its own context, as the scheduler has: the harness terminates ctx,
        # and a term waits for every socket still open in it.
        scheduler_ctx = zmq.Context()
        self.addCleanup(scheduler_ctx.destroy, linger=0)
        scheduler = scheduler_ctx.socket(zmq.PAIR)
        scheduler.connect(socket.getsockopt(zmq.LAST_ENDPOINT).decode())
        process = mp.get_context("fork").Process(target=_http_server_that_keeps_serving)
        process.start()
        self.addCleanup(process.kill)
        fd, oob = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        server = http_server.ScriptedHttpServer(
            ctx=ctx,
            socket=socket,
            server_process=process,
            out_of_band_error_path=Path(oob),
            http_port=1,
        )
        # Longer than the stand-in lives: a harness that only waits for the
        # process to exit sees it exit on its own, not stopped.
        with mock.patch.object(
            http_server, "SHUTDOWN_JOIN_TIMEOUT_S", 2 * EXITS_ON_ITS_OWN_AFTER_S
        ):
            server.shutdown()
        self.assertFalse(process.is_alive())
        self.assertEqual(process.exitcode, STOPPED)
        self.assertFalse(Path(oob).exists())


if __name__ == "__main__":
    unittest.main()
