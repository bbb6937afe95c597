"""DFLASH on XPU: device gate, draft attention backend choices and fallbacks."""

import dataclasses
import logging
import shutil
import tempfile
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
from sglang.srt.runtime_context import override_platform  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    DRAFT_ATTENTION_BACKEND_CHOICES,
    ServerArgs,
)
from sglang.srt.speculative import draft_worker_common  # noqa: E402

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
        # Nothing was asked for: the fallback is silent, not a warning.
        with self.assertNoLogs(draft_worker_common.logger, logging.WARNING):
            self.assertEqual(self._fallback(None, is_xpu=True), "triton")

    def test_xpu_unknown_backend_warns_and_falls_back_to_triton(self):
        with self.assertLogs(draft_worker_common.logger, logging.WARNING) as logs:
            self.assertEqual(self._fallback("bogus", is_xpu=True), "triton")
        self.assertIn("Falling back to 'triton'", logs.output[0])

    def test_cuda_falls_back_to_flashinfer(self):
        self.assertEqual(self._fallback(None), "flashinfer")

    def test_rocm_falls_back_to_triton(self):
        self.assertEqual(self._fallback(None, hip="6.4"), "triton")


@dataclasses.dataclass(frozen=True)
class _ParallelState:
    tp_rank: int = 1  # not rank 0: no start-up log lines
    pp_rank: int = 0
    pp_size: int = 1


class TestDflashWorkerFastPaths(CustomTestCase):
    """DFlashWorkerV2.__init__ run for real, with its boundaries faked: the
    hardware probes, the draft model build and the GPU fused-KV helper."""

    PLATFORMS = {
        "cuda": dict(is_cuda=True, is_hip=False, is_xpu=False),
        "rocm": dict(is_cuda=False, is_hip=True, is_xpu=False),
        "xpu": dict(is_cuda=False, is_hip=False, is_xpu=True),
        "cpu": dict(is_cuda=False, is_hip=False, is_xpu=False),
    }

    def _construct(self, platform: str):
        from sglang.srt.speculative import dflash_worker_v2 as module

        draft_model = SimpleNamespace(
            candidate_selector=None, set_block_size=lambda size: None, block_size=4
        )
        bundle = SimpleNamespace(
            draft_worker=None,
            draft_model_runner=SimpleNamespace(
                model_config=SimpleNamespace(hf_config=None)
            ),
            draft_model=draft_model,
            resolved_attention_backend="triton",
        )
        draft_config = SimpleNamespace(
            resolve_block_size=lambda default: 4,
            block_size=4,
            mask_token="<mask>",
            mask_token_id=5,
        )
        target_worker = SimpleNamespace(
            model_runner=SimpleNamespace(
                model_config=SimpleNamespace(vocab_size=100), model=SimpleNamespace()
            ),
            device="cpu",
        )
        probes = {
            name: mock.patch.object(module, name, return_value=value)
            for name, value in self.PLATFORMS[platform].items()
        }
        helper = mock.patch.object(module.DFlashWorkerV2, "_init_fused_kv_helper")
        with (
            mock.patch.object(
                module, "get_schedule", return_value=SimpleNamespace(page_size=1)
            ),
            mock.patch.object(
                module,
                "get_spec",
                return_value=SimpleNamespace(
                    speculative_draft_window_size=None,
                    speculative_num_draft_tokens=4,
                ),
            ),
            mock.patch.object(module, "get_tp_group", return_value=None),
            mock.patch.object(module, "SpecTpSync"),
            mock.patch.object(module, "build_draft_tp_worker", return_value=bundle),
            mock.patch.object(
                module, "parse_dflash_draft_config", return_value=draft_config
            ),
            probes["is_cuda"],
            probes["is_hip"],
            probes["is_xpu"],
            helper as init_helper,
        ):
            worker = module.DFlashWorkerV2(
                server_args=SimpleNamespace(),
                gpu_id=0,
                ps=_ParallelState(),
                nccl_port=0,
                target_worker=target_worker,
            )
        return worker, init_helper.call_count

    def test_gpu_fast_paths_are_on_for_cuda_rocm_and_xpu_only(self):
        for platform in self.PLATFORMS:
            with self.subTest(platform=platform):
                worker, helper_builds = self._construct(platform)
                on = platform != "cpu"
                self.assertIs(worker._use_fused_kv_materialize, on)
                self.assertEqual(helper_builds, 1 if on else 0)
                self.assertIs(worker._use_triton_prepare_block, on)
                self.assertIs(worker._use_triton_accept_bonus, on)
                self.assertIs(worker._use_triton_compact_rebuild, on)


if __name__ == "__main__":
    unittest.main()
