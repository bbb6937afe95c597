"""CPU tests of the chunked-prefill measurement scripts and of the manual suite's
device-free helpers (hand-computed values; no GPU, no server)."""

from __future__ import annotations

import doctest
import io
import json
import math
import sys
import time
import unittest
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SCRIPTS, load_script

sys.path.insert(0, str(SCRIPTS.parent / "test" / "manual" / "chunked_prefill"))
import xpu_common  # noqa: E402

bench = load_script("bench_chunked_prefill.py")
ab = load_script("gsm8k_chunked_ab.py")


@pytest.mark.parametrize("module", [bench, ab, xpu_common])
def test_doctests(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted >= 2 and result.failed == 0


def test_paired_stats_hand_computed() -> None:
    # 4 questions: on = 1,1,0,1; off = 1,0,0,0 -> d = 0,1,0,1, mean 0.5,
    # s^2 = (4 * 0.25) / 3 = 1/3, SE = sqrt(1/12) = 0.288675, z = 1.732051.
    r = ab.paired_stats([True, True, False, True], [True, False, False, False])
    assert (r.acc_on, r.acc_off, r.diff) == (0.75, 0.25, 0.5)
    assert r.se_diff == pytest.approx(math.sqrt(1 / 12))
    assert r.sigmas == pytest.approx(math.sqrt(3))
    assert (r.on_only, r.off_only) == (2, 0)


def test_identical_answers_have_zero_difference_and_zero_sigma() -> None:
    r = ab.paired_stats([True, False, True], [True, False, True])
    assert (r.diff, r.se_diff, r.sigmas) == (0.0, 0.0, 0.0)


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="same, non-zero number"):
        ab.paired_stats([True], [True, False])


def test_strong_probe_has_no_warning() -> None:
    r = ab.paired_stats([True] * 40, [True] * 39 + [False])
    text = ab.render(r, 256, 30)
    assert "weak probe" not in text
    assert "crossed a chunk       30 of 40 prompts longer than 256 tokens" in text


def test_build_prompts_uses_shots_as_prefix_and_labels_from_answers() -> None:
    rows = [
        {"question": f"q{i}", "answer": f"work {i}\n#### {i},000"} for i in range(5)
    ]
    prompts = ab.build_prompts(rows, shots=2, n=2)
    assert [label for _, label in prompts] == ["2000", "3000"]
    assert prompts[0][0].startswith("Question: q0\nAnswer: work 0")
    assert prompts[0][0].endswith("Question: q2\nAnswer:")


def test_bench_reads_the_last_result_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rows = [
        {"total_latency": 9.0, "input_throughput": 100.0},
        {"total_latency": 12.5, "input_throughput": 5242.88, "backend": "engine"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    point = bench.read_result(path)
    assert (point.duration_s, point.input_tok_s) == (12.5, 5242.88)


def test_bench_flags_a_noisy_sweep() -> None:
    points = [bench.SweepPoint(4096, 8.0, 980.0), bench.SweepPoint(-1, 8.0, 1000.0)]
    assert "-2.0% vs off: OUTSIDE 1%: noisy" in bench.render(points, 4096)


def test_bench_columns_stay_apart_when_a_number_is_wider_than_its_column() -> None:
    # A loaded machine: one run 19x faster than the other, in 7 digits.
    points = [bench.SweepPoint(96, 0.001, 17357.8), bench.SweepPoint(-1, 1.0, 881.3)]
    row = bench.render(points, 96).splitlines()[1]
    assert row.split() == ["96", "0.001", "17357.8", "+1869.6%"]


def test_bench_command_passes_the_size_and_result_file(tmp_path: Path) -> None:
    args = SimpleNamespace(
        model="m", device="xpu", input_len=4096, output_len=1, num_prompts=8,
        seed=1, extra=["--page-size", "64"], dataset_path=None,
    )  # fmt: skip
    cmd = bench.bench_command(args, 512, tmp_path / "x.jsonl")
    assert cmd[1:3] == ["-m", "sglang.benchmark.offline_throughput"]
    assert cmd[cmd.index("--chunked-prefill-size") + 1] == "512"
    assert cmd[cmd.index("--result-filename") + 1] == str(tmp_path / "x.jsonl")
    assert cmd[-2:] == ["--page-size", "64"]


class _Handle:
    """A request handle whose resources come back after `release_after` reads."""

    def __init__(self, rid: str, release_after: int) -> None:
        self.rid, self.reads, self.release_after = rid, 0, release_after
        self.req = None

    @property
    def kv_pages(self) -> int:
        self.reads += 1
        return 0 if self.reads > self.release_after else 3

    @property
    def lock_refs(self) -> int:
        return 0 if self.reads > self.release_after else 1


def test_drain_waits_for_release_then_settles(monkeypatch) -> None:
    handle = _Handle("a", release_after=5)
    monkeypatch.setattr(xpu_common, "RID_RELEASE_SETTLE_S", 0.0)
    steps = sum(1 for _ in xpu_common.drain_until_released(None, handle))
    # 5 steps until the pages are back, then the settle steps for the tokenizer.
    assert steps == 5 + xpu_common.RID_RELEASE_SETTLE_STEPS
    # And the settle time at least: it keeps stepping until that has passed.
    monkeypatch.setattr(xpu_common, "RID_RELEASE_SETTLE_S", 0.3)
    handle = _Handle("b", release_after=5)
    start = time.monotonic()
    steps = sum(1 for _ in xpu_common.drain_until_released(None, handle))
    assert time.monotonic() - start >= 0.3
    assert steps > 5 + xpu_common.RID_RELEASE_SETTLE_STEPS


def test_drain_reports_a_leak_by_name() -> None:
    leaking = _Handle("leaky-rid", release_after=10**9)
    with pytest.raises(AssertionError, match=r"leaky-rid: kv_pages=3 lock_refs=1"):
        for _ in xpu_common.drain_until_released(None, leaking, max_steps=7):
            pass


def test_held_pool_row_is_not_released() -> None:
    handle = _Handle("row", release_after=0)
    handle.req = SimpleNamespace(req_pool_idx=4)
    assert not xpu_common.released(handle)
    handle.req = SimpleNamespace(req_pool_idx=None)
    assert xpu_common.released(handle)


def test_missing_model_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    reason = xpu_common.model_missing("nobody/no-such-model")
    assert "nobody/no-such-model is not in the Hugging Face cache" in reason
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert xpu_common.model_missing(str(tmp_path / "m")) is None


class _FakeServer:
    """Where a ScriptedHttpServer process would be: records its shutdown."""

    def __init__(self, kwargs: dict, log: list, error: str | None = None) -> None:
        self.kwargs, self.log, self.error = kwargs, log, error
        log.append(("start", kwargs["name"]))

    def shutdown(self) -> None:
        self.log.append(("stop", self.kwargs["name"]))
        if self.error:
            raise AssertionError(self.error)


class _Scripted(unittest.TestCase):
    """Where sglang's ScriptedTestCase would be: it starts a server per class."""

    @classmethod
    def setUpClass(cls) -> None:
        raise AssertionError("a server of its own for every class")

    @classmethod
    def tearDownClass(cls) -> None:
        raise AssertionError("a shutdown for every class")


def _run_classes(*classes: type) -> unittest.TestResult:
    suite = unittest.TestSuite(
        unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes
    )
    return unittest.TextTestRunner(stream=io.StringIO()).run(suite)


def _case(name: str, kwargs: dict, seen: list, shared: type) -> type:
    def test_server(self) -> None:
        seen.append((name, id(self.server)))

    return type(name, (shared,), {"ENGINE_KWARGS": kwargs, "test_server": test_server})


def test_classes_of_the_same_kwargs_share_one_server_one_at_a_time(
    monkeypatch,
) -> None:
    log: list = []
    seen: list = []
    monkeypatch.setattr(xpu_common, "_SHARED", {})
    shared = xpu_common.shared_server_case(_Scripted, lambda **kw: _FakeServer(kw, log))
    a, b = {"name": "a", "chunk": 256}, {"name": "b", "chunk": 256}
    result = _run_classes(
        _case("One", dict(a), seen, shared),
        _case("Two", dict(a), seen, shared),
        _case("Three", b, seen, shared),
    )
    assert result.wasSuccessful(), result.errors + result.failures
    # One and Two got the same server; Three's start stopped it first.
    assert seen[0][1] == seen[1][1] != seen[2][1]
    assert log == [("start", "a"), ("stop", "a"), ("start", "b")]
    xpu_common.stop_shared_servers()
    assert log[-1] == ("stop", "b") and xpu_common._SHARED == {}


def test_a_shutdown_error_is_raised_after_every_server_stopped(monkeypatch) -> None:
    log: list = []
    monkeypatch.setattr(xpu_common, "_SHARED", {
        "x": _FakeServer({"name": "x"}, log, error="scheduler crashed"),
        "y": _FakeServer({"name": "y"}, log),
    })  # fmt: skip
    with pytest.raises(AssertionError, match="scheduler crashed"):
        xpu_common.stop_shared_servers()
    assert {entry for entry in log if entry[0] == "stop"} == {
        ("stop", "x"),
        ("stop", "y"),
    }
    assert xpu_common._SHARED == {}
