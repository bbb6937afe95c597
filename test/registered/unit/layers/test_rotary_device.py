"""Rotary embeddings build their caches on the server's device, not on torch.cuda."""

import shutil
import sys
import tempfile
import unittest
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import torch
from sglang.srt.layers.rotary_embedding import base as rope_base
from sglang.srt.layers.rotary_embedding import factory, get_rope, rope_variant
from sglang.srt.runtime_context import (
    get_exec,
    override_platform,
    publish,
    restore_context,
    snapshot_context,
)
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import device_memory_mb  # noqa: E402

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

NOT_COMPILED = "Torch not compiled with CUDA enabled"

# A model folder needs only a config.json: no weights, no tokenizer.
TINY_CONFIG = Path(__file__).resolve().parents[1] / "tiny_qwen3_config.json"

# Devices a CPU runner can hold tensors on, standing in for the XPU: "cpu" shows
# the values, "meta" shows the caches follow the device answer, not a literal.
SERVER_DEVICES = ("cpu", "meta")

HEAD, MAX_POS, BASE = 16, 64, 10000


class _CudaAsked(AssertionError):
    """torch.cuda was initialised: what an XPU build refuses."""


def _cuda_not_compiled(*args, **kwargs):
    # torch.cuda._lazy_init on an XPU build of torch: every CUDA tensor and every
    # torch.cuda query goes through it.
    raise _CudaAsked(NOT_COMPILED)


class _XpuAsked(AssertionError):
    """torch.xpu was initialised: where an XPU server's tensors go."""


def _xpu_not_present(*args, **kwargs):
    # torch.xpu._lazy_init on this runner, which has no XPU: every XPU tensor
    # goes through it.
    raise _XpuAsked("no XPU on this runner")


def server_device(stack: ExitStack, answer) -> None:
    """Answer get_device() with `answer` where each rope module looks it up.
    base.py binds the name only with the fix; without it, it does not read it."""
    for module in (rope_base, rope_variant):
        if hasattr(module, "get_device"):
            stack.enter_context(mock.patch.object(module, "get_device", answer))


@contextmanager
def xpu_server(device: str) -> Iterator[None]:
    """Build layers as an XPU server does, with its device answered by `device`.

    torch.cuda raises as on an XPU build; the platform flags the rope modules
    read at import say XPU; sglang's get_device() (the server's device) answers
    `device`; and layers are built under `with torch.device(...)`, as the model
    loader builds them.
    """
    with ExitStack() as stack:
        stack.enter_context(
            mock.patch.object(torch.cuda, "_lazy_init", _cuda_not_compiled)
        )
        flags = dict(_is_cuda=False, _is_hip=False, _is_xpu=True, _is_cpu=False)
        for name, value in flags.items():
            stack.enter_context(mock.patch.object(rope_base, name, value))
        for name in ("_is_cuda", "_is_hip"):
            stack.enter_context(mock.patch.object(rope_variant, name, False))

        def answer(device_id=None) -> str:
            return device

        server_device(stack, answer)
        # get_rope() shares one module per shape process-wide: start empty.
        stack.enter_context(mock.patch.dict(factory._ROPE_DICT, clear=True))
        stack.enter_context(torch.device(device))
        yield


def _buffers(module: torch.nn.Module) -> dict:
    return dict(module.named_buffers())


class TestDualChunkRope(CustomTestCase):
    """Qwen2.5-*-1M: a config with dual_chunk_attention_config."""

    DUAL_CHUNK = {
        "chunk_size": 32,
        "local_size": 8,
        "original_max_position_embeddings": 64,
    }

    def build(self):
        return get_rope(
            HEAD,
            HEAD,
            MAX_POS,
            BASE,
            dtype=torch.float32,
            dual_chunk_attention_config=self.DUAL_CHUNK,
        )

    def test_caches_land_on_the_server_device(self):
        for device in SERVER_DEVICES:
            with self.subTest(device=device), xpu_server(device):
                rope = self.build()
                self.assertIsInstance(rope, rope_variant.DualChunkRotaryEmbedding)
                buffers = _buffers(rope)
                self.assertEqual(len(buffers), 5, sorted(buffers))
                for name, cache in buffers.items():
                    self.assertEqual(cache.device.type, device, name)

    def test_cache_values_match_the_rotary_formula(self):
        with xpu_server("cpu"):
            rope = self.build()
        chunk_len = 32 - 8
        inv_freq = 1.0 / BASE ** (torch.arange(0, HEAD, 2).float() / HEAD)
        k_t = torch.arange(MAX_POS).float() % chunk_len
        freqs = torch.outer(k_t, inv_freq)
        expected = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
        torch.testing.assert_close(rope.cos_sin_k_cache, expected)

    def test_cuda_and_rocm_keep_torch_cuda_current_device(self):
        for flag in ("_is_cuda", "_is_hip"):
            with self.subTest(platform=flag), ExitStack() as stack:
                stack.enter_context(xpu_server("cpu"))
                stack.enter_context(mock.patch.object(rope_variant, flag, True))
                current = stack.enter_context(
                    mock.patch.object(torch.cuda, "current_device", return_value=3)
                )
                # The caches then go to cuda:3, which this runner cannot hold.
                with self.assertRaises(_CudaAsked):
                    self.build()
                current.assert_called_once_with()


class TestFourierRope(CustomTestCase):
    """InternS1-Pro with FoPE: get_rope() passes no device."""

    FOPE = {
        "rope_type": "default",
        "use_fope": True,
        "num_kv_heads": 2,
        "fope_init_factor": 0.1,
        "fope_sep_head": True,
    }

    def build(self):
        return get_rope(
            HEAD, HEAD, MAX_POS, BASE, rope_scaling=dict(self.FOPE), dtype=torch.float32
        )

    def test_inv_freq_and_cache_land_on_the_server_device(self):
        # Not on "meta": the constructor checks the frequencies' order (.item()).
        with xpu_server("cpu"):
            rope = self.build()
        self.assertIsInstance(rope, rope_variant.FourierRotaryEmbedding)
        self.assertEqual(rope.inv_freq.device.type, "cpu")
        self.assertEqual(rope.cos_sin_cache.device.type, "cpu")
        # positions x kv heads x (cos, sin) of the head.
        self.assertEqual(tuple(rope.cos_sin_cache.shape), (MAX_POS, 2, 2 * HEAD))
        # The first forward rebuilds the cache on this device.
        self.assertEqual(rope.device, "cpu")

    def test_default_device_is_the_server_device_not_the_host(self):
        # An XPU server's get_device() answers "xpu", which this runner cannot
        # hold: building there asks torch.xpu, never torch.cuda, and never
        # settles for the host's device.
        with ExitStack() as stack:
            stack.enter_context(xpu_server("cpu"))
            server_device(stack, lambda device_id=None: "xpu")
            stack.enter_context(
                mock.patch.object(torch.xpu, "_lazy_init", _xpu_not_present)
            )
            with self.assertRaises(_XpuAsked):
                self.build()

    def test_inv_freq_keeps_the_frequencies_a_position_can_turn(self):
        with xpu_server("cpu"):
            rope = self.build()
        full = 1.0 / BASE ** (torch.arange(0, HEAD, 2).float() / HEAD)
        torch.testing.assert_close(rope.inv_freq, full[full > 2 * torch.pi / MAX_POS])


class TestOnPolicyRope(CustomTestCase):
    """--rl-on-policy-target fsdp: inv_freq is computed on the CPU, as HF does."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        shutil.copy(TINY_CONFIG, f"{cls._tmp.name}/config.json")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @contextmanager
    def published(self, **fields) -> Iterator[None]:
        """The scheduler's published config of an XPU server."""
        saved = snapshot_context()
        try:
            args = ServerArgs(model_path=self._tmp.name, device="xpu", **fields)
            with override_platform(is_hip=False), device_memory_mb(24576):
                publish(args, role="scheduler")
            yield
        finally:
            restore_context(saved)

    def build(self):
        return get_rope(HEAD, HEAD, MAX_POS, BASE, dtype=torch.float32)

    def test_on_policy_cache_lands_on_the_server_device(self):
        with self.published(rl_on_policy_target="fsdp"):
            self.assertEqual(get_exec().deterministic.rl_on_policy_target, "fsdp")
            for device in SERVER_DEVICES:
                with self.subTest(device=device), xpu_server(device):
                    rope = self.build()
                    self.assertTrue(rope._force_native)
                    self.assertEqual(rope.cos_sin_cache.device.type, device)
                    self.assertEqual(tuple(rope.cos_sin_cache.shape), (MAX_POS, HEAD))

    def test_on_policy_cache_equals_the_usual_one(self):
        with self.published(), xpu_server("cpu"):
            usual = self.build()
        with self.published(rl_on_policy_target="fsdp"), xpu_server("cpu"):
            on_policy = self.build()
        self.assertFalse(usual._force_native)
        self.assertTrue(on_policy._force_native)
        torch.testing.assert_close(on_policy.cos_sin_cache, usual.cos_sin_cache)


if __name__ == "__main__":
    unittest.main()
