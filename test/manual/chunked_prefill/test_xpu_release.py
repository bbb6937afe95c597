"""After finish and after abort, a request's KV pages, lock refs and pool row all
come back; a repeat abort is a no-op; a rid is reused only once its release has
reached the tokenizer process."""

import unittest

from sglang.test.scripted_runtime_chunked_helpers import (
    advance_to_nth_chunk,
    run_until_finished,
)
from xpu_common import (
    CHUNK_SIZE,
    RID_RELEASE_SETTLE_STEPS,
    SharedServerTestCase,
    drain_until_released,
    skip_reason,
    wait_for_free_counts,
    xpu_engine_kwargs,
)

SKIP = skip_reason()
POOLS = ("kv_pool_free", "req_pool_free")


def _baseline(t):
    """Free counts of an idle engine with an empty radix cache."""
    t.flush_cache()
    for _ in range(RID_RELEASE_SETTLE_STEPS):
        yield
    return t.engine_stats()


def _assert_pools_back(t, before):
    # Finished requests leave their prefix in the radix cache; flush it so the
    # comparison is exact (==), not "at least".
    t.flush_cache()
    yield from wait_for_free_counts(t, before)
    after = t.engine_stats()
    for key in POOLS:
        assert after[key] == before[key], f"{key}: {before[key]} -> {after[key]}"


@unittest.skipIf(SKIP, SKIP or "")
class TestXpuReleaseAfterFinishAndAbort(SharedServerTestCase):
    ENGINE_KWARGS = xpu_engine_kwargs()

    @staticmethod
    def _script_finish(t):
        before = yield from _baseline(t)
        handle = t.start_req(
            prompt_len=3 * CHUNK_SIZE, max_new_tokens=4, prompt_token=31
        )
        yield from run_until_finished(handle)
        yield from drain_until_released(t, handle)
        yield from _assert_pools_back(t, before)

    @staticmethod
    def _script_abort_mid_chunk(t):
        before = yield from _baseline(t)
        handle = t.start_req(
            prompt_len=4 * CHUNK_SIZE, max_new_tokens=4, prompt_token=32
        )
        yield from advance_to_nth_chunk(handle, 2)
        t.abort(handle)
        yield from drain_until_released(t, handle)
        yield from _assert_pools_back(t, before)

    @staticmethod
    def _script_repeat_abort(t):
        before = yield from _baseline(t)
        handle = t.start_req(
            prompt_len=2 * CHUNK_SIZE, max_new_tokens=64, prompt_token=33
        )
        yield from advance_to_nth_chunk(handle, 1)
        t.abort(handle)
        yield from drain_until_released(t, handle)
        stats = t.engine_stats()
        # The tokenizer has forgotten the rid, so a second abort never reaches
        # the scheduler: do not await its arrival (that would wait out the
        # timeout), assert that it changed nothing instead.
        t.abort(handle, await_arrival=False)
        for _ in range(RID_RELEASE_SETTLE_STEPS):
            yield
        assert t.engine_stats() == stats, "a repeat abort changed the pools"
        assert handle.finished and handle.kv_pages == 0 and handle.lock_refs == 0
        yield from _assert_pools_back(t, before)

    @staticmethod
    def _script_reuse_rid(t):
        before = yield from _baseline(t)
        rid = "xpu-reused-rid"
        first = t.start_req(
            prompt_len=2 * CHUNK_SIZE, max_new_tokens=64, prompt_token=34, rid=rid
        )
        yield from advance_to_nth_chunk(first, 1)
        t.abort(first)
        # drain_until_released also waits RID_RELEASE_SETTLE_STEPS so the release
        # has crossed to the tokenizer before the rid is used again.
        yield from drain_until_released(t, first)
        second = t.start_req(
            prompt_len=CHUNK_SIZE // 2, max_new_tokens=4, prompt_token=35, rid=rid
        )
        yield from run_until_finished(second)
        yield from drain_until_released(t, second)
        yield from _assert_pools_back(t, before)

    def test_finish_returns_every_page_and_row(self):
        self.server.execute_script(self._script_finish)

    def test_abort_mid_chunk_returns_every_page_and_row(self):
        self.server.execute_script(self._script_abort_mid_chunk)

    def test_repeat_abort_is_a_no_op(self):
        self.server.execute_script(self._script_repeat_abort)

    def test_rid_is_reused_only_after_release_crossed_processes(self):
        self.server.execute_script(self._script_reuse_rid)


if __name__ == "__main__":
    unittest.main()
