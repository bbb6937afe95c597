"""A hybrid linear-attention model with the radix cache on XPU runs without overlap
scheduling (no_buffer Mamba states): resolution says so instead of turning it off
in silence."""

import json
import logging
import sys
import tempfile
import unittest
from contextlib import ExitStack
from pathlib import Path

from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import device_memory_mb  # noqa: E402

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

# Qwen3-Next: hybrid Gated DeltaNet + attention, a Mamba radix cache model.
HYBRID = "Qwen3NextForCausalLM"
# Pin every fact resolution reads so a Blackwell or ROCm runner answers the same.
PLATFORMS = {
    "xpu": dict(is_xpu=True, is_cuda=False),
    "cuda": dict(is_cuda=True, is_xpu=False),
}
NOTICE = "Overlap scheduling is disabled"


class TestMambaOverlapNotice(CustomTestCase):
    """`ServerArgs(...).resolve_once()` on a config.json (no weights needed)."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        config = {"architectures": [HYBRID], "model_type": "qwen3_next"}
        (Path(cls._tmp.name) / "config.json").write_text(json.dumps(config))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def resolve(self, device: str = "xpu", **fields):
        """The resolved view and the notices logged while resolving."""
        args = ServerArgs(model_path=self._tmp.name, device=device, **fields)
        with ExitStack() as stack:
            stack.enter_context(
                override_platform(
                    is_hip=False, is_sm100=False, is_sm120=False, **PLATFORMS[device]
                )
            )
            stack.enter_context(device_memory_mb(24576))
            logs = stack.enter_context(self.assertLogs(level=logging.WARNING))
            logging.getLogger(__name__).warning("resolving")  # the log is never empty
            args.resolve_once()
        return resolved_view(args), [line for line in logs.output if NOTICE in line]

    def test_xpu_says_overlap_is_off_and_how_to_keep_it(self):
        view, notices = self.resolve()
        # The resolution itself is upstream's: no_buffer, overlap off.
        self.assertEqual(view.mamba_radix_cache_strategy, "no_buffer")
        self.assertTrue(view.disable_overlap_schedule)
        self.assertEqual(len(notices), 1, notices)
        self.assertIn(HYBRID, notices[0])
        self.assertIn("--mamba-radix-cache-strategy no_buffer", notices[0])
        self.assertIn("--disable-radix-cache", notices[0])

    def test_quiet_when_overlap_was_off_already(self):
        view, notices = self.resolve(disable_overlap_schedule=True)
        self.assertEqual(view.mamba_radix_cache_strategy, "no_buffer")
        self.assertEqual(notices, [])

    def test_without_the_radix_cache_overlap_stays_on_quietly(self):
        view, notices = self.resolve(disable_radix_cache=True)
        self.assertFalse(view.disable_overlap_schedule)
        self.assertEqual(notices, [])

    def test_cuda_keeps_overlap_with_extra_buffer_quietly(self):
        view, notices = self.resolve("cuda")
        self.assertEqual(view.mamba_radix_cache_strategy, "extra_buffer")
        self.assertFalse(view.disable_overlap_schedule)
        self.assertEqual(notices, [])


if __name__ == "__main__":
    unittest.main()
