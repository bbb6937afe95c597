"""aiter and wave backends size v_head_dim from the PP stage's own first layer."""

import sys
import types
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from sglang.srt.configs.model_config import AttentionArch, ModelConfig
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import single_rank, standin  # noqa: E402

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

START_LAYER = 14  # a later pipeline stage: layers 14.. live in this rank's pool


# The stage's value buffers are (tokens, kv heads, v_head_dim); every dim differs.
VALUE_BUFFER_SHAPE = (7, 2, 24)


class _ValueBufferRead(Exception):
    """Raised by the fake pool so construction stops at the read under test,
    carrying which layer's buffer was read and the size taken from its shape."""

    def __init__(self, layer_id: int, size: int) -> None:
        super().__init__(layer_id, size)
        self.layer_id = layer_id
        self.size = size


class _ShapeProbe:
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id

    def __getitem__(self, index: int) -> int:
        raise _ValueBufferRead(self.layer_id, VALUE_BUFFER_SHAPE[index])


class _StagePool:
    """A KV pool of a PP stage, without get_v_head_dim (the fallback path)."""

    start_layer = START_LAYER

    def get_value_buffer(self, layer_id: int):
        return SimpleNamespace(shape=_ShapeProbe(layer_id))


def _model_runner() -> ModelRunner:
    """The stage's model runner, from the real classes with only these facts set."""
    config = standin(
        ModelConfig,
        dtype=torch.bfloat16,
        is_multimodal=False,
        num_attention_heads=4,
        head_dim=16,
        get_num_kv_heads=lambda tp: 2,
        attention_arch=AttentionArch.MHA,
        context_len=128,
    )
    return standin(
        ModelRunner,
        model_config=config,
        device="cpu",
        dtype=torch.bfloat16,
        kv_cache_dtype=torch.bfloat16,
        req_to_token_pool=SimpleNamespace(size=4, req_to_token=torch.zeros(4, 8)),
        token_to_kv_pool=_StagePool(),
        tp_rank=0,
        # Older releases read the widths through the runner's parallel state:
        # the real one, which answers with single_rank()'s values.
        ps=get_parallel(),
    )


class TestValueBufferStartLayer(CustomTestCase):
    def _layer_read(self, construct) -> tuple[int, int]:
        """(layer whose value buffer was read, v_head_dim taken from it)."""
        # The config bags the backends read are published for real.
        with (
            get_context().override_server_args(device="cpu", page_size=1),
            single_rank(),
            self.assertRaises(_ValueBufferRead) as ctx,
        ):
            construct(_model_runner())
        return ctx.exception.layer_id, ctx.exception.size

    def test_aiter_reads_the_stage_start_layer(self):
        from sglang.srt.layers.attention import aiter_backend

        layer = self._layer_read(aiter_backend.AiterAttnBackend)
        self.assertEqual(layer, (START_LAYER, VALUE_BUFFER_SHAPE[-1]))

    def test_wave_reads_the_stage_start_layer(self):
        # wave_lang and the wave kernels exist only on ROCm; stand in for the
        # three modules the constructor imports.
        decode = types.ModuleType("decode_attention")
        decode.decode_attention_fwd = None
        extend = types.ModuleType("extend_attention")
        extend.extend_attention_wave = None
        cache = types.ModuleType("cache")
        cache.CACHE_BASE_DIR = Path("/nonexistent-wave-cache")
        prefix = "sglang.srt.layers.attention.wave_ops"
        stubs = {
            f"{prefix}.decode_attention": decode,
            f"{prefix}.extend_attention": extend,
            "wave_lang": types.ModuleType("wave_lang"),
            "wave_lang.kernel": types.ModuleType("wave_lang.kernel"),
            "wave_lang.kernel.wave": types.ModuleType("wave_lang.kernel.wave"),
            "wave_lang.kernel.wave.cache": cache,
        }
        with mock.patch.dict(sys.modules, stubs):
            from sglang.srt.layers.attention import wave_backend

            layer = self._layer_read(wave_backend.WaveAttnBackend)
        self.assertEqual(layer, (START_LAYER, VALUE_BUFFER_SHAPE[-1]))


if __name__ == "__main__":
    unittest.main()
