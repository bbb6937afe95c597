"""The scripted-runtime harness asks for the KV canary only where it can build."""

import unittest
from unittest import mock

from sglang.test import chunked_prefill_test_utils as chunked
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.scripted_runtime import http_server
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=12, suite="base-a-test-cpu")

CANARY = {
    "kv_canary": "raise",
    "kv_canary_real_data": "partial",
    "kv_canary_sweep_interval": 100,
}


def _no_hardware_probe():
    raise AssertionError("the hardware probe must not run when a device is given")


class _RecordingContext:
    """Stands in for mp.get_context("spawn"): records the server launch kwargs."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def Process(self, *, target, kwargs, name, daemon):  # noqa: N802 (mp API)
        self.launches.append(dict(kwargs))
        return mock.NonCallableMock(start=lambda: None)


class TestCanaryLaunchKwargs(CustomTestCase):
    def test_cuda_devices_get_the_three_knobs(self):
        for device in ("cuda", "cuda:1"):
            with self.subTest(device=device):
                with mock.patch.object(http_server, "get_device", _no_hardware_probe):
                    self.assertEqual(http_server.canary_launch_kwargs(device), CANARY)

    def test_other_devices_get_nothing(self):
        for device in ("xpu", "xpu:0", "cpu", "npu", "mps"):
            with self.subTest(device=device):
                with mock.patch.object(http_server, "get_device", _no_hardware_probe):
                    self.assertEqual(http_server.canary_launch_kwargs(device), {})

    def test_unset_device_asks_the_host(self):
        for host, expected in (("xpu", {}), ("cuda", CANARY)):
            with self.subTest(host=host):
                with mock.patch.object(http_server, "get_device", return_value=host):
                    self.assertEqual(http_server.canary_launch_kwargs(None), expected)


class TestSpawnServerProcess(CustomTestCase):
    def _launch(self, **engine_kwargs) -> dict:
        ctx = _RecordingContext()
        with mock.patch.object(http_server.mp, "get_context", return_value=ctx):
            http_server._spawn_server_process(
                endpoint="ipc:///tmp/unused",
                out_of_band_error_path=http_server.Path("/tmp/unused.json"),
                engine_kwargs=engine_kwargs,
            )
        self.assertEqual(len(ctx.launches), 1)
        return ctx.launches[0]

    def test_xpu_launch_carries_no_canary(self):
        launch = self._launch(device="xpu", model_path="m")
        self.assertFalse([k for k in launch if k.startswith("kv_canary")])
        self.assertTrue(launch["disable_prefill_cuda_graph"])

    def test_cuda_launch_keeps_the_canary(self):
        launch = self._launch(device="cuda", model_path="m")
        self.assertEqual({k: launch[k] for k in CANARY}, CANARY)
        self.assertTrue(launch["disable_prefill_cuda_graph"])

    def test_explicit_canary_kwargs_win_over_the_harness_defaults_on_cuda(self):
        # On CUDA the harness fills in its own canary knobs; a caller's value
        # for the same knob must replace it, not be replaced by it.
        launch = self._launch(
            device="cuda", model_path="m", kv_canary="log", kv_canary_sweep_interval=7
        )
        self.assertEqual(launch["kv_canary"], "log")
        self.assertEqual(launch["kv_canary_sweep_interval"], 7)
        self.assertEqual(launch["kv_canary_real_data"], CANARY["kv_canary_real_data"])

    def test_explicit_canary_request_on_xpu_is_honoured(self):
        launch = self._launch(device="xpu", model_path="m", kv_canary="raise")
        self.assertEqual(launch["kv_canary"], "raise")
        self.assertNotIn("kv_canary_sweep_interval", launch)


class TestChunkedPrefillCanaryArgs(CustomTestCase):
    def _prefill_args(self, host: str) -> list:
        mixin = chunked.ChunkedGsm8kMixin()
        with mock.patch.object(chunked, "get_device", return_value=host):
            return mixin.build_prefill_side_args()

    def test_xpu_prefill_side_has_no_canary(self):
        args = self._prefill_args("xpu")
        self.assertNotIn("--kv-canary", args)
        self.assertEqual(args[:2], ["--chunked-prefill-size", "256"])

    def test_cuda_prefill_side_keeps_the_canary(self):
        args = self._prefill_args("cuda")
        self.assertEqual(args[-len(chunked.KV_CANARY_ARGS) :], chunked.KV_CANARY_ARGS)

    def test_decode_side_follows_the_same_rule(self):
        class PD(chunked.ChunkedTestPDBase):
            decode_feature_args = ["--decode-flag"]

        launched = []
        for host in ("xpu", "cuda"):
            with (
                mock.patch.object(chunked, "get_device", return_value=host),
                # The PD fixture starts real servers; stop at that boundary.
                mock.patch.object(
                    chunked.PDDisaggregationServerBase, "setUpClass", lambda: None
                ),
                mock.patch.object(chunked, "try_cached_model", lambda m: m),
                mock.patch.object(PD, "launch_all", lambda h=host: launched.append(h)),
            ):
                PD.setUpClass()
            expected = [] if host == "xpu" else chunked.KV_CANARY_ARGS
            with self.subTest(host=host):
                self.assertEqual(PD.extra_decode_args, [*expected, "--decode-flag"])
        self.assertEqual(launched, ["xpu", "cuda"])

    def test_disabled_canary_stays_off_on_cuda(self):
        class NoCanary(chunked.ChunkedGsm8kMixin):
            use_kv_canary = False

        with mock.patch.object(chunked, "get_device", return_value="cuda"):
            self.assertNotIn("--kv-canary", NoCanary().build_prefill_side_args())


if __name__ == "__main__":
    unittest.main()
