"""DFLASH on XPU: device gate, draft attention backend choices and fallbacks."""

import ast
import inspect
import logging
import shutil
import tempfile
import textwrap
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

# The XPU attention backend imports sgl_kernel, which no CPU runner has.
maybe_stub_sgl_kernel()

from sglang.srt.arg_groups import speculative_hook  # noqa: E402
from sglang.srt.arg_groups.overrides import resolved_view  # noqa: E402
from sglang.srt.layers.attention.xpu_backend import XPUAttentionBackend  # noqa: E402
from sglang.srt.runtime_context import override_platform  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    DRAFT_ATTENTION_BACKEND_CHOICES,
    ServerArgs,
)
from sglang.srt.speculative import draft_worker_common  # noqa: E402
from sglang.srt.speculative.dflash_utils import (  # noqa: E402
    resolve_dflash_verify_mask_policy,
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

    def test_other_devices_are_refused_with_all_three_named(self):
        with self.assertRaisesRegex(
            ValueError,
            r"^DFLASH speculative decoding only supports CUDA, NPU and XPU devices\.$",
        ):
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


class TestGenericDraftWorkerFallback(CustomTestCase):
    """`_resolve_draft_attention_backend_fallback` used by EAGLE-style workers."""

    def _fallback(self, draft_backend, hip=None, **platform) -> str:
        spec = SimpleNamespace(speculative_draft_attention_backend=draft_backend)
        facts = {"is_xpu": False, "is_hip": hip is not None, **platform}
        with (
            mock.patch.object(draft_worker_common, "get_spec", return_value=spec),
            mock.patch.object(
                draft_worker_common, "attention_backends", return_value=(None, None)
            ),
            mock.patch.object(draft_worker_common.torch.version, "hip", hip),
            override_platform(**facts),
        ):
            return draft_worker_common._resolve_draft_attention_backend_fallback(
                algo_label="EAGLE"
            )

    def test_intel_xpu_is_a_draft_choice(self):
        self.assertIn("intel_xpu", DRAFT_ATTENTION_BACKEND_CHOICES)
        self.assertEqual(self._fallback("intel_xpu", is_xpu=True), "intel_xpu")

    def test_xpu_falls_back_to_triton(self):
        self.assertEqual(self._fallback(None, is_xpu=True), "triton")

    def test_xpu_unknown_backend_warns_and_falls_back_to_triton(self):
        with self.assertLogs(draft_worker_common.logger, logging.WARNING) as logs:
            self.assertEqual(self._fallback("bogus", is_xpu=True), "triton")
        self.assertIn("Falling back to 'triton'", logs.output[0])

    def test_cuda_falls_back_to_flashinfer(self):
        self.assertEqual(self._fallback(None), "flashinfer")

    def test_rocm_falls_back_to_triton(self):
        self.assertEqual(self._fallback(None, hip="6.4"), "triton")


class TestDflashVerifyMaskPolicy(CustomTestCase):
    def test_xpu_backend_skips_the_custom_mask(self):
        backend = XPUAttentionBackend.__new__(XPUAttentionBackend)
        self.assertEqual(
            resolve_dflash_verify_mask_policy(backend), ("XPUAttentionBackend", False)
        )

    def test_wrapped_xpu_backend_skips_the_custom_mask(self):
        inner = XPUAttentionBackend.__new__(XPUAttentionBackend)
        wrapper = SimpleNamespace(full_attn_backend=inner)
        self.assertEqual(
            resolve_dflash_verify_mask_policy(wrapper), ("XPUAttentionBackend", False)
        )

    def test_unknown_backend_still_builds_the_mask(self):
        self.assertEqual(resolve_dflash_verify_mask_policy(object()), ("object", True))


class TestDflashWorkerFastPaths(CustomTestCase):
    """DFlashWorkerV2.__init__ is too heavy to build on CPU; read its gates instead."""

    def _gate_calls(self, target: str) -> set[str]:
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        tree = ast.parse(textwrap.dedent(inspect.getsource(DFlashWorkerV2.__init__)))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            names = {ast.unparse(t) for t in node.targets}
            if target in names:
                return {
                    call.func.id
                    for call in ast.walk(node.value)
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                }
        self.fail(f"no assignment to {target} in DFlashWorkerV2.__init__")

    def test_fused_kv_materialize_enabled_on_xpu(self):
        calls = self._gate_calls("self._use_fused_kv_materialize")
        self.assertEqual(calls, {"is_cuda", "is_hip", "is_xpu"})

    def test_triton_fast_paths_enabled_on_xpu(self):
        calls = self._gate_calls("supports_gpu_triton")
        self.assertEqual(calls, {"is_cuda", "is_hip", "is_xpu"})


if __name__ == "__main__":
    unittest.main()
