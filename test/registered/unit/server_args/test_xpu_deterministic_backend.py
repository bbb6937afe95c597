"""Deterministic inference on XPU falls back to triton and keeps the radix cache."""

import logging
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import device_memory_mb  # noqa: E402

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

# Pin every fact resolution reads so a Blackwell or ROCm runner answers the same.
NOT_BLACKWELL = dict(is_sm100=False, is_sm120=False, is_hip=False)

# A model folder needs only a config.json: no weights, no tokenizer.
TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"


class TestDeterministicResolution(CustomTestCase):
    """`ServerArgs(...).resolve_once()`, the entry point every release keeps."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        shutil.copy(TINY_CONFIG, f"{cls._tmp.name}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _resolve(self, device: str, **fields):
        args = ServerArgs(
            model_path=self._tmp.name,
            device=device,
            enable_deterministic_inference=True,
            **fields,
        )
        with override_platform(**NOT_BLACKWELL), device_memory_mb(24576):
            args.resolve_once()
        return resolved_view(args)

    def test_xpu_resolves_to_triton_with_radix_cache(self):
        with self.assertLogs(level=logging.WARNING) as logs:
            view = self._resolve("xpu")
        self.assertEqual(view.attention_backend, "triton")
        self.assertFalse(view.disable_radix_cache)
        self.assertTrue(
            any(
                "Falling back to 'triton' for deterministic inference" in line
                for line in logs.output
            ),
            logs.output,
        )

    def test_cuda_keeps_fa3(self):
        self.assertEqual(self._resolve("cuda").attention_backend, "fa3")


if __name__ == "__main__":
    unittest.main()
