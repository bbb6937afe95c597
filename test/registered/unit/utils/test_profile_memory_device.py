"""MEM profiling records the active device's allocator history, not torch.cuda's."""

import dataclasses
import sys
import tempfile
import unittest
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler_components import profiler_manager
from sglang.srt.managers.scheduler_components.profiler_manager import (
    SchedulerProfilerManager,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.srt.utils import profile_utils
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
    in profile_utils) to `module`; torch.cuda.memory raises as on an XPU build."""
    # A release without the fix does not read it there: it then fails on what it
    # does read (torch.cuda.memory), not on this pin.
    if hasattr(profile_utils, "get_device_module"):
        stack.enter_context(
            mock.patch.object(profile_utils, "get_device_module", return_value=module)
        )
    for name in ("_record_memory_history", "_dump_snapshot"):
        stack.enter_context(
            mock.patch.object(torch.cuda.memory, name, _cuda_not_compiled)
        )


def parallel_state():
    """The parallel state a one-process run hands the profilers: 0.5.20 passes a
    ParallelState in; later releases read get_parallel() (see single_rank())."""
    try:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    except ImportError:
        return get_parallel()
    return ParallelState.trivial()


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
        ps=parallel_state(),
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


def v2_manager(stack: ExitStack) -> SchedulerProfilerManager:
    """The scheduler's profiler under SGLANG_PROFILE_V2, as the scheduler makes it.

    A one-process run has no TP group: its CPU group is None, as the profilers
    only wait on it for traces, not for MEM."""
    stack.enter_context(envs.SGLANG_PROFILE_V2.override(True))
    stack.enter_context(get_context().override_server_args(device="cpu"))
    stack.enter_context(
        mock.patch.object(
            profiler_manager,
            "get_dp_tp_group",
            return_value=SimpleNamespace(cpu_group=None),
            create=True,  # 0.5.20 and 0.5.21 take the group as a field
        )
    )
    facts = dict(get_forward_ct=lambda: 0, dp_tp_cpu_group=None, ps=parallel_state())
    fields = [f.name for f in dataclasses.fields(SchedulerProfilerManager) if f.init]
    return SchedulerProfilerManager(**{name: facts[name] for name in fields})


def step(profiler: SchedulerProfilerManager, mode: ForwardMode) -> None:
    """One scheduled batch of `mode`, as the scheduler reports it to the profiler."""
    profiler._profile_batch_predicate(standin(ScheduleBatch, forward_mode=mode))


class TestProfileV2Memory(CustomTestCase):
    """The same through SGLANG_PROFILE_V2: a /start_profile by stage."""

    def start(self, profiler: SchedulerProfilerManager, out: str):
        return profiler._profile(
            ProfileReq(
                req_type=ProfileReqType.START_PROFILE,
                output_dir=out,
                num_steps=1,
                activities=["MEM"],
                profile_by_stage=True,
                profile_id="mem",
            )
        )

    def test_a_prefill_stage_records_and_dumps_through_torch_xpu(self):
        history = _History()
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.xpu)
            stack.enter_context(single_rank())
            history.watch(stack, torch.xpu.memory)
            profiler = v2_manager(stack)
            started = self.start(profiler, out)
            self.assertTrue(started.success, started.message)
            step(profiler, ForwardMode.EXTEND)
            self.assertEqual([c[0] for c in history.calls], ["record"])
            self.assertIn("max_entries", history.calls[0][1])
            step(profiler, ForwardMode.EXTEND)
            step(profiler, ForwardMode.EXTEND)  # past num_steps: the stage ends
            self.assertEqual(
                [c[0] for c in history.calls], ["record", "dump", "record"]
            )
            self.assertEqual(history.calls[2][1], {"enabled": None})
            dumped = Path(history.calls[1][1])
            self.assertEqual(dumped.parent, Path(out))
            self.assertTrue(dumped.name.endswith("-prefill.pickle"), dumped.name)
            self.assertEqual(dumped.read_bytes(), b"snapshot")

    def test_without_history_it_warns_and_writes_nothing(self):
        with ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            device(stack, torch.cpu)
            stack.enter_context(single_rank())
            profiler = v2_manager(stack)
            self.start(profiler, out)
            with self.assertLogs(level="WARNING") as logs:
                step(profiler, ForwardMode.EXTEND)
            self.assertIn("MEM profiling is not supported", "\n".join(logs.output))
            step(profiler, ForwardMode.EXTEND)
            step(profiler, ForwardMode.EXTEND)
            self.assertEqual(list(Path(out).iterdir()), [])


if __name__ == "__main__":
    unittest.main()
