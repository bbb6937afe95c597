"""After sglang patches torch's tensor reductions (every scheduler process, the RL
weight sync helper), tensors that are not CUDA tensors still serialize."""

import unittest
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from types import SimpleNamespace
from unittest import mock

import torch
from sglang.srt.utils.common import MultiprocessingSerializer
from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from torch.multiprocessing import reductions

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

GPU_UUID = "GPU-5a4b3c2d-0000-1111-2222-333344445555"


@contextmanager
def patched_reductions():
    """sglang's patch of torch's reductions, undone afterwards: it is process-wide
    and other tests in this process pickle tensors too."""
    saved = {
        name: getattr(reductions, name)
        for name in ("reduce_tensor", "rebuild_cuda_tensor")
    }
    extra = dict(ForkingPickler._extra_reducers)
    try:
        monkey_patch_torch_reductions()
        yield
    finally:
        for name, value in saved.items():
            setattr(reductions, name, value)
        for name in ("_reduce_tensor_original", "_rebuild_cuda_tensor_original"):
            if hasattr(reductions, name):
                delattr(reductions, name)
        ForkingPickler._extra_reducers.clear()
        ForkingPickler._extra_reducers.update(extra)


class TestNonCudaTensorsAfterThePatch(CustomTestCase):
    def test_a_cpu_tensor_still_serializes_and_comes_back(self):
        weight = torch.arange(8.0).reshape(2, 4)
        with patched_reductions():
            payload = MultiprocessingSerializer.serialize([("w", weight)])
            ((name, back),) = MultiprocessingSerializer.deserialize(payload)
        self.assertEqual(name, "w")
        self.assertTrue(torch.equal(back, weight))

    def test_torch_reduction_of_a_cpu_tensor_is_passed_on_unchanged(self):
        weight = torch.ones(3)
        original = reductions.reduce_tensor(weight)
        with patched_reductions():
            patched = reductions.reduce_tensor(weight)
        self.assertIs(patched[0], original[0])
        self.assertEqual(len(patched[1]), len(original[1]))


class TestCudaTensorsStillCarryTheDeviceUuid(CustomTestCase):
    def test_the_cuda_device_index_becomes_its_uuid(self):
        # torch's CUDA reduction, as it comes back on a GPU (IPC handles are the
        # boundary a CPU runner cannot make): the device index is slot 6.
        cuda_args = ("cls", 7, (2,), (1,), 0, "storage", 0, "handle", 64, 0)

        def cuda_reduction(tensor):
            return reductions.rebuild_cuda_tensor, cuda_args

        with patched_reductions():
            with (
                mock.patch.object(
                    reductions, "_reduce_tensor_original", cuda_reduction
                ),
                mock.patch.object(
                    torch.cuda,
                    "get_device_properties",
                    lambda device: SimpleNamespace(uuid=GPU_UUID),
                ),
            ):
                rebuild, args = reductions.reduce_tensor(torch.ones(2))
        self.assertEqual(args[6], GPU_UUID)
        self.assertEqual(args[:6] + args[7:], cuda_args[:6] + cuda_args[7:])


if __name__ == "__main__":
    unittest.main()
