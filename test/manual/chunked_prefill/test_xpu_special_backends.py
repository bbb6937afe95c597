"""Chunked prefill with features an Intel GPU cannot run skips at once, with the
reason, instead of launching a server that dies (or waits out a timeout)."""

import unittest

from sglang.test.scripted_runtime_chunked_helpers import run_until_finished
from xpu_common import (
    CHUNK_SIZE,
    SharedServerTestCase,
    drain_until_released,
    expected_chunks,
    skip_reason,
    standin,
    xpu_engine_kwargs,
)

SKIP = skip_reason()


def _flashinfer_missing() -> str | None:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return "flashinfer is CUDA-only and not installed here"
    return None


def _hicache_refused() -> str | None:
    """Ask this sglang whether an XPU server refuses HiCache (patch 0004 does, on
    0.5.19); a release with XPU host-pool movers runs the case instead."""
    import shutil
    import tempfile
    from pathlib import Path

    if standin():
        # Measured: the CPU server's HiCache host pool asks torch.cuda for a
        # device to move pages to and dies ("Found no NVIDIA driver").
        return (
            "platform difference: on the CPU stand-in HiCache has no device to "
            "move host pages to (it runs on XPU, CUDA and ROCm only)"
        )

    from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility
    from sglang.srt.server_args import ServerArgs

    config = (
        Path(__file__).resolve().parents[2] / "registered/unit/tiny_qwen3_config.json"
    )
    with tempfile.TemporaryDirectory() as model:
        shutil.copy(config, Path(model) / "config.json")
        args = ServerArgs(
            model_path=model, device="xpu", enable_hierarchical_cache=True
        )
        try:
            handle_cache_compatibility(args)
        except ValueError as exc:
            return f"this sglang refuses HiCache on XPU at start-up: {exc}"
    return None


HICACHE_REFUSED = _hicache_refused()


def _script_one_long_request(t):
    handle = t.start_req(prompt_len=3 * CHUNK_SIZE, max_new_tokens=4, prompt_token=41)
    yield from run_until_finished(handle)
    assert handle.chunks_done == expected_chunks(3 * CHUNK_SIZE, CHUNK_SIZE)
    yield from drain_until_released(t, handle)


@unittest.skipIf(SKIP or _flashinfer_missing(), SKIP or _flashinfer_missing() or "")
class TestXpuChunkedPrefillFlashinfer(SharedServerTestCase):
    ENGINE_KWARGS = xpu_engine_kwargs(attention_backend="flashinfer")

    def test_long_prompt(self):
        self.server.execute_script(_script_one_long_request)


@unittest.skipIf(SKIP or HICACHE_REFUSED, SKIP or HICACHE_REFUSED or "")
class TestXpuChunkedPrefillHiCache(SharedServerTestCase):
    ENGINE_KWARGS = xpu_engine_kwargs(enable_hierarchical_cache=True)

    def test_long_prompt(self):
        self.server.execute_script(_script_one_long_request)


if __name__ == "__main__":
    unittest.main()
