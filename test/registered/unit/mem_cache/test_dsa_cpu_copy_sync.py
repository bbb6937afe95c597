"""A DSA decode retraction backs up and restores its index keys on XPU: the cpu_tensor
copy's barriers go to the active device's module, not torch.cuda."""

import sys
import unittest
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.mem_cache import kv_cache_builder
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.dsa_cache_layer_split import (
    LayerSplitDSATokenToKVPool,
    LayerSplitIndexKeyCache,
)
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.platforms.cuda import CudaSRTPlatform
from sglang.srt.platforms.xpu import XpuSRTPlatform
from sglang.srt.runtime_context import get_context, get_disagg
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import single_rank, standin  # noqa: E402

register_cpu_ci(est_time=15, suite="base-a-test-cpu")

NOT_COMPILED = "Torch not compiled with CUDA enabled"
PAGE = 64  # the DSA indexer's physical page, on CUDA and XPU alike
LAYERS = 2
# The request holds pages 1 and 2; page 3 belongs to another request.
REQ_SLOTS = torch.arange(PAGE, 3 * PAGE)
OTHER_SLOTS = torch.arange(3 * PAGE, 4 * PAGE)


class _Barriers:
    """A device module's `synchronize` (the boundary): which mem_cache function
    asked for each barrier."""

    def __init__(self) -> None:
        self.callers: list[str] = []

    def __call__(self, *args, **kwargs) -> None:
        frame = sys._getframe(1)
        while frame is not None and "/mem_cache/" not in frame.f_code.co_filename:
            frame = frame.f_back
        self.callers.append(frame.f_code.co_qualname if frame else "<outside>")

    def by_caller(self) -> Counter:
        return Counter(self.callers)


def _refuse(*args, **kwargs):
    raise AssertionError(NOT_COMPILED)


def on_platform(stack: ExitStack, platform, barriers: _Barriers) -> None:
    """Run as on `platform` (sglang's own class): every module that bound the
    resolved platform reads it, its device module records barriers, and the
    other vendor's synchronize fails as on a build without it."""
    import sglang.srt.platforms as platforms

    resolved = platforms.current_platform
    stack.enter_context(mock.patch.object(platforms, "_current_platform", platform))
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang") and vars(module).get("current_platform") is (
            resolved
        ):
            stack.enter_context(mock.patch.object(module, "current_platform", platform))
    own, other = (torch.xpu, torch.cuda)
    if isinstance(platform, CudaSRTPlatform):
        own, other = other, own
    stack.enter_context(mock.patch.object(own, "synchronize", barriers))
    stack.enter_context(mock.patch.object(other, "synchronize", _refuse))


def dsa_pool() -> DSATokenToKVPool:
    """The real DSA pool (GLM-5 / DeepSeek-V3.2 geometry, two layers) on the CPU,
    its KV rows and index-key pages filled with distinct values."""
    with single_rank():
        pool = DSATokenToKVPool(
            size=4 * PAGE,
            page_size=PAGE,
            kv_lora_rank=512,
            dtype=torch.bfloat16,
            qk_rope_head_dim=64,
            layer_num=LAYERS,
            device="cpu",
            index_head_dim=128,
            enable_memory_saver=False,
            kv_cache_dim=576,
        )
    # One page per chunk, so a backup is several chunks per layer.
    pool.cpu_offloading_chunk_size = PAGE
    gen = torch.Generator().manual_seed(0)
    for kv in pool.kv_buffer:
        kv.copy_(torch.randn(kv.shape, generator=gen).to(kv.dtype))
    for index_k in pool.index_k_with_scale_buffer:
        index_k.copy_(torch.randint(0, 256, index_k.shape, generator=gen))
    return pool


def snapshot(pool) -> list[torch.Tensor]:
    return [t.clone() for t in [*pool.kv_buffer, *pool.index_k_with_scale_buffer]]


def reuse_request_pages(pool) -> None:
    """Another request overwrites the retracted request's slots while it waits."""
    pages = REQ_SLOTS[::PAGE] // PAGE
    for kv in pool.kv_buffer:
        if kv.shape[0]:
            kv[REQ_SLOTS] = 0
    for index_k in pool.index_k_with_scale_buffer:
        if index_k.shape[0]:
            index_k[pages] = 0


def retracted_request() -> tuple[Req, ReqToTokenPool]:
    """A decode request of len(REQ_SLOTS) + 1 tokens in row 0 of the req pool."""
    req_to_token = torch.zeros((2, 4 * PAGE), dtype=torch.int32)
    req_to_token[0, : len(REQ_SLOTS)] = REQ_SLOTS.to(torch.int32)
    req = standin(Req, kv=ReqKvInfo(req_pool_idx=0), seqlen=len(REQ_SLOTS) + 1)
    return req, standin(ReqToTokenPool, req_to_token=req_to_token)


class TestDsaRetractionBackupOnXpu(CustomTestCase):
    def _round_trip(self, platform, barriers: _Barriers):
        """Retract (cpu_tensor backup), let the pages be reused, resume."""
        pool = dsa_pool()
        before = snapshot(pool)
        allocator = standin(PagedTokenToKVPoolAllocator, _kvcache=pool)
        req, req_to_token_pool = retracted_request()
        with ExitStack() as stack:
            stack.enter_context(single_rank())
            on_platform(stack, platform, barriers)
            req.offload_kv_cache(req_to_token_pool, allocator)
            backup = req.kv.retraction_backup.cpu_tensors
            backed_up = list(barriers.callers)
            reuse_request_pages(pool)
            req.load_kv_cache(req_to_token_pool, allocator)
        return pool, before, backup, backed_up

    def test_xpu_backup_keeps_index_keys_and_resume_restores_them(self):
        barriers = _Barriers()
        pool, before, backup, _ = self._round_trip(XpuSRTPlatform(), barriers)
        pages = REQ_SLOTS[::PAGE] // PAGE
        for layer, index_k in enumerate(backup["index_k"]):
            saved = torch.cat(index_k)
            self.assertEqual(saved.device.type, "cpu")
            self.assertTrue(torch.equal(saved, before[LAYERS + layer][pages]))
        for now, then in zip(snapshot(pool), before, strict=True):
            self.assertTrue(torch.equal(now, then))

    def test_xpu_barriers_go_to_torch_xpu_around_each_copy(self):
        barriers = _Barriers()
        _, _, _, backed_up = self._round_trip(XpuSRTPlatform(), barriers)
        backup = Counter(backed_up)
        # Drain the forward before reading index keys, and wait for the
        # non-blocking device-to-host copies before the backup is handed out.
        self.assertEqual(backup["IndexKeyCache.cpu_copy"], 2)
        self.assertEqual(backup["DSATokenToKVPool.get_cpu_copy"], 1)
        self.assertEqual(backed_up[-1], "DSATokenToKVPool.get_cpu_copy")
        restore = Counter(barriers.callers[len(backed_up) :])
        self.assertEqual(restore["IndexKeyCache.load_cpu_copy"], 2)
        self.assertEqual(restore["DSATokenToKVPool.load_cpu_copy"], 1)
        self.assertEqual(barriers.callers[-1], "DSATokenToKVPool.load_cpu_copy")

    def test_cuda_barriers_stay_on_torch_cuda(self):
        barriers = _Barriers()
        pool, before, _, backed_up = self._round_trip(CudaSRTPlatform(), barriers)
        for now, then in zip(snapshot(pool), before, strict=True):
            self.assertTrue(torch.equal(now, then))
        calls = barriers.by_caller()
        for caller in ("IndexKeyCache.cpu_copy", "IndexKeyCache.load_cpu_copy"):
            self.assertEqual(calls[caller], 2, caller)
        self.assertEqual(backed_up[-1], "DSATokenToKVPool.get_cpu_copy")
        self.assertEqual(barriers.callers[-1], "DSATokenToKVPool.load_cpu_copy")


class TestLayerSplitIndexKeys(CustomTestCase):
    """The CP layer-split pool's copy of the same methods (a rank owns layer 0)."""

    def _round_trip(self, platform) -> Counter:
        """Back up and restore on `platform`; the barriers, by caller."""
        full = dsa_pool()
        buffers = [
            full.index_k_with_scale_buffer[0],
            full.index_k_with_scale_buffer[1][:0],
        ]
        pool = standin(
            LayerSplitDSATokenToKVPool,
            page_size=PAGE,
            layer_num=LAYERS,
            cpu_offloading_chunk_size=PAGE,
            kv_buffer=[full.kv_buffer[0], full.kv_buffer[1][:0]],
        )
        pool.index_key_cache = standin(
            LayerSplitIndexKeyCache, pool=pool, buffer=buffers
        )
        before = snapshot(pool)
        barriers = _Barriers()
        with ExitStack() as stack:
            stack.enter_context(single_rank())
            on_platform(stack, platform, barriers)
            backup = pool.get_cpu_copy(REQ_SLOTS)
            backed_up = Counter(barriers.callers)
            reuse_request_pages(pool)
            pool.load_cpu_copy(backup, REQ_SLOTS)
        self.assertEqual(backup["index_k"][1], [])  # the layer another rank owns
        for now, then in zip(snapshot(pool), before, strict=True):
            self.assertTrue(torch.equal(now, then))
        self.assertEqual(backed_up["LayerSplitIndexKeyCache.cpu_copy"], 2)
        return Counter(barriers.callers) - backed_up

    def test_xpu_backup_and_restore_of_owned_layers(self):
        restore = self._round_trip(XpuSRTPlatform())
        self.assertEqual(restore["LayerSplitIndexKeyCache.load_cpu_copy"], 2)

    def test_cuda_backup_and_restore_stay_on_torch_cuda(self):
        # on_platform refuses torch.xpu here: a copy that named the XPU module
        # instead of the active device's would fail.
        restore = self._round_trip(CudaSRTPlatform())
        self.assertEqual(restore["LayerSplitIndexKeyCache.load_cpu_copy"], 2)


class TestDsaDecodeTakesTheCpuTensorBackup(CustomTestCase):
    """Why the copy runs: a DSA pool is not host-pool capable, so an unset decode
    retraction backup resolves to cpu_tensor, on XPU as on CUDA."""

    def test_unset_backup_resolves_to_cpu_tensor_for_dsa(self):
        allocator = standin(object, get_kvcache=lambda: standin(DSATokenToKVPool))
        worker = standin(
            TpModelWorker,
            get_memory_pool=lambda: (None, allocator),
            is_hybrid_swa=False,
            model_runner=standin(ModelRunner, model_config=standin(ModelConfig)),
        )
        for device in ("xpu", "cuda"):
            with (
                get_context().override_server_args(
                    device=device, disaggregation_mode="decode", hicache_ratio=2.0
                ),
                mock.patch.object(kv_cache_builder, "is_hip", return_value=False),
                mock.patch.object(
                    kv_cache_builder, "uses_ssm_state", return_value=False
                ),
            ):
                returned = kv_cache_builder.resolve_decode_retraction_backup(
                    tp_worker=worker
                )
                resolved = get_disagg().disaggregation_decode_retraction_backup
            self.assertEqual((returned, resolved), ("cpu_tensor",) * 2, device)


if __name__ == "__main__":
    unittest.main()
