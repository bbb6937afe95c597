"""TP ranks agree on the sampled token ids on XPU, whose collective library (oneCCL,
torch's xccl backend) computes an integer all_reduce MIN as a SUM."""

import multiprocessing
import os
import sys
import tempfile
import traceback
import unittest
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import standin  # noqa: E402

register_cpu_ci(est_time=20, suite="base-a-test-cpu")

# Two TP groups of two ranks each (as with DP or PP beside TP): the sync must
# stay inside a rank's own TP group.
TP_GROUPS = ([0, 1], [2, 3])
WORLD = 4
INTEGER_MIN_MAX = (dist.ReduceOp.MIN, dist.ReduceOp.MAX)

# Each rank's sampled ids, by rank.
AGREE = [[5, 17, 3], [5, 17, 3], [8, 2, 6], [8, 2, 6]]
DISAGREE = [[5, 17, 3], [4, 20, 3], [1, 9, 9], [9, 1, 9]]
# What a MIN over each TP group gives (its ranks' elementwise minimum).
MINIMUM = [[4, 17, 3], [1, 1, 9]]


def _collective_library(backend: str, calls: list):
    """torch.distributed as a group of `backend` does it, over real gloo ranks.

    oneCCL is the boundary a CPU runner cannot have: for xccl an integer MIN or
    MAX is computed as a SUM, as it is on XPU; every other op is gloo's own."""
    real_all_reduce = dist.all_reduce
    real_all_gather = dist.all_gather

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append(("all_reduce", op))
        if (
            backend == "xccl"
            and op in INTEGER_MIN_MAX
            and not tensor.is_floating_point()
        ):
            op = dist.ReduceOp.SUM
        return real_all_reduce(tensor, op=op, group=group, async_op=async_op)

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        calls.append(("all_gather", None))
        return real_all_gather(tensor_list, tensor, group=group, async_op=async_op)

    return [
        mock.patch.object(dist, "get_backend", lambda group=None: backend),
        mock.patch.object(dist, "all_reduce", all_reduce),
        mock.patch.object(dist, "all_gather", all_gather),
    ]


def _rank(rank: int, init_file: str, backend: str, ids: list, results) -> None:
    """One TP rank: sync its sampled ids for a batch with a grammar."""
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=60),
        )
        calls: list = []
        patches = _collective_library(backend, calls)
        for patch in patches:
            patch.start()
        groups = [dist.new_group(ranks) for ranks in TP_GROUPS]
        own = groups[rank // 2]
        sampler = standin(Sampler, tp_sync_group=own)
        # A constrained request makes the sampler sync (xgrammar at TP > 1).
        batch = standin(SamplingBatchInfo, grammars=[object()])
        token_ids = torch.tensor(ids[rank], dtype=torch.int64)
        sampler._sync_token_ids_across_tp(token_ids, batch)
        for patch in patches:
            patch.stop()
        dist.destroy_process_group()
        results.put((rank, token_ids.tolist(), [name for name, _ in calls], None))
    except BaseException:
        results.put((rank, None, None, traceback.format_exc()))
    finally:
        # Flush the result before leaving without the parent's exit handlers.
        results.close()
        results.join_thread()
        os._exit(0)


# Gloo's TCP mesh between the ranks can fail to connect on a loaded machine (a
# rank's init_process_group: "connectFullMesh failed ... Connection closed by
# peer", seen once with two copies of this file running side by side). That is
# the transport, not the sync under test: the ranks start again on a fresh
# rendezvous, RENDEZVOUS_TRIES times in all. Any other failure fails the test.
RENDEZVOUS_TRIES = 3
MESH_FAILED = "connectFullMesh failed"


class _MeshFailed(AssertionError):
    pass


def _synced_once(backend: str, ids: list) -> dict:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        ranks = [
            context.Process(target=_rank, args=(r, init_file, backend, ids, results))
            for r in range(WORLD)
        ]
        for process in ranks:
            process.start()
        out = {}
        try:
            for _ in range(WORLD):
                rank, token_ids, calls, error = results.get(timeout=60)
                if error:
                    failed = _MeshFailed if MESH_FAILED in error else AssertionError
                    raise failed(f"rank {rank} failed:\n{error}")
                out[rank] = (token_ids, calls)
        finally:
            # A rank left waiting for a peer that failed is not waited out.
            for process in ranks:
                process.join(timeout=30 if len(out) == WORLD else 0)
                if process.is_alive():
                    process.kill()
                    process.join()
    return out


def synced(backend: str, ids: list) -> dict:
    """Each rank's ids after the sync, and the collectives it called."""
    for _ in range(RENDEZVOUS_TRIES - 1):
        try:
            return _synced_once(backend, ids)
        except _MeshFailed:
            continue
    return _synced_once(backend, ids)


class TestTokenSyncOnXccl(CustomTestCase):
    def test_ranks_that_agree_keep_their_ids(self):
        out = synced("xccl", AGREE)
        for rank in range(WORLD):
            self.assertEqual(out[rank][0], AGREE[rank], f"rank {rank}")

    def test_ranks_that_disagree_take_their_group_minimum_as_on_cuda(self):
        out = synced("xccl", DISAGREE)
        for rank in range(WORLD):
            self.assertEqual(out[rank][0], MINIMUM[rank // 2], f"rank {rank}")

    def test_no_integer_min_reaches_onccl(self):
        out = synced("xccl", AGREE)
        for rank in range(WORLD):
            self.assertNotIn("all_reduce", out[rank][1], f"rank {rank}")


class TestTokenSyncOnNccl(CustomTestCase):
    def test_cuda_keeps_its_all_reduce_min(self):
        out = synced("nccl", DISAGREE)
        for rank in range(WORLD):
            token_ids, calls = out[rank]
            self.assertEqual(token_ids, MINIMUM[rank // 2], f"rank {rank}")
            self.assertEqual(calls, ["all_reduce"], f"rank {rank}")


if __name__ == "__main__":
    unittest.main()
