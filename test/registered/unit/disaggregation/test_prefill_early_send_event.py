"""The PD early send of a cached prefix waits on an event of the scheduler's device."""

import sys
import unittest
from contextlib import ExitStack
from pathlib import Path

from sglang.srt.disaggregation.nixl.conn import NixlKVManager, NixlKVSender
from sglang.srt.environ import envs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prefill_send import PAGES, cuda_build, request, scheduler, xpu_build  # noqa: E402
from standins import single_rank, standin  # noqa: E402

register_cpu_ci(est_time=30, suite="base-a-test-cpu")


class Wire:
    """What reaches the transfer backend: each send's pages, and the event the
    sender holds for its worker to wait on before reading the KV."""

    def __init__(self) -> None:
        self.sends: list = []
        self.sender = None

    def send(self, page_indices, state_indices=None, **kwargs) -> None:
        self.sends.append(
            dict(
                pages=[int(p) for p in page_indices],
                wait_event=self.sender._early_send_wait_event,
                indices_event=kwargs.get("indices_event"),
            )
        )


def nixl_sender(wire: Wire) -> NixlKVSender:
    # NIXL: the PD transfer backend with Intel GPU support (nixl/conn.py).
    sender = standin(
        NixlKVSender,
        kv_mgr=standin(NixlKVManager, enable_all_cp_ranks_for_transfer=False),
        send=wire.send,
    )
    wire.sender = sender
    return sender


def early_send(stack: ExitStack, device: str, cached_tokens: int) -> Wire:
    """A request whose first `cached_tokens` hit the device radix cache, run
    through the scheduler's early send before its forward."""
    stack.enter_context(single_rank())
    stack.enter_context(
        envs.SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX.override(True)
    )
    wire = Wire()
    req = request(nixl_sender(wire), cached_tokens=cached_tokens)
    sched = scheduler(device)
    sched.maybe_send_cached_prefix_chunk(req)
    wire.forward_stream = sched.forward_stream
    wire.req = req
    return wire


class TestEarlySendOnXpu(CustomTestCase):
    def test_the_cached_prefix_is_sent_behind_an_xpu_event_on_the_forward_stream(
        self,
    ):
        with ExitStack() as stack:
            xpu = xpu_build(stack)
            wire = early_send(stack, "xpu", cached_tokens=8)
        self.assertEqual([s["pages"] for s in wire.sends], [PAGES[:2]])
        self.assertEqual(wire.req.start_send_idx, 8)
        event = wire.sends[0]["wait_event"]
        self.assertIsNotNone(event, "the send must wait for the prior forward")
        self.assertEqual(event.device, "xpu")
        self.assertEqual(event.recorded_on, [wire.forward_stream])
        self.assertEqual(xpu.made, [event])


class TestEarlySendOnCuda(CustomTestCase):
    def test_cuda_keeps_its_torch_cuda_event(self):
        with ExitStack() as stack:
            cuda = cuda_build(stack)
            wire = early_send(stack, "cuda", cached_tokens=8)
        self.assertEqual([s["pages"] for s in wire.sends], [PAGES[:2]])
        event = wire.sends[0]["wait_event"]
        self.assertEqual(event.device, "cuda")
        self.assertEqual(event.recorded_on, [wire.forward_stream])
        self.assertEqual(cuda.made, [event])


if __name__ == "__main__":
    unittest.main()
