"""A PD prefill scheduler's KV send from real classes; device events are the edge."""

from __future__ import annotations

import sys
from array import array
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.sampling.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import standin  # noqa: E402

PAGE_SIZE = 4
# The KV slots of the request's 12 prompt tokens: pages 10, 11 and 12.
SLOTS = list(range(40, 52))
PAGES = [slot // PAGE_SIZE for slot in SLOTS[::PAGE_SIZE]]
CUDA_NOT_COMPILED = "Torch not compiled with CUDA enabled"
XPU_NOT_COMPILED = "Torch not compiled with XPU enabled"


class Stream:
    """A device stream, known by name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"


class DeviceEvents:
    """One device module's `Event` and `current_stream`, recording what is made."""

    def __init__(self, stack: ExitStack, device: str) -> None:
        self.device = device
        self.made: list = []
        self.current = Stream(f"{device} current stream")
        made, name = self.made, device

        class Event:
            def __init__(self, *args, **kwargs) -> None:
                self.device = name
                self.recorded_on: list = []
                made.append(self)

            def record(self, stream=None) -> None:
                self.recorded_on.append(stream)

            def synchronize(self) -> None:
                pass

        module = torch.get_device_module(device)
        stack.enter_context(mock.patch.object(module, "Event", Event))
        stack.enter_context(
            mock.patch.object(module, "current_stream", lambda *a, **k: self.current)
        )


def _absent_device(stack: ExitStack, device: str, message: str) -> None:
    """A device module as a torch build without that device has it: its Event is
    a dummy class that refuses to construct, its streams need a lazy init."""

    class Event:
        def __init__(self, *args, **kwargs) -> None:
            raise RuntimeError("Tried to instantiate dummy base class Event")

    def current_stream(*args, **kwargs):
        raise AssertionError(message)

    module = torch.get_device_module(device)
    stack.enter_context(mock.patch.object(module, "Event", Event))
    stack.enter_context(mock.patch.object(module, "current_stream", current_stream))


def xpu_build(stack: ExitStack) -> DeviceEvents:
    """torch as an XPU build has it: torch.xpu records, torch.cuda raises."""
    _absent_device(stack, "cuda", CUDA_NOT_COMPILED)
    _unpinned_host_copies(stack)
    return DeviceEvents(stack, "xpu")


def cuda_build(stack: ExitStack) -> DeviceEvents:
    """torch as a CUDA build has it: torch.cuda records, torch.xpu raises."""
    _absent_device(stack, "xpu", XPU_NOT_COMPILED)
    _unpinned_host_copies(stack)
    return DeviceEvents(stack, "cuda")


def _unpinned_host_copies(stack: ExitStack) -> None:
    # Pinned host memory comes from the accelerator's host allocator, which a
    # runner without a GPU lacks; the copy is the same unpinned.
    empty = torch.empty

    def unpinned(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return empty(*args, **kwargs)

    stack.enter_context(mock.patch.object(torch, "empty", unpinned))


def scheduler(device: str, **state) -> Scheduler:
    """A prefill scheduler on `device` under overlap scheduling, as its
    `init_overlap` leaves it: `device_module` is torch's module for `device`."""
    facts = dict(
        device=device,
        device_module=torch.get_device_module(device),
        enable_overlap=True,
        forward_stream=Stream("forward stream"),
        token_to_kv_pool_allocator=standin(
            PagedTokenToKVPoolAllocator, page_size=PAGE_SIZE
        ),
        req_to_token_pool=standin(
            ReqToTokenPool, req_to_token=torch.tensor([SLOTS], dtype=torch.int32)
        ),
        disagg_prefill_pending_chunk_rids=set(),
    )
    facts.update(state)
    return standin(Scheduler, **facts)


def request(sender, cached_tokens: int = 0) -> Req:
    """A 12-token request in row 0 whose first `cached_tokens` hit the radix
    cache on the device."""
    req = Req("pd-req", "", array("i", range(len(SLOTS))), SamplingParams())
    req.kv.req_pool_idx = 0
    req.prefix_len = cached_tokens
    req.prefix_indices = torch.tensor(SLOTS[:cached_tokens])  # read before 0.5.23
    req.extend_end = len(SLOTS)
    req.disagg_kv_sender = sender
    return req
