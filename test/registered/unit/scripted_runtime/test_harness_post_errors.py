"""A rejected control POST surfaces the server's own complaint, not a timeout."""

import threading
import time
import unittest
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.scripted_runtime.background_http_poster import BackgroundHttpPoster
from sglang.test.scripted_runtime.context import http_post
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=10, suite="base-a-test-cpu")


class _ControlEndpoint(BaseHTTPRequestHandler):
    """/reject answers 400 with the server's reason; /ok answers 200; /slow hangs."""

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/slow":
            time.sleep(2.0)
        status, body = (400, b"bad mode") if self.path == "/reject" else (200, b"{}")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _NeverArrives:
    """The tokenizer-side socket: the awaited message never comes."""

    def wait_until_arrived(self, predicate, *, timeout_s, description):
        raise TimeoutError(f"no {description} arrived within {timeout_s}s")


class TestPosterFuture(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ThreadingHTTPServer(("127.0.0.1", 0), _ControlEndpoint)
        cls.server.daemon_threads = True
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()
        cls.base = f"http://127.0.0.1:{cls.server.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def setUp(self):
        self.poster = BackgroundHttpPoster()
        self.addCleanup(self.poster.close)

    def test_submit_coro_returns_the_coroutine_future(self):
        async def answer():
            return 42

        future = self.poster.submit_coro(answer())
        self.assertEqual(future.result(timeout=5), 42)

    def test_rejected_post_fails_its_future_with_status_and_body(self):
        future = self.poster.submit_coro(self.poster.post(f"{self.base}/reject", {}))
        with self.assertRaisesRegex(RuntimeError, r"HTTP 400 .*bad mode"):
            future.result(timeout=5)

    def test_accepted_post_succeeds(self):
        future = self.poster.submit_coro(self.poster.post(f"{self.base}/ok", {}))
        self.assertIsNone(future.result(timeout=5))

    def _post_answering(self, status: int | None, body: bytes):
        """POST through a fake session whose response has `status` (None: no
        status attribute at all); the result, or the RuntimeError it raised."""

        class Response:
            async def read(self):
                return body

        if status is not None:
            Response.status = status

        class PostContext:
            async def __aenter__(self):
                return Response()

            async def __aexit__(self, *exc):
                return False

        session = SimpleNamespace(closed=False, post=lambda url, json: PostContext())
        # The fake session must stay in place until the loop has run the POST.
        with mock.patch.object(self.poster, "_ensure_session", return_value=session):
            future = self.poster.submit_coro(self.poster.post("http://fake", {}))
            try:
                return future.result(timeout=5)
            except RuntimeError as exc:
                return exc

    def test_response_without_status_is_not_an_error(self):
        self.assertIsNone(self._post_answering(None, b"ok"))

    def test_statuses_below_400_are_not_errors(self):
        for status in (200, 204, 399):
            with self.subTest(status=status):
                self.assertIsNone(self._post_answering(status, b"fine"))

    def test_the_error_carries_the_first_500_characters_of_the_body(self):
        body = b"a" * 500 + b"b" * 100
        error = self._post_answering(503, body)
        self.assertIsInstance(error, RuntimeError)
        message = str(error)
        self.assertTrue(message.startswith("HTTP 503 from http://fake: "))
        self.assertTrue(message.endswith("a" * 500))
        self.assertNotIn("b", message.split(": ", 1)[1])

    def test_log_callback_still_works_unbound(self):
        failed: Future = Future()
        failed.set_exception(RuntimeError("boom"))
        with self.assertLogs("sglang.test.scripted_runtime.background_http_poster"):
            BackgroundHttpPoster._log_coro_exception(failed)

    def _ctx(self):
        host, port = self.server.server_address
        return SimpleNamespace(
            scheduler=SimpleNamespace(
                server_args=SimpleNamespace(host=host, port=port)
            ),
            _http_poster=self.poster,
            _tokenizer_recv_proxy=_NeverArrives(),
        )

    def _await(self, path: str) -> str:
        with self.assertRaises(TimeoutError) as ctx:
            http_post._http_post_and_await_recv_msg(
                self._ctx(),
                path=path,
                json={},
                predicate=lambda msg: True,
                description="pause ack",
                timeout_s=0.01,
            )
        return str(ctx.exception)

    def test_timeout_names_the_rejection_of_this_post(self):
        message = self._await("/reject")
        self.assertIn("no pause ack arrived", message)
        self.assertIn("POST /reject failed: HTTP 400", message)
        self.assertIn("bad mode", message)

    def test_timeout_with_a_pending_post_says_in_flight(self):
        with mock.patch.object(http_post, "POST_OUTCOME_SETTLE_S", 0.1):
            message = self._await("/slow")
        self.assertIn("POST /slow was still in flight after 0.1s", message)

    def test_timeout_after_an_accepted_post_says_so(self):
        message = self._await("/ok")
        self.assertIn("POST /ok succeeded, but the server sent no matching", message)

    def test_timeout_after_a_cancelled_post_says_so(self):
        cancelled: Future = Future()
        cancelled.cancel()
        with mock.patch.object(http_post, "_submit_post", return_value=cancelled):
            message = self._await("/gone")
        self.assertIn("POST /gone was cancelled", message)

    def test_fire_and_forget_ignores_the_outcome(self):
        with self.assertLogs(
            "sglang.test.scripted_runtime.background_http_poster"
        ) as logs:
            http_post._http_post_fire_and_forget(self._ctx(), path="/reject", json={})
            deadline = time.monotonic() + 5
            while not logs.output and time.monotonic() < deadline:
                time.sleep(0.01)
        self.assertIn("background async coroutine failed", logs.output[0])


if __name__ == "__main__":
    unittest.main()
