"""HiSparse's host backups hold their XPU index tensors on the copy stream."""

import sys
import unittest
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import torch
from sglang.srt.managers import hisparse_coordinator as hc
from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
from sglang.srt.mem_cache.hisparse_memory_pool import HiSparseDSATokenToKVPool
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.utils import common
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import (  # noqa: E402
    RECORDED,
    CudaTensor,
    XpuTensor,
    assert_recorded_once_on,
    standin,
)

register_cpu_ci(est_time=6, suite="base-a-test-cpu")

NOT_COMPILED = "Torch not compiled with CUDA enabled"

# What the caching allocator was told, in order: (tensor, stream). It is the
# boundary: on a GPU record_stream defers the block's reuse until `stream` is
# done; here the stand-in tensors note the call instead.


class Stream:
    """A device stream (torch.xpu.Stream on an XPU)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.waited_for: list = []

    def wait_stream(self, other: "Stream") -> None:
        self.waited_for.append(other)

    def __repr__(self) -> str:
        return f"Stream({self.name})"


class Event:
    """torch.xpu.Event."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass


class Transfers:
    """The host pool's copy kernel (the boundary): what it was asked to read."""

    def __init__(self) -> None:
        self.calls: list = []
        self.streams: list = []

    def backup_from_device_all_layer(
        self, device_pool, host_indices, device_indices, io_backend
    ) -> None:
        self.calls.append((host_indices, device_indices, io_backend))
        self.streams.append(list(ACTIVE))


ACTIVE: list = []  # the stream torch.xpu.stream(...) made current


def cuda_not_compiled(*args, **kwargs):
    # torch.cuda on an XPU build of torch, where CUDA is not compiled in.
    raise AssertionError(NOT_COMPILED)


def device(stack: ExitStack, kind: type, schedule: Stream) -> None:
    """The coordinator's device module is what get_device_module() returns on the
    device `kind` lives on, with its streams and events stood in. On XPU,
    torch.cuda raises as it does on an XPU build of torch."""
    module = torch.xpu if kind is XpuTensor else torch.cuda

    @contextmanager
    def stream(s: Stream):
        ACTIVE.append(s)
        try:
            yield
        finally:
            ACTIVE.pop()

    stack.enter_context(mock.patch.object(hc, "device_module", module))
    stack.enter_context(mock.patch.object(module, "current_stream", lambda: schedule))
    stack.enter_context(mock.patch.object(module, "stream", stream))
    stack.enter_context(mock.patch.object(module, "Event", Event))
    if module is torch.xpu:
        for name in ("current_stream", "stream", "Event"):
            stack.enter_context(mock.patch.object(torch.cuda, name, cuda_not_compiled))


def pinned_host_memory(stack: ExitStack) -> None:
    """Page-locked host memory needs the accelerator's driver, which a CPU runner
    lacks: pin_memory=True gives ordinary host memory here."""
    real = torch.tensor

    def tensor(*args, pin_memory: bool = False, **kwargs):
        return real(*args, **kwargs)

    stack.enter_context(mock.patch.object(torch, "tensor", tensor))


def host_pool(transfers: Transfers) -> MLATokenToKVPoolHost:
    return standin(
        MLATokenToKVPoolHost,
        page_size=4,
        backup_from_device_all_layer=transfers.backup_from_device_all_layer,
    )


def request(row: int, prefill_len: int) -> Req:
    facts = {"kv": ReqKvInfo(req_pool_idx=row), "extend_end": prefill_len}
    if hasattr(common, "Range"):  # releases that keep the extend as a Range
        facts["extend_range"] = common.Range(0, prefill_len)
    return standin(Req, **facts)


class HiSparseCase(CustomTestCase):
    assert_recorded_once_on = assert_recorded_once_on

    def setUp(self) -> None:
        RECORDED.clear()


class TestStagingBackup(HiSparseCase):
    def test_on_xpu_the_copy_holds_its_indices_on_the_staging_stream(self):
        self.check_staging(XpuTensor)

    def test_on_cuda_each_index_is_recorded_once_as_before(self):
        self.check_staging(CudaTensor)

    def check_staging(self, kind: type) -> None:
        def on(values: torch.Tensor) -> torch.Tensor:
            return values.to(torch.int64).as_subclass(kind)

        schedule, staging = Stream("schedule"), Stream("write staging")
        transfers = Transfers()
        coordinator = standin(
            hc.HiSparseCoordinator,
            req_to_token_pool=standin(
                ReqToTokenPool, req_to_token=on(torch.arange(16).view(2, 8))
            ),
            mem_pool_device=standin(
                HiSparseDSATokenToKVPool,
                full_to_hisparse_device_index_mapping=on(100 + torch.arange(16)),
            ),
            mem_pool_host=host_pool(transfers),
            req_to_host_pool=on(200 + torch.arange(16).view(2, 8)),
            # The request's host pages are already reserved.
            req_to_host_pool_allocated_len=torch.tensor([8, 8]),
            write_staging_stream=staging,
            ack_staging_queue=[],
        )
        req = request(row=1, prefill_len=5)
        with ExitStack() as stack:
            device(stack, kind, schedule)
            coordinator.admit_request_into_staging(req)

        self.assertEqual(len(transfers.calls), 1)
        host_indices, device_indices, io_backend = transfers.calls[0]
        self.assertEqual(io_backend, "kernel")
        self.assertEqual(transfers.streams, [[staging]])
        self.assertEqual(host_indices.tolist(), [208, 209, 210, 211, 212])
        self.assertEqual(device_indices.tolist(), [108, 109, 110, 111, 112])
        # The copy is queued on the staging stream and the caller drops both
        # index tensors: the allocator must not reuse them before it runs.
        self.assert_recorded_once_on(staging, [host_indices, device_indices])
        self.assertTrue(req.hisparse_staging)
        self.assertEqual([act.req for act in coordinator.ack_staging_queue], [req])


class TestDecodeBackup(HiSparseCase):
    def test_on_xpu_the_backup_holds_its_indices_on_the_backup_stream(self):
        self.check_decode_backup(XpuTensor)

    def test_on_cuda_each_index_is_recorded_once_as_before(self):
        self.check_decode_backup(CudaTensor)

    def check_decode_backup(self, kind: type) -> None:
        def on(values: torch.Tensor) -> torch.Tensor:
            return values.to(torch.int64).as_subclass(kind)

        schedule, backup = Stream("schedule"), Stream("decode backup")
        transfers = Transfers()
        coordinator = standin(
            hc.HiSparseCoordinator,
            device="cpu",  # where the pinned batch positions are copied
            compress_ratio=4,
            device_buffer_size=8,
            _skip_first_backup=[False, False],
            req_to_device_buffer=on(100 + torch.arange(18).view(2, 9)),
            mem_pool_host=host_pool(transfers),
            req_to_host_pool=on(200 + torch.arange(16).view(2, 8)),
            req_to_host_pool_allocated_len=torch.tensor([8, 8]),
            decode_backup_stream=backup,
            _backup_done_event=Event(),
            _has_pending_backup=False,
        )
        # Request row 0 has just produced a compressed token ((9 - 1) % 4 == 0),
        # the one at compressed position 1; row 1 has not ((6 - 1) % 4 != 0).
        with ExitStack() as stack:
            device(stack, kind, schedule)
            pinned_host_memory(stack)
            coordinator._eager_backup_previous_token(
                on(torch.tensor([9, 6])),
                on(torch.tensor([0, 1])),
                torch.tensor([9, 6]),
                torch.tensor([0, 1]),
            )

        self.assertEqual(len(transfers.calls), 1)
        host_locs, device_locs, _ = transfers.calls[0]
        self.assertEqual(transfers.streams, [[backup]])
        self.assertEqual(backup.waited_for, [schedule])
        self.assertEqual(host_locs.tolist(), [201])
        self.assertEqual(device_locs.tolist(), [101])
        self.assertTrue(coordinator._has_pending_backup)
        # The two index tensors the copy reads, and the two the backup step
        # computed them from on the schedule stream (request rows, compressed
        # positions), are each held once on the backup stream until it is done.
        self.assertEqual([s for _, s in RECORDED], [backup] * 4, RECORDED)
        self.assertEqual(
            sorted(t.tolist() for t, _ in RECORDED), [[0], [1], [101], [201]]
        )
        self.assertTrue(any(t is host_locs for t, _ in RECORDED))
        self.assertTrue(any(t is device_locs for t, _ in RECORDED))


if __name__ == "__main__":
    unittest.main()
