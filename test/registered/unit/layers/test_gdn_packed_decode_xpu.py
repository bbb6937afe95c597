"""Qwen3.5's single-request GDN decode at TP 4 launches on XPU: the Blackwell tile
choice asks the CUDA capability of CUDA tensors only."""

import sys
import unittest
from pathlib import Path
from unittest import mock

import torch
from sglang.kernels.ops.attention.fla import fused_recurrent
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import CudaTensor, XpuTensor  # noqa: E402

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

NOT_COMPILED = "Torch not compiled with CUDA enabled"
# Qwen3.5 at TP 4: 12 value heads and 4 key heads of 128 per rank.
HV, H, V, K = 12, 4, 128, 128
QKV_DIM = 2 * H * K + HV * V  # 2560


class _Launches:
    """The Triton kernel (the boundary: it needs a GPU): each launch's grid and
    value tile."""

    def __init__(self) -> None:
        self.seen: list = []

    def __getitem__(self, grid):
        def launch(**kwargs) -> None:
            self.seen.append((grid, kwargs["BV"]))

        return launch


def _cuda_not_compiled(*args, **kwargs):
    raise AssertionError(NOT_COMPILED)


def decode(tensor_type: type, batch: int = 1) -> list:
    """One packed decode step of `batch` requests, with every tensor reported on
    `tensor_type`'s device; the kernel launches it made."""

    def as_device(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.as_subclass(tensor_type)

    launches = _Launches()
    with mock.patch.object(
        fused_recurrent,
        "fused_recurrent_gated_delta_rule_packed_decode_kernel",
        launches,
    ):
        fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode(
            mixed_qkv=as_device(torch.zeros(batch, QKV_DIM, dtype=torch.bfloat16)),
            a=as_device(torch.zeros(batch, HV, dtype=torch.bfloat16)),
            b=as_device(torch.zeros(batch, HV, dtype=torch.bfloat16)),
            A_log=as_device(torch.zeros(HV)),
            dt_bias=as_device(torch.zeros(HV)),
            scale=K**-0.5,
            initial_state=as_device(torch.zeros(2, HV, V, K)),
            out=as_device(torch.zeros(batch, 1, HV, V, dtype=torch.bfloat16)),
            ssm_state_indices=as_device(torch.zeros(batch, dtype=torch.int32)),
            use_qk_l2norm_in_kernel=True,
        )
    return launches.seen


class TestPackedDecodeOnXpu(CustomTestCase):
    def test_the_qwen35_tp4_shape_launches_without_asking_cuda(self):
        with mock.patch.object(torch.cuda, "get_device_capability", _cuda_not_compiled):
            launches = decode(XpuTensor)
        # The usual 32-wide value tile: 4 tiles per value head.
        self.assertEqual(launches, [((V // 32, HV), 32)])

    def test_a_batch_launches_as_before(self):
        with mock.patch.object(torch.cuda, "get_device_capability", _cuda_not_compiled):
            self.assertEqual(decode(XpuTensor, batch=2), [((V // 32, 2 * HV), 32)])


class TestPackedDecodeOnCuda(CustomTestCase):
    def test_blackwell_keeps_its_small_value_tile(self):
        with mock.patch.object(
            torch.cuda, "get_device_capability", return_value=(10, 0)
        ):
            self.assertEqual(decode(CudaTensor), [((V // 8, HV), 8)])

    def test_hopper_takes_the_usual_tile(self):
        with mock.patch.object(
            torch.cuda, "get_device_capability", return_value=(9, 0)
        ):
            self.assertEqual(decode(CudaTensor), [((V // 32, HV), 32)])


if __name__ == "__main__":
    unittest.main()
