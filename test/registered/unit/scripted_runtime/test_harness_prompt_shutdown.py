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

# Past the grace below with room for a loaded machine, and no longer: a harness
# without the patch waits all of it.
EXITS_ON_ITS_OWN_AFTER_S = 8
# The grace the test of a server that never exits gives the harness instead of
# its 5 s, which every run of it (verify's, the matrix's, each mutant's) would
# wait out. Created where it does not exist: a harness without the patch never
# reads it, and fails as before.
GRACE_S = 2.0
# A server whose scheduler finishes promptly after Shutdown: well inside the
# harness's own grace (SHUTDOWN_GRACE_S, 5 s), even on a loaded machine.
FINISHES_AFTER_S = 0.5
STOPPED, WAITED_OUT, FINISHED = 0, 7, 3


def _http_server_that_keeps_serving() -> None:
    """What the server process does after Shutdown: its scheduler is gone, its HTTP
    server serves on until it is told to stop (SIGTERM: a graceful exit)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(STOPPED))
    time.sleep(EXITS_ON_ITS_OWN_AFTER_S)
    os._exit(WAITED_OUT)


def _server_that_finishes_soon() -> None:
    """A server process that exits by itself shortly after Shutdown (its
    scheduler's loop returned), unless it is stopped first."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(STOPPED))
    time.sleep(FINISHES_AFTER_S)
    os._exit(FINISHED)


class TestShutdownStopsTheServer(CustomTestCase):
    def _harness(self, target) -> tuple[http_server.ScriptedHttpServer, object, Path]:
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
        self.addCleanup(scheduler.close, linger=0)  # and alive until then
        process = mp.get_context("fork").Process(target=target)
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
        return server, process, Path(oob)

    def test_shutdown_stops_a_server_whose_http_side_keeps_running(self):
        server, process, oob = self._harness(_http_server_that_keeps_serving)
        # Longer than the stand-in lives: a harness that only waits for the
        # process to exit sees it exit on its own, not stopped.
        with (
            mock.patch.object(
                http_server, "SHUTDOWN_JOIN_TIMEOUT_S", 2 * EXITS_ON_ITS_OWN_AFTER_S
            ),
            mock.patch.object(http_server, "SHUTDOWN_GRACE_S", GRACE_S, create=True),
        ):
            server.shutdown()
        self.assertFalse(process.is_alive())
        self.assertEqual(process.exitcode, STOPPED)
        self.assertFalse(oob.exists())

    def test_shutdown_lets_a_finishing_server_exit_on_its_own_first(self):
        # Stopped at once, the scheduler would lose the moment it needs to
        # return from its loop (and write what it writes on the way out). The
        # harness's own grace: this wait ends as soon as the server exits.
        server, process, _ = self._harness(_server_that_finishes_soon)
        server.shutdown()
        self.assertFalse(process.is_alive())
        self.assertEqual(process.exitcode, FINISHED)


if __name__ == "__main__":
    unittest.main()
