"""DFLASH on XPU: device gate, draft attention backend choices and fallbacks."""

import logging
import shutil
import tempfile
import unittest
from pathlib import Path

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

# The XPU attention backend imports sgl_kernel, which no CPU runner has.
maybe_stub_sgl_kernel()

from sglang.srt.arg_groups import speculative_hook  # noqa: E402
from sglang.srt.arg_groups.overrides import resolved_view  # noqa: E402
from sglang.srt.runtime_context import override_platform  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    DRAFT_ATTENTION_BACKEND_CHOICES,
    ServerArgs,
)

# A model folder needs only a config.json: no weights, no tokenizer.
TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"


class _WithTinyModel(CustomTestCase):
    """A model folder holding only a tiny config.json; no weights are needed."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.model_path = cls._tmp.name
        shutil.copy(TINY_CONFIG, f"{cls.model_path}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _args(self, device: str, **fields) -> ServerArgs:
        return ServerArgs(
            model_path=self.model_path,
            device=device,
            speculative_algorithm="DFLASH",
            speculative_draft_model_path=self.model_path,
            **fields,
        )


class TestDflashDeviceGate(_WithTinyModel):
    def test_xpu_passes_the_device_gate(self):
        speculative_hook._handle_dflash(self._args("xpu"))

    def test_cuda_still_passes(self):
        speculative_hook._handle_dflash(self._args("cuda"))

    def test_other_devices_are_refused(self):
        # 0.5.19 and 0.5.20 name the three devices; from 0.5.21 the refusal
        # names the platform instead. Both refuse at argument resolution.
        with self.assertRaisesRegex(ValueError, r"^DFLASH speculative decoding "):
            speculative_hook._handle_dflash(self._args("mps"))


class TestDflashDraftBackendResolution(_WithTinyModel):
    """`_resolve_dflash_draft_attention_backend` on a raw ServerArgs."""

    def _resolve(self, draft_backend, **platform) -> str:
        args = self._args("xpu", speculative_draft_attention_backend=draft_backend)
        facts = {"is_xpu": False, "is_hip": False, "is_cuda": False, **platform}
        with override_platform(**facts):
            speculative_hook._resolve_dflash_draft_attention_backend(args)
        return resolved_view(args).speculative_draft_attention_backend

    def test_unset_backend_falls_back_to_triton_on_xpu(self):
        self.assertEqual(self._resolve(None, is_xpu=True), "triton")

    def test_intel_xpu_is_kept(self):
        with self.assertNoLogs(speculative_hook.logger, level=logging.WARNING):
            self.assertEqual(self._resolve("intel_xpu", is_xpu=True), "intel_xpu")

    def test_unknown_backend_falls_back_to_triton_on_xpu(self):
        with self.assertLogs(speculative_hook.logger, level=logging.WARNING) as logs:
            self.assertEqual(self._resolve("no_such_backend", is_xpu=True), "triton")
        self.assertIn("Falling back to 'triton'", logs.output[0])

    def test_cuda_keeps_flashinfer_fallback(self):
        self.assertEqual(self._resolve(None, is_cuda=True), "flashinfer")

    def test_rocm_keeps_triton_fallback(self):
        self.assertEqual(self._resolve(None, is_hip=True), "triton")

    def test_hook_reads_the_shared_choice_list(self):
        # One list: a backend registered through server_args is accepted here too.
        DRAFT_ATTENTION_BACKEND_CHOICES.append("plugin_backend")
        try:
            self.assertEqual(
                self._resolve("plugin_backend", is_xpu=True), "plugin_backend"
            )
        finally:
            DRAFT_ATTENTION_BACKEND_CHOICES.remove("plugin_backend")


if __name__ == "__main__":
    unittest.main()
