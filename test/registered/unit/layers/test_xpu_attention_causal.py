"""XPU attention backend: which layer types reach the kernel with causal=True."""

import sys
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

register_cpu_ci(est_time=10, suite="base-a-test-cpu")


# sgl_kernel's XPU build cannot exist on a CPU runner; the one kernel this test
# reaches (flash_attn_with_kvcache) is replaced per test below.
maybe_stub_sgl_kernel()

from sglang.srt.configs.model_config import AttentionArch, ModelConfig  # noqa: E402
from sglang.srt.layers.attention import xpu_backend  # noqa: E402
from sglang.srt.layers.radix_attention import AttentionType  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import (  # noqa: E402
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import single_rank, standin  # noqa: E402

HEADS, HEAD_DIM, PAGE, TOKENS = 2, 8, 4, 3


def _backend() -> xpu_backend.XPUAttentionBackend:
    pool = SimpleNamespace(
        get_kv_buffer=lambda layer_id: (
            torch.zeros(PAGE * 4, HEADS, HEAD_DIM),
            torch.zeros(PAGE * 4, HEADS, HEAD_DIM),
        )
    )
    runner = standin(
        ModelRunner,
        sliding_window_size=None,
        model_config=standin(
            ModelConfig,
            is_encoder_decoder=False,
            context_len=64,
            hf_text_config=SimpleNamespace(num_attention_heads=HEADS),
            attention_arch=AttentionArch.MHA,
        ),
        # Older releases read the widths through the runner's parallel state:
        # the real one, which answers with single_rank()'s values.
        ps=get_parallel(),
        tp_size=1,
        device="cpu",
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(1, 64)),
        token_to_kv_pool=pool,
        kv_cache_dtype=torch.float32,
        kv_cache_dtype_str="auto",
        page_size=PAGE,
        is_hybrid_swa=False,
    )
    spec = SimpleNamespace(
        speculative_eagle_topk=None, speculative_num_draft_tokens=None
    )
    exec_cfg = SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=False)
    )
    with (
        mock.patch.object(xpu_backend, "get_spec", return_value=spec),
        mock.patch.object(xpu_backend, "get_exec", return_value=exec_cfg),
        single_rank(),
    ):
        backend = xpu_backend.XPUAttentionBackend(runner)
    # The real metadata class: a field a newer release adds keeps its default.
    metadata = xpu_backend.FlashAttentionMetadata()
    for name, value in dict(
        page_table=torch.zeros(1, 4, dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, TOKENS], dtype=torch.int32),
        cache_seqlens_int32=torch.tensor([TOKENS], dtype=torch.int32),
        max_seq_len_q=TOKENS,
        cu_seqlens_k=torch.tensor([0, TOKENS], dtype=torch.int32),
        local_attn_metadata=None,
        swa_spec_metadata=None,
        swa_page_table=None,
        swa_out_cache_loc=None,
        # Cross-attention layers read the encoder's slice of the cache.
        encoder_page_table=torch.zeros(1, 4, dtype=torch.int32),
        encoder_lens_int32=torch.tensor([TOKENS], dtype=torch.int32),
        encoder_cu_seqlens_k=torch.tensor([0, TOKENS], dtype=torch.int32),
        encoder_max_seq_len_k=TOKENS,
    ).items():
        setattr(metadata, name, value)
    backend.forward_metadata = metadata
    return backend


def _layer(attn_type: AttentionType, cross: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        is_cross_attention=cross,
        attn_type=attn_type,
        sliding_window_size=None,
        tp_q_head_num=HEADS,
        tp_k_head_num=HEADS,
        tp_v_head_num=HEADS,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        scaling=1.0,
        logit_cap=0.0,
        layer_id=0,
        k_scale=None,
        v_scale=None,
    )


class TestXPUAttentionCausalFlag(CustomTestCase):
    """The `causal` kwarg that reaches flash_attn_with_kvcache, per layer type."""

    def _causal_seen(
        self, attn_type: AttentionType, mode: ForwardMode, cross: bool = False
    ) -> bool:
        seen: list[bool] = []

        def kernel(**kwargs):
            seen.append(kwargs["causal"])
            rows = kwargs["q"].shape[0]
            return torch.zeros(rows, HEADS, HEAD_DIM)

        backend = _backend()
        batch = standin(ForwardBatch, forward_mode=mode, spec_info=None, batch_size=1)
        # EXTEND and TARGET_VERIFY (the mode DFLASH verifies drafts in) run
        # forward_extend over several tokens; DECODE runs forward_decode.
        extend = mode != ForwardMode.DECODE
        rows = TOKENS if extend else 1
        q = torch.zeros(rows, HEADS * HEAD_DIM)
        forward = backend.forward_extend if extend else backend.forward_decode
        layer = _layer(attn_type, cross)
        with mock.patch.object(xpu_backend, "flash_attn_with_kvcache", kernel):
            forward(q, None, None, layer, batch, save_kv_cache=False)
        self.assertEqual(len(seen), 1, "expected exactly one kernel call")
        return seen[0]

    MODES = (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DECODE)

    def test_decoder_layers_stay_causal(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                self.assertTrue(self._causal_seen(AttentionType.DECODER, mode))

    def test_encoder_only_layers_are_not_causal(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                self.assertFalse(self._causal_seen(AttentionType.ENCODER_ONLY, mode))

    def test_bidirectional_decoder_layers_are_not_causal(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                self.assertFalse(
                    self._causal_seen(AttentionType.DECODER_BIDIRECTIONAL, mode)
                )

    def test_cross_attention_layers_stay_non_causal(self):
        # What 0.5.19 already did for cross-attention must survive the change.
        for mode in self.MODES:
            with self.subTest(mode=mode):
                self.assertFalse(
                    self._causal_seen(AttentionType.DECODER, mode, cross=True)
                )


if __name__ == "__main__":
    unittest.main()
