"""Deterministic inference on XPU falls back to triton and keeps the radix cache."""

import logging
import shutil
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from sglang.srt.arg_groups import overrides, pipeline
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

# Pin every fact the pass reads so a Blackwell or ROCm runner answers the same.
NOT_BLACKWELL = dict(is_sm100=False, is_sm120=False, is_hip=False)

# A model folder needs only a config.json: no weights, no tokenizer.
TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"


class TestDeterministicAttentionFallback(CustomTestCase):
    """The `_deterministic_attention_backend` post-process pass, called directly."""

    def _pass(self, device: str, attention_backend=None) -> dict:
        view = SimpleNamespace(
            enable_deterministic_inference=True,
            attention_backend=attention_backend,
            device=device,
            model_path="unused",
        )
        with override_platform(**NOT_BLACKWELL):
            return overrides._deterministic_attention_backend(view)

    def test_xpu_falls_back_to_triton(self):
        with self.assertLogs(overrides.logger, logging.WARNING) as logs:
            self.assertEqual(self._pass("xpu"), {"attention_backend": "triton"})
        self.assertIn(
            "Falling back to 'triton' for deterministic inference", logs.output[0]
        )

    def test_cuda_keeps_fa3(self):
        self.assertEqual(self._pass("cuda"), {"attention_backend": "fa3"})

    def test_cpu_keeps_todays_fallback(self):
        self.assertEqual(self._pass("cpu"), {"attention_backend": "fa3"})

    def test_explicit_backend_on_xpu_wins(self):
        self.assertEqual(self._pass("xpu", attention_backend="intel_xpu"), {})


class TestDeterministicResolutionOnXpu(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        shutil.copy(TINY_CONFIG, f"{cls._tmp.name}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_resolves_to_triton_with_radix_cache(self):
        args = ServerArgs(
            model_path=self._tmp.name,
            device="xpu",
            enable_deterministic_inference=True,
        )
        # resolve_once() asks the device for its memory size; a CPU runner has none.
        with (
            override_platform(**NOT_BLACKWELL),
            mock.patch.object(
                pipeline, "get_device_memory_capacity", return_value=24576
            ),
        ):
            args.resolve_once()
        view = resolved_view(args)
        self.assertEqual(view.attention_backend, "triton")
        self.assertFalse(view.disable_radix_cache)


if __name__ == "__main__":
    unittest.main()
