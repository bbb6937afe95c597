"""Mooncake's host page indices wait on an event of the PD scheduler's device."""

import queue
import sys
import unittest
from contextlib import ExitStack
from pathlib import Path

from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, MooncakeKVSender
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.environ import envs
from sglang.srt.observability.trace import TraceNullContext
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prefill_send import PAGES, cuda_build, request, scheduler, xpu_build  # noqa: E402
from standins import single_rank, standin  # noqa: E402

register_cpu_ci(est_time=30, suite="base-a-test-cpu")

ROOM = 7


def mooncake_sender() -> tuple[MooncakeKVSender, queue.Queue]:
    """Mooncake's sender and manager, bootstrapped with one decode peer; the
    queue is what the transfer worker reads (the boundary: RDMA is next)."""
    worker_queue: queue.Queue = queue.Queue()
    manager = standin(
        MooncakeKVManager,
        disaggregation_mode=DisaggregationMode.PREFILL,
        request_status={ROOM: KVPoll.WaitingForInput},
        transfer_infos={ROOM: {"10.0.0.2:17000": "decode peer"}},
        transfer_queues=[worker_queue],
        kv_shard_size=1,
        enable_all_cp_ranks_for_transfer=False,
        is_dummy_cp_rank=False,
    )
    sender = standin(
        MooncakeKVSender,
        kv_mgr=manager,
        bootstrap_room=ROOM,
        curr_idx=0,
        num_kv_indices=len(PAGES),
        aux_index=0,
        _transfer_num_kv_indices=0,
        _transfer_num_state_indices=0,
    )
    # Set on the instance: a callable fact would become a (seemingly abstract)
    # staticmethod of the stand-in class.
    sender.trace_ctx = TraceNullContext()
    return sender, worker_queue


def queued(worker_queue: queue.Queue) -> list:
    chunks = []
    while not worker_queue.empty():
        chunks.append(worker_queue.get_nowait())
    return chunks


class KvSend:
    """One request sent by a prefill scheduler on `device` through Mooncake."""

    def __init__(
        self,
        stack: ExitStack,
        device: str,
        cached_tokens: int = 0,
        overlap: bool = True,
    ):
        stack.enter_context(single_rank())
        stack.enter_context(
            envs.SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX.override(True)
        )
        sender, self.worker_queue = mooncake_sender()
        self.req = request(sender, cached_tokens=cached_tokens)
        if overlap:
            self.scheduler = scheduler(device)
        else:
            # --disable-overlap-schedule (what upstream's XPU tests run): no
            # forward stream of its own; init_overlap still sets device_module.
            self.scheduler = scheduler(
                device, enable_overlap=False, forward_stream=None
            )

    def chunks(self) -> list:
        return queued(self.worker_queue)


class TestMooncakeKvSendOnXpu(CustomTestCase):
    def test_a_prefilled_chunk_reaches_the_worker_behind_an_xpu_event(self):
        with ExitStack() as stack:
            xpu = xpu_build(stack)
            run = KvSend(stack, "xpu")
            run.scheduler.send_kv_chunk(run.req, last_chunk=False)
            chunks = run.chunks()
        self.assertEqual(len(chunks), 1)
        chunk = chunks[0]
        self.assertEqual(chunk.prefill_kv_indices.tolist(), PAGES)
        self.assertEqual(chunk.prefill_kv_indices.device.type, "cpu")
        event = chunk.indices_event
        self.assertIsNotNone(event, "the worker must wait for the host copy")
        self.assertEqual(event.device, "xpu")
        # Recorded on the stream that issued the copy: the scheduler's current one.
        self.assertEqual(event.recorded_on, [xpu.current])
        self.assertEqual(xpu.made, [event])
        self.assertEqual(run.req.start_send_idx, len(PAGES) * 4)


class TestMooncakeKvSendWithoutOverlap(CustomTestCase):
    """The host copy is asynchronous with or without the overlap scheduler: the
    worker must wait for it either way."""

    def test_xpu_without_overlap_still_waits_on_an_xpu_event(self):
        with ExitStack() as stack:
            xpu = xpu_build(stack)
            run = KvSend(stack, "xpu", overlap=False)
            run.scheduler.send_kv_chunk(run.req, last_chunk=False)
            chunks = run.chunks()
        self.assertEqual([c.prefill_kv_indices.tolist() for c in chunks], [PAGES])
        event = chunks[0].indices_event
        self.assertIsNotNone(event, "the worker must wait for the host copy")
        self.assertEqual(event.device, "xpu")
        self.assertEqual(event.recorded_on, [xpu.current])
        self.assertEqual(xpu.made, [event])

    def test_cuda_without_overlap_keeps_torch_cuda(self):
        with ExitStack() as stack:
            cuda = cuda_build(stack)
            run = KvSend(stack, "cuda", overlap=False)
            run.scheduler.send_kv_chunk(run.req, last_chunk=False)
            chunks = run.chunks()
        event = chunks[0].indices_event
        self.assertEqual(event.device, "cuda")
        self.assertEqual(event.recorded_on, [cuda.current])
        self.assertEqual(cuda.made, [event])


class TestMooncakeKvSendOnCuda(CustomTestCase):
    def test_cuda_keeps_its_torch_cuda_event_on_the_current_stream(self):
        with ExitStack() as stack:
            cuda = cuda_build(stack)
            run = KvSend(stack, "cuda")
            run.scheduler.send_kv_chunk(run.req, last_chunk=False)
            chunks = run.chunks()
        self.assertEqual([c.prefill_kv_indices.tolist() for c in chunks], [PAGES])
        event = chunks[0].indices_event
        self.assertEqual(event.device, "cuda")
        self.assertEqual(event.recorded_on, [cuda.current])
        self.assertEqual(cuda.made, [event])


if __name__ == "__main__":
    unittest.main()
