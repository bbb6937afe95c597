"""Device-agnostic allocator probes and the scheduler's cache-reclaim log."""

import logging
import sys
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.utils import common
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import standin  # noqa: E402

register_cpu_ci(est_time=12, suite="base-a-test-cpu")

MB = 1024 * 1024


class _NoAllocatorHooks:
    """A device module like torch.cpu: neither empty_cache nor memory_reserved."""


class _WithAllocatorHooks:
    """A device module like torch.xpu: reserved bytes drop when the cache empties."""

    def __init__(self, reserved: int, after_empty: int) -> None:
        self.reserved = reserved
        self.after_empty = after_empty
        self.empty_calls = 0

    def memory_reserved(self) -> int:
        return self.reserved

    def empty_cache(self) -> None:
        self.empty_calls += 1
        self.reserved = self.after_empty


class _EmptyCacheOnly:
    """A device module like torch.mps: empty_cache, but no memory_reserved."""

    def __init__(self) -> None:
        self.empty_calls = 0

    def empty_cache(self) -> None:
        self.empty_calls += 1


class TestDeviceMemoryReserved(CustomTestCase):
    def test_missing_hook_reads_zero(self):
        self.assertEqual(common.device_memory_reserved(_NoAllocatorHooks()), 0)

    def test_hook_value_is_forwarded_as_int(self):
        module = _WithAllocatorHooks(reserved=3 * MB, after_empty=0)
        value = common.device_memory_reserved(module)
        self.assertEqual(value, 3 * MB)
        self.assertIs(type(value), int)

    def test_cpu_device_module_has_no_reserve(self):
        self.assertEqual(
            common.device_memory_reserved(torch.get_device_module("cpu")), 0
        )

    def test_defaults_to_the_active_device_module(self):
        module = _WithAllocatorHooks(reserved=5 * MB, after_empty=0)
        with mock.patch.object(torch, "get_device_module", return_value=module):
            self.assertEqual(common.device_memory_reserved(), 5 * MB)


class TestEmptyDeviceCache(CustomTestCase):
    def test_missing_hook_returns_false(self):
        self.assertFalse(common.empty_device_cache(_NoAllocatorHooks()))

    def test_hook_is_called_once(self):
        module = _WithAllocatorHooks(reserved=MB, after_empty=0)
        self.assertTrue(common.empty_device_cache(module))
        self.assertEqual(module.empty_calls, 1)


class TestContinueGenerationReclaimLog(CustomTestCase):
    """Scheduler.continue_generation with the active device module faked (the
    boundary) on a scheduler built from the real class."""

    def _continue(self, device_module, mode=DisaggregationMode.NULL, queue=None):
        fake_self = standin(
            Scheduler,
            disaggregation_mode=mode,
            disagg_decode_prealloc_queue=queue,
            _engine_paused=True,
        )
        request = SimpleNamespace(torch_empty_cache=True)
        with (
            mock.patch.object(torch, "get_device_module", return_value=device_module),
            self.assertLogs(scheduler_module.logger, logging.INFO) as logs,
        ):
            Scheduler.continue_generation(fake_self, request)
        self.assertFalse(fake_self._engine_paused)
        return "\n".join(logs.output)

    def test_reclaim_reads_the_active_device(self):
        module = _WithAllocatorHooks(reserved=300 * MB, after_empty=100 * MB)
        text = self._continue(module)
        self.assertIn("reserved 300.0 MB -> 100.0 MB (freed 200.0 MB)", text)
        self.assertNotIn("torch.cuda", text)
        self.assertEqual(module.empty_calls, 1)

    def test_unmeasurable_device_says_unknown_without_figures(self):
        module = _EmptyCacheOnly()
        text = self._continue(module)
        self.assertEqual(module.empty_calls, 1)
        self.assertIn("amount released is unknown", text)
        self.assertNotIn(" MB", text)
        self.assertNotIn("no empty_cache hook", text)

    def test_no_hook_says_nothing_was_released(self):
        text = self._continue(_NoAllocatorHooks())
        self.assertIn("no empty_cache hook", text)
        self.assertNotIn(" MB", text)

    def test_held_rebootstraps_are_still_enqueued(self):
        held = []
        queue = SimpleNamespace(enqueue_held_rebootstrap=lambda: held.append("go"))
        self._continue(_NoAllocatorHooks(), DisaggregationMode.DECODE, queue)
        self.assertEqual(held, ["go"])


if __name__ == "__main__":
    unittest.main()
