"""The scripted-runtime harness launches, on every device, a KV canary the server
can install there: none off CUDA, or one that runs where it is asked for."""

import unittest
from unittest import mock

import torch
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


def _canary_runs_on(device: str) -> tuple[bool, bool]:
    """(the canary can run on `device`, it needs decode graphs off there).

    Up to 0.5.20 the canary's write/verify/plan kernels are CUDA-JIT only. From
    0.5.21 sglang falls back to a torch reference off CUDA, which install_canary
    accepts only without a captured decode.
    """
    try:
        from sglang.kernels.ops.kv_canary._dispatch import use_torch_reference
    except ImportError:
        return device.split(":")[0] == "cuda", False
    reference = use_torch_reference(torch.device(device))
    return True, reference


def _launch_problem(device: str, canary: bool, decode_graph_off: bool) -> str:
    """Why a server asked for this canary on `device` cannot start, or ''."""
    if not canary:
        return ""
    runs, needs_graph_off = _canary_runs_on(device)
    if not runs:
        return f"the KV canary cannot be built on {device}"
    if needs_graph_off and not decode_graph_off:
        return f"the canary's torch reference on {device} needs decode graphs off"
    return ""


def _no_hardware_probe():
    raise AssertionError("the hardware probe must not run when a device is given")


class _RecordingContext:
    """Stands in for mp.get_context("spawn"): records the server launch kwargs."""

    def __init__(self) -> None:
        self.launches: list[dict] = []

    def Process(self, *, target, kwargs, name, daemon):  # noqa: N802 (mp API)
        self.launches.append(dict(kwargs))
        return mock.NonCallableMock(start=lambda: None)


class TestHarnessServerLaunch(CustomTestCase):
    """What the harness hands to the server process it spawns."""

    def _launch(self, probe=_no_hardware_probe, **engine_kwargs) -> dict:
        ctx = _RecordingContext()
        with (
            mock.patch.object(http_server.mp, "get_context", return_value=ctx),
            mock.patch.object(http_server, "get_device", probe),
        ):
            http_server._spawn_server_process(
                endpoint="ipc:///tmp/unused",
                out_of_band_error_path=http_server.Path("/tmp/unused.json"),
                engine_kwargs=engine_kwargs,
            )
        self.assertEqual(len(ctx.launches), 1)
        return ctx.launches[0]

    def _assert_startable(self, device: str, launch: dict) -> None:
        problem = _launch_problem(
            device,
            canary=launch.get("kv_canary", "none") != "none",
            decode_graph_off=launch.get("cuda_graph_backend_decode") == "disabled",
        )
        self.assertEqual(problem, "", launch)
        self.assertTrue(launch["disable_prefill_cuda_graph"])

    def test_non_cuda_launches_are_startable(self):
        for device in ("xpu", "xpu:0", "cpu"):
            with self.subTest(device=device):
                launch = self._launch(device=device, model_path="m")
                self._assert_startable(device, launch)

    def test_unset_device_asks_the_host(self):
        launch = self._launch(probe=lambda: "xpu", model_path="m")
        self._assert_startable("xpu", launch)

    def test_cuda_launch_keeps_the_canary(self):
        launch = self._launch(device="cuda", model_path="m")
        self.assertEqual({k: launch[k] for k in CANARY}, CANARY)
        self.assertTrue(launch["disable_prefill_cuda_graph"])

    def test_explicit_canary_kwargs_win_over_the_harness_defaults_on_cuda(self):
        launch = self._launch(
            device="cuda", model_path="m", kv_canary="log", kv_canary_sweep_interval=7
        )
        self.assertEqual(launch["kv_canary"], "log")
        self.assertEqual(launch["kv_canary_sweep_interval"], 7)
        self.assertEqual(launch["kv_canary_real_data"], CANARY["kv_canary_real_data"])


class TestChunkedPrefillCanaryArgs(CustomTestCase):
    """The chunked-prefill test utilities' server flags, prefill and decode side."""

    def _assert_startable(self, host: str, args: list) -> None:
        problem = _launch_problem(
            host,
            canary="--kv-canary" in args,
            decode_graph_off="--cuda-graph-backend-decode=disabled" in args,
        )
        self.assertEqual(problem, "", args)

    def _prefill_args(self, host: str) -> list:
        mixin = chunked.ChunkedGsm8kMixin()
        with mock.patch.object(chunked, "get_device", return_value=host):
            return mixin.build_prefill_side_args()

    def test_non_cuda_prefill_side_is_startable(self):
        for host in ("xpu", "cpu"):
            with self.subTest(host=host):
                args = self._prefill_args(host)
                self._assert_startable(host, args)
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
            with self.subTest(host=host):
                self.assertEqual(PD.extra_decode_args[-1], "--decode-flag")
                self._assert_startable(host, PD.extra_decode_args)
        self.assertEqual(launched, ["xpu", "cuda"])

    def test_disabled_canary_stays_off_on_cuda(self):
        class NoCanary(chunked.ChunkedGsm8kMixin):
            use_kv_canary = False

        with mock.patch.object(chunked, "get_device", return_value="cuda"):
            self.assertNotIn("--kv-canary", NoCanary().build_prefill_side_args())


if __name__ == "__main__":
    unittest.main()
