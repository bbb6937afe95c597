"""Stand-ins built from sglang's real classes, for tests that must hold on every
release the series serves.

A `SimpleNamespace` stand-in breaks as soon as a newer release reads one more
attribute in the method under test, and the test then reports noise instead of
the behaviour. `standin(cls, **state)` is an instance of a subclass of the real
class: its methods and properties are upstream's own, `__init__` is not run, the
attributes the test names are set, and every other instance attribute reads as
None (a feature that is off, a queue that is absent).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def _absent(self: Any, name: str) -> None:
    # Python's own protocols (copy, pickle, mock's introspection) must still see
    # a missing dunder as missing.
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return None


def standin(cls: type[T], **state: Any) -> T:
    """An instance of `cls` with only `state` set; other attributes read as None.

    >>> class Pool:
    ...     def __init__(self):
    ...         raise RuntimeError("needs a device")
    ...     def size(self):
    ...         return self.tokens * 2
    >>> pool = standin(Pool, tokens=3)
    >>> pool.size(), pool.added_in_a_later_release, isinstance(pool, Pool)
    (6, None, True)
    """
    # The named facts live on the subclass, so they also stand in for the real
    # class's read-only properties; functions are given as plain callables.
    facts = {
        name: staticmethod(value) if callable(value) and not isinstance(value, type)
        else value
        for name, value in state.items()
    }  # fmt: skip
    sub = type(
        f"StandIn{cls.__name__}",
        (cls,),
        {"__init__": lambda self: None, "__getattr__": _absent, **facts},
    )
    obj = object.__new__(sub)
    return obj


def device_memory_mb(total_mb: int):
    """The one hardware fact argument resolution reads on an XPU that a CPU runner
    lacks: the device's memory size, faked where every release asks for it."""
    from unittest import mock

    from sglang.srt.utils import common

    return mock.patch.object(common, "get_xpu_memory_capacity", return_value=total_mb)


# A process that is the only rank of every group, as a CPU test runs.
SINGLE_RANK = dict(
    world_size=1,
    world_rank=0,
    tp_size=1,
    tp_rank=0,
    attn_tp_size=1,
    attn_tp_rank=0,
    attn_dp_size=1,
    attn_dp_rank=0,
    attn_dcp_size=1,
    attn_dcp_rank=0,
    pp_size=1,
    pp_rank=0,
)


def single_rank():
    """Parallel widths and ranks of a one-process run, stated through
    `get_parallel().override`; a field a release does not have is left out."""
    from contextlib import ExitStack

    from sglang.srt.runtime_context import get_parallel

    stack = ExitStack()
    for name, value in SINGLE_RANK.items():
        try:
            stack.enter_context(get_parallel().override(**{name: value}))
        except ValueError:  # not a parallel field of this release
            continue
    return stack


# Tensors as torch reports them on a device this CPU runner does not have, for
# code that decides by `is_cuda` / `device.type`; their record_stream calls (the
# boundary: a stream-ordered free) land in RECORDED.
RECORDED: list = []


def _device_tensor(device: str) -> type:
    import torch

    def record_stream(self, stream) -> None:
        RECORDED.append((self, stream))

    # Every way torch answers "which device" agrees with `device`, so code may ask
    # any of them. Tensors computed from one (indexing, arithmetic, cat) keep its
    # class.
    return type(
        f"{device.capitalize()}Tensor",
        (torch.Tensor,),
        {
            "device": property(lambda self: torch.device(device, 0)),
            "is_cuda": property(lambda self: device == "cuda"),
            "is_xpu": property(lambda self: device == "xpu"),
            "is_cpu": property(lambda self: False),
            "record_stream": record_stream,
        },
    )


XpuTensor = _device_tensor("xpu")
CudaTensor = _device_tensor("cuda")


def assert_recorded_once_on(case: Any, stream: Any, tensors: list) -> None:
    """Each of `tensors`, and nothing else, was recorded once, on `stream`: a
    TestCase method (`case` is the test) for classes that clear RECORDED first."""
    case.assertEqual(len(RECORDED), len(tensors), RECORDED)
    for tensor in tensors:
        streams = [s for t, s in RECORDED if t is tensor]
        case.assertEqual(streams, [stream], f"record_stream of {tensor!r}")
