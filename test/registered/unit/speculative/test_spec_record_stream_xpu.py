"""EAGLE v2 and NGRAM verify record their XPU tensors on the forward stream."""

import sys
import unittest
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.speculative import eagle_worker_common
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.spec_utils import (
    record_stream_each,
    record_stream_for_v2_verify,
)
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
# done; here the stand-in tensors below note the call instead.


class HostTensor(torch.Tensor):
    """A host tensor whose record_stream is observed (it must not be called)."""

    def record_stream(self, stream) -> None:
        RECORDED.append((self, stream))


def on(kind: type, *values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).as_subclass(kind)


class Stream:
    """A device stream (torch.xpu.Stream on an XPU)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other: "Stream") -> None:
        pass

    def __repr__(self) -> str:
        return f"Stream({self.name})"


class PlanStreamEntered(Exception):
    """The verify step switched to the plan stream: prepare_for_verify starts."""


class PlanStreamContext:
    def __enter__(self):
        raise PlanStreamEntered

    def __exit__(self, *exc) -> bool:
        return False


def cuda_not_compiled(*args, **kwargs):
    # torch.cuda on an XPU build of torch, where CUDA is not compiled in.
    raise AssertionError(NOT_COMPILED)


def xpu_device(stack: ExitStack, forward: Stream) -> None:
    """torch.xpu reports `forward` as the current stream; torch.cuda raises."""
    stack.enter_context(
        mock.patch.object(torch.xpu, "current_stream", lambda *a: forward)
    )
    for name in ("current_stream", "stream"):
        stack.enter_context(mock.patch.object(torch.cuda, name, cuda_not_compiled))


def verify_batch():
    """A batch in spec v2 verify with its draft tree, all in XPU memory."""
    verify_input = standin(
        EagleVerifyInput,
        draft_token=on(XpuTensor, 11, 12, 13, 14),
        custom_mask=on(XpuTensor, 1, 1, 0, 1),
        positions=on(XpuTensor, 7, 8, 8, 9),
        retrieve_index=on(XpuTensor, 0, 1, 2, 3),
        retrieve_next_token=on(XpuTensor, 1, 3, -1, -1),
        retrieve_next_sibling=on(XpuTensor, -1, 2, -1, -1),
    )
    batch = standin(
        ScheduleBatch,
        seq_lens=on(XpuTensor, 7),
        req_pool_indices=on(XpuTensor, 0),
        input_ids=on(XpuTensor, 10),
        out_cache_loc=on(XpuTensor, 40, 41, 42, 43),
        spec_info=verify_input,
    )
    return batch, verify_input


def read_in_flight(batch, verify_input) -> list:
    """The tensors the verify forward may still read after the batch drops them."""
    return [
        batch.seq_lens,
        batch.req_pool_indices,
        batch.input_ids,
        batch.out_cache_loc,
        verify_input.draft_token,
        verify_input.custom_mask,
        verify_input.positions,
        verify_input.retrieve_index,
        verify_input.retrieve_next_token,
        verify_input.retrieve_next_sibling,
    ]


class RecordStreamCase(CustomTestCase):
    assert_recorded_once_on = assert_recorded_once_on

    def setUp(self) -> None:
        RECORDED.clear()


class TestEagleV2VerifyOnXpu(RecordStreamCase):
    def test_verify_records_its_tensors_on_the_xpu_forward_stream(self):
        forward = Stream("xpu forward")
        batch, verify_input = verify_batch()
        with ExitStack() as stack:
            xpu_device(stack, forward)
            with self.assertRaises(PlanStreamEntered):
                eagle_worker_common.run_eagle_verify(
                    batch,
                    target_worker=None,
                    req_to_token_pool=None,
                    token_to_kv_pool_allocator=None,
                    plan_stream=Stream("xpu plan"),
                    plan_stream_ctx=PlanStreamContext(),
                    topk=1,
                    num_draft_tokens=4,
                    device="xpu",
                    metadata_ready_pre_pad=False,
                    finalize_tree_path=False,
                )
        # Before prepare_for_verify rebinds batch.input_ids / out_cache_loc,
        # every tensor the forward reads is held on the forward stream.
        self.assert_recorded_once_on(forward, read_in_flight(batch, verify_input))

    def test_post_prepare_rebinds_are_recorded_too(self):
        forward = Stream("xpu forward")
        input_ids, out_cache_loc = on(XpuTensor, 11, 12), on(XpuTensor, 50, 51)
        record_stream_each((input_ids, out_cache_loc), forward)
        self.assert_recorded_once_on(forward, [input_ids, out_cache_loc])


class TestNgramVerifyOnXpu(RecordStreamCase):
    def test_ngram_verify_records_the_batch_tensors(self):
        # NGRAMWorker.forward_batch_generation passes no verify input.
        forward = Stream("xpu forward")
        batch, _ = verify_batch()
        record_stream_for_v2_verify(batch, None, forward)
        self.assert_recorded_once_on(
            forward,
            [
                batch.seq_lens,
                batch.req_pool_indices,
                batch.input_ids,
                batch.out_cache_loc,
            ],
        )


class TestWhichTensorsAreRecorded(RecordStreamCase):
    def test_cuda_tensors_are_still_recorded(self):
        forward = Stream("cuda forward")
        tensors = [on(CudaTensor, 1, 2), on(CudaTensor, 3)]
        record_stream_each(tensors, forward)
        self.assert_recorded_once_on(forward, tensors)

    def test_host_tensors_and_non_tensors_are_skipped(self):
        forward = Stream("xpu forward")
        device = on(XpuTensor, 5)
        record_stream_each([on(HostTensor, 1, 2), None, 3, device], forward)
        self.assert_recorded_once_on(forward, [device])


if __name__ == "__main__":
    unittest.main()
