"""bench_upstream --quick: it times the export whose recorded check was the
shortest, so that CI's smoke run of the benchmark stays cheap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_script

from xpu_series.upstream.record import FORMAT, RECORD

bench = load_script("bench_upstream.py")


def _record(root: Path, seconds: dict[str, float]) -> None:
    checks = {
        name: {"inputs": {}, "result": {"seconds": value}}
        for name, value in seconds.items()
    }
    (root / "patches").mkdir(parents=True)
    (root / "patches" / RECORD).write_text(
        json.dumps({"format": FORMAT, "checks": checks})
    )


def test_quick_takes_the_patch_whose_recorded_check_was_shortest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    _record(tmp_path, {"0003-a.patch": 16.3, "0005-b.patch": 3.2, "bundle x": 1.0})
    assert bench.quickest(["0003", "0005"]) == "0005"
    # A patch with no record is taken last; the only one left is still taken.
    assert bench.quickest(["0007", "0003"]) == "0003"
    assert bench.quickest(["0007"]) == "0007"


def test_without_a_record_quick_takes_the_first_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    assert bench.quickest(["0003", "0005"]) == "0003"
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / RECORD).write_text("not json")
    assert bench.quickest(["0003", "0005"]) == "0003"
