"""A control POST that a real scripted-runtime server rejects fails the script with
the server's own complaint, not with an unrelated "no message arrived" timeout.

The server is a real one on the CPU stand-in; the script asks it to pause in a mode
it does not have ("inplace" for "in_place", the spelling of the mode's own
docstring), which its request validation answers with HTTP 400.
"""

import sys
import unittest
from pathlib import Path
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.scripted_runtime import http_server
from sglang.test.scripted_runtime.context import http_post
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "standin"))
import cpu_standin  # noqa: E402

# One real server: about 45 s to start on an idle 2-core machine, 70-120 s on a
# busy one; the script itself takes AWAIT_S.
register_cpu_ci(est_time=100, suite="base-a-test-cpu")

# How long the script waits for the message the rejected POST never produces,
# instead of the harness's 60 s (the POST is answered in milliseconds).
AWAIT_S = 5.0
# The server's reason for the 400, as its request validation words it.
COMPLAINT = "Input should be 'abort', 'retract' or 'in_place'"
# How long shutdown waits for the server process before it stops it: a harness
# before patch 0011 waits its whole 60 s for an HTTP server that never exits.
STOP_AFTER_S = 5.0


class TestRejectedControlPostOnTheStandIn(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        kwargs = dict(
            cpu_standin.engine_kwargs(),
            model_path=str(cpu_standin.model_dir()),
            skip_server_warmup=True,
        )
        cls.server = http_server.ScriptedHttpServer.start(**kwargs)

    @classmethod
    def tearDownClass(cls):
        server = getattr(cls, "server", None)
        if server is not None:
            with mock.patch.object(
                http_server, "SHUTDOWN_JOIN_TIMEOUT_S", STOP_AFTER_S
            ):
                server.shutdown()

    @staticmethod
    def _script_pause_in_a_mode_the_server_rejects(ctx):
        # Runs in the scheduler process. The harness's public call, with its wait
        # for the pause message cut to AWAIT_S (a default bound when the harness
        # was imported, so the function's own default is what changes).
        with mock.patch.dict(
            http_post._http_post_and_await_recv_msg.__kwdefaults__,
            {"timeout_s": AWAIT_S},
        ):
            ctx.pause_generation(mode="inplace")
        yield

    def test_the_servers_complaint_is_in_the_failure(self):
        with self.assertRaises(AssertionError) as caught:
            self.server.execute_script(self._script_pause_in_a_mode_the_server_rejects)
        report = str(caught.exception)
        self.assertIn("scripted-runtime script failed", report)
        # The script waited for the pause and timed out either way; the report
        # must say why: this request's POST, the status, the server's reason.
        self.assertIn(f"within {AWAIT_S}", report)
        self.assertIn("POST /pause_generation failed: HTTP 400", report)
        self.assertIn(COMPLAINT, report)


if __name__ == "__main__":
    unittest.main()
