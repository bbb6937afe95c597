"""Chunked prefill on one Intel GPU: how many chunks a prompt takes, at and around
chunk boundaries, and with several requests interleaved."""

import math
import unittest

from sglang.test.scripted_runtime_chunked_helpers import run_until_all_finished
from xpu_common import (
    CHUNK_SIZE,
    SharedServerTestCase,
    boundary_prompt_lens,
    drain_until_released,
    expected_chunks,
    skip_reason,
    xpu_engine_kwargs,
)

SKIP = skip_reason()


@unittest.skipIf(SKIP, SKIP or "")
class TestXpuChunkCounts(SharedServerTestCase):
    ENGINE_KWARGS = xpu_engine_kwargs()

    @staticmethod
    def _script_chunks(t, prompt_len, prompt_token):
        # A fresh prompt token per case: a radix hit would shorten the prefill.
        t.flush_cache()
        yield
        handle = t.start_req(
            prompt_len=prompt_len, max_new_tokens=2, prompt_token=prompt_token
        )
        yield from run_until_all_finished([handle])
        got, want = handle.chunks_done, expected_chunks(prompt_len, CHUNK_SIZE)
        assert got == want, f"prompt {prompt_len}: {got} chunks, expected {want}"
        yield from drain_until_released(t, handle)

    def test_long_prompt_takes_ceil_prompt_over_chunk(self):
        # 1000 tokens in chunks of 256: 4 chunked-prefill batches.
        self.server.execute_script(self._script_chunks, args=(1000, 11))

    def test_prompt_that_fits_takes_no_extra_chunk(self):
        self.server.execute_script(self._script_chunks, args=(CHUNK_SIZE // 2, 12))

    def test_chunk_boundaries(self):
        for index, prompt_len in enumerate(boundary_prompt_lens(CHUNK_SIZE)):
            with self.subTest(prompt_len=prompt_len):
                self.server.execute_script(
                    self._script_chunks, args=(prompt_len, 100 + index)
                )


@unittest.skipIf(SKIP, SKIP or "")
class TestXpuInterleavedRequests(SharedServerTestCase):
    ENGINE_KWARGS = xpu_engine_kwargs()

    @staticmethod
    def _script_interleaved(t):
        t.flush_cache()
        yield
        lens = (3 * CHUNK_SIZE + 5, CHUNK_SIZE - 1, 2 * CHUNK_SIZE)
        handles = [
            t.start_req(prompt_len=n, max_new_tokens=4, prompt_token=200 + i)
            for i, n in enumerate(lens)
        ]
        for _ in range(400):
            chunking = [h.rid for h in handles if h.is_chunking]
            # The scheduler holds at most one chunked request at a time.
            assert len(chunking) <= 1, f"two requests chunking at once: {chunking}"
            if all(h.finished for h in handles):
                break
            yield
        else:
            raise AssertionError("interleaved requests did not all finish")
        for handle, n in zip(handles, lens, strict=True):
            # The chunk budget is per batch and shared: a request admitted while
            # another finishes chunking gets what is left of that batch, so its
            # first piece may be short. That can add one chunk to what it takes
            # alone (a 255-token prompt may take 2), never more, since the
            # request being chunked then gets whole batches.
            alone = expected_chunks(n, CHUNK_SIZE)
            most = math.ceil(n / CHUNK_SIZE) + 1
            got = handle.chunks_done
            assert got == alone or (alone <= got <= most and got >= 2), (
                f"prompt {n}: {got} chunks, expected {alone} alone or at most "
                f"{most} interleaved"
            )
        yield from drain_until_released(t, *handles)

    def test_three_requests_interleave_and_each_chunks_correctly(self):
        self.server.execute_script(self._script_interleaved)


if __name__ == "__main__":
    unittest.main()
