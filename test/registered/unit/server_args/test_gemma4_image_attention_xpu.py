"""A Gemma 4 multimodal server whose prefill runs on intel_xpu says at startup that
image tokens attend causally there, and names the flag and the way out."""

import json
import logging
import sys
import tempfile
import unittest
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from sglang.srt.arg_groups import overrides
from sglang.srt.arg_groups.model_overrides import gemma4
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

NOTICE = "image tokens attend causally"


def xmx(stack: ExitStack, present: bool) -> None:
    """Whether the XPU has XMX (the hardware fact intel_xpu needs), answered where
    each module looks it up; a release without the fix does not ask in gemma4."""
    for module in (overrides, gemma4):
        if hasattr(module, "xpu_has_xmx_support"):
            stack.enter_context(
                mock.patch.object(module, "xpu_has_xmx_support", return_value=present)
            )


class TestGemma4ImageAttentionOnXpu(CustomTestCase):
    """`ServerArgs(...).resolve_once()` on a config.json (no weights needed)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)

    def model(self, *architectures: str) -> str:
        folder = Path(self._tmp.name) / "-".join(architectures)
        folder.mkdir(exist_ok=True)
        config = {
            "architectures": list(architectures),
            "model_type": "gemma4",
            # 0.5.20 and 0.5.21 read the global head_dim, which transformers 5
            # refuses on Gemma 4's per-layer config unless allowed.
            "text_config": {"allow_global_per_layer_attribute_access": True},
        }
        (folder / "config.json").write_text(json.dumps(config))
        return str(folder)

    def resolve(self, *architectures: str, has_xmx: bool = True, **fields):
        """The resolved view and the warnings logged while resolving."""
        model = self.model(*(architectures or ["Gemma4ForConditionalGeneration"]))
        args = ServerArgs(model_path=model, device="xpu", **fields)
        with ExitStack() as stack:
            stack.enter_context(override_platform(**NOT_BLACKWELL))
            stack.enter_context(device_memory_mb(24576))
            xmx(stack, has_xmx)
            logs = stack.enter_context(self.assertLogs(level=logging.WARNING))
            logging.getLogger(__name__).warning("resolving")  # the log is never empty
            args.resolve_once()
        notices = [line for line in logs.output if NOTICE in line]
        return resolved_view(args), notices

    def test_attention_backend_intel_xpu_is_named_at_startup(self):
        view, notices = self.resolve(attention_backend="intel_xpu")
        self.assertEqual(view.attention_backend, "intel_xpu")  # kept, not overridden
        self.assertEqual(len(notices), 1, notices)
        self.assertIn("--attention-backend intel_xpu", notices[0])
        self.assertIn("--prefill-attention-backend triton", notices[0])

    def test_prefill_attention_backend_intel_xpu_is_named_at_startup(self):
        view, notices = self.resolve(prefill_attention_backend="intel_xpu")
        self.assertEqual(view.prefill_attention_backend, "intel_xpu")
        self.assertEqual(len(notices), 1, notices)
        self.assertIn("--prefill-attention-backend intel_xpu", notices[0])

    def test_the_unified_model_takes_images_too(self):
        _, notices = self.resolve(
            "Gemma4UnifiedForConditionalGeneration", attention_backend="intel_xpu"
        )
        self.assertEqual(len(notices), 1, notices)

    def test_a_triton_prefill_is_quiet(self):
        for fields in (
            {},  # XPU's default for Gemma 4
            dict(attention_backend="intel_xpu", prefill_attention_backend="triton"),
        ):
            with self.subTest(**fields):
                view, notices = self.resolve(**fields)
                self.assertEqual(notices, [])

    def test_without_xmx_intel_xpu_falls_back_to_triton_and_is_quiet(self):
        view, notices = self.resolve(has_xmx=False, attention_backend="intel_xpu")
        self.assertEqual(view.attention_backend, "triton")
        self.assertEqual(notices, [])

    def test_the_model_served_is_the_first_the_config_names(self):
        _, notices = self.resolve(
            "Gemma4ForConditionalGeneration",
            "Gemma4ForCausalLM",
            attention_backend="intel_xpu",
        )
        self.assertEqual(len(notices), 1, notices)

    def test_the_text_only_model_is_quiet(self):
        _, notices = self.resolve("Gemma4ForCausalLM", attention_backend="intel_xpu")
        self.assertEqual(notices, [])


if __name__ == "__main__":
    unittest.main()
