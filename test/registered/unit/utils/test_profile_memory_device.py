"""MEM profiling records the active device's allocator history, not torch.cuda's."""

import inspect
import sys
import tempfile
import unittest
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType
from sglang.srt.managers.scheduler_components.profiler_manager import (
    SchedulerProfilerManager,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.utils import common, profile_utils
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import single_rank, standin  # noqa: E402

register_cpu_ci(est_time=8, suite="base-a-test-cpu")

NOT_COMPILED = "Torch not compiled with CUDA enabled"


class _History:
    """What a device module's `memory` records (the boundary: torch.xpu.memory)."""

    def __init__(self) -> None:
        self.calls = []

    def record(self, *args, **kwargs) -> None:
        self.calls.append(("record", kwargs))

    def dump(self, path) -> None:
        self.calls.append(("dump", str(path)))
        Path(path).write_bytes(b"snapshot")

    def watch(self, stack: ExitStack, memory) -> "_History":
        """Record what `memory` (a device module's) is asked, while `stack` lasts."""
        for name, fn in (
            ("_record_memory_history", self.record),
            ("_dump_snapshot", self.dump),
        ):
            stack.enter_context(mock.patch.object(memory, name, fn))
        return self


def _cuda_not_compiled(*args, **kwargs):
    # torch.cuda.memory on an XPU build of torch, where CUDA is not compiled in.
    raise AssertionError(NOT_COMPILED)


def device(stack: ExitStack, module) -> None:
    """Pin the device module the profilers read (`get_device_module()`, looked up
    in sglang.srt.utils.common) to `module`; torch.cuda.memory raises as on an
    XPU build."""
    stack.enter_context(
        mock.patch.object(common, "get_device_module", return_value=module)
    )
    for name in ("_record_memory_history", "_dump_snapshot"):
        stack.enter_context(
            mock.patch.object(torch.cuda.memory, name, _cuda_not_compiled)
        )


def manager(output_dir: str, activities=("MEM",)) -> SchedulerProfilerManager:
    return standin(
        SchedulerProfilerManager,
        get_forward_ct=lambda: 0,
        profiler_activities=list(activities),
        torch_profiler_output_dir=Path(output_dir),
        torch_profiler_with_stack=None,
        torch_profiler_record_shapes=None,
        profile_id="mem",
        profile_prefix="",
        merge_profiles=False,
        detailed_annotations=False,
        profile_in_progress=False,
        # Older releases read the ranks through the manager's parallel state:
        # the real one, which answers with single_rank()'s values.
        ps=get_parallel(),
    )


class TestMemProfilingOnXpu(CustomTestCase):
    def test_start_and_stop_record_and_dump_through_torch_xpu(self):
        history = _History()
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.xpu)
            stack.enter_context(single_rank())
            history.watch(stack, torch.xpu.memory)
            profiler = manager(out)
            started = profiler._start_profile()
            self.assertTrue(started.success, started.message)
            self.assertTrue(profiler.profile_in_progress)
            self.assertEqual(len(history.calls), 1)
            kind, kwargs = history.calls[0]
            self.assertEqual(kind, "record")
            self.assertIn("max_entries", kwargs)

            stopped = profiler._stop_profile()
            self.assertTrue(stopped.success, stopped.message)
            kinds = [call[0] for call in history.calls]
            self.assertEqual(kinds, ["record", "dump", "record"])
            self.assertEqual(history.calls[2][1], {"enabled": None})
            dumped = Path(history.calls[1][1])
            self.assertEqual(dumped.parent, Path(out))
            self.assertTrue(dumped.name.endswith("-memory.pickle"), dumped.name)
            self.assertEqual(dumped.read_bytes(), b"snapshot")


def request(kind: ProfileReqType, out: str, activities=None) -> ProfileReq:
    """A /start_profile or /stop_profile as the scheduler receives it."""
    return ProfileReq(
        req_type=kind, output_dir=out, activities=activities, profile_id="mem"
    )


class TestMemProfilingWithoutHistory(CustomTestCase):
    def test_a_mem_only_start_fails_and_says_why(self):
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.cpu)  # no accelerator: torch.cpu keeps no history
            stack.enter_context(single_rank())
            profiler = manager(out)
            started = profiler._profile(
                request(ProfileReqType.START_PROFILE, out, ["MEM"])
            )
            self.assertFalse(started.success, started.message)
            self.assertIn("MEM profiling is not supported", started.message)
            self.assertIn("no allocator history", started.message)
            self.assertFalse(profiler.profile_in_progress)
            # Nothing was started, so nothing claims to be running.
            stopped = profiler._profile(request(ProfileReqType.STOP_PROFILE, out))
            self.assertFalse(stopped.success)
            self.assertIn("not in progress", stopped.message)
            self.assertEqual(list(Path(out).iterdir()), [])

    def test_beside_another_activity_mem_is_skipped_and_the_rest_runs(self):
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.cpu)
            stack.enter_context(single_rank())
            profiler = manager(out, activities=("CPU", "MEM"))
            with self.assertLogs(level="WARNING") as logs:
                started = profiler._start_profile()
            self.assertTrue(started.success, started.message)
            self.assertIn("MEM profiling is not supported", "\n".join(logs.output))
            self.assertTrue(profiler.profile_in_progress)
            # The CPU trace's export waits on the TP group, which a one-process
            # test has not made: stop that profiler here.
            profiler.torch_profiler.stop()
            profiler.torch_profiler = None
            # Stopping must not try to dump a MEM snapshot the device cannot give.
            stopped = profiler._stop_profile()
            self.assertTrue(stopped.success, stopped.message)
            self.assertEqual(list(Path(out).iterdir()), [])

    def test_a_device_memory_module_without_history_is_skipped_too(self):
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.xpu)
            stack.enter_context(single_rank())
            # A torch.<device>.memory that keeps no allocator history.
            stack.enter_context(
                mock.patch.object(torch.xpu, "memory", SimpleNamespace())
            )
            profiler = manager(out)
            with self.assertLogs(level="WARNING") as logs:
                started = profiler._start_profile()
            self.assertFalse(started.success, started.message)
            self.assertIn("MEM profiling is not supported", "\n".join(logs.output))
            self.assertFalse(profiler.profile_in_progress)


class TestStopWithoutMem(CustomTestCase):
    def test_stopping_a_profile_without_mem_dumps_nothing(self):
        history = _History()
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.xpu)
            stack.enter_context(single_rank())
            history.watch(stack, torch.xpu.memory)
            profiler = manager(out)
            profiler.profiler_activities = []
            profiler.profile_in_progress = True
            stopped = profiler._stop_profile()
            self.assertTrue(stopped.success, stopped.message)
            self.assertEqual(history.calls, [])


class TestProfileManagerV2Memory(CustomTestCase):
    """The same through SGLANG_PROFILE_V2's profiler (`_ProfilerMemory`)."""

    def make(self, out: str):
        kwargs = dict(
            output_dir=out,
            output_prefix="v2",
            output_suffix="",
            profile_id="mem",
            cpu_group=None,
            first_rank_in_node=True,
        )
        init = inspect.signature(profile_utils._ProfilerConcreteBase.__init__)
        if "ps" in init.parameters:
            # 0.5.20 hands the profilers the parallel state: the real one.
            kwargs["ps"] = get_parallel()
        return profile_utils._ProfilerMemory(**kwargs)

    def test_it_records_and_dumps_through_torch_xpu(self):
        history = _History()
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.xpu)
            stack.enter_context(single_rank())
            history.watch(stack, torch.xpu.memory)
            inner = self.make(str(Path(out) / "traces"))
            inner.start()
            self.assertEqual([c[0] for c in history.calls], ["record"])
            self.assertIn("max_entries", history.calls[0][1])
            inner.stop()
            self.assertEqual(
                [c[0] for c in history.calls], ["record", "dump", "record"]
            )
            self.assertEqual(history.calls[2][1], {"enabled": None})
            dumped = Path(history.calls[1][1])
            self.assertTrue(dumped.name.startswith("v2-"), dumped.name)
            self.assertEqual(dumped.read_bytes(), b"snapshot")

    def test_without_history_it_warns_and_writes_nothing(self):
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.cpu)
            stack.enter_context(single_rank())
            inner = self.make(str(Path(out) / "traces"))
            with self.assertLogs(level="WARNING") as logs:
                inner.start()
            self.assertIn("MEM profiling is not supported", "\n".join(logs.output))
            inner.stop()
            self.assertFalse((Path(out) / "traces").exists())


if __name__ == "__main__":
    unittest.main()
