"""audit on real sglang releases: it finds the bugs the series already knows.

Runs where the wheels are in the project's cache (CI's audit step fetches them);
skips with the reason where they are not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpu_series.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = "python/sglang/srt/managers/scheduler.py"
RECLAIM = {"torch.cuda.memory_reserved", "torch.cuda.empty_cache"}


def cached(version: str) -> bool:
    wheels = ROOT / "build" / "cache" / "wheels"
    return any(wheels.glob(f"*/sglang-{version}-*.whl"))


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    capsys.readouterr()
    code = main(["-C", str(ROOT), "audit", "--json", *args])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return json.loads(out)["findings"]


def reclaim(findings: list[dict]) -> list[tuple[str, str, bool]]:
    return [
        (f["api"], f["verdict"], f["patched"])
        for f in findings
        if f["file"] == SCHEDULER
        and f["function"] == "Scheduler.continue_generation"
        and f["api"] in RECLAIM
    ]


@pytest.mark.skipif(
    not cached("0.5.19"),
    reason="the sglang 0.5.19 wheel is not in build/cache (xpu-series fetch "
    "--upstream 0.5.19 brings it)",
)
def test_pristine_0_5_19_has_the_reclaim_and_the_host_pool_movers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Untriaged: patches/audit.toml speaks for the pin's files, not 0.5.19's.
    empty = tmp_path / "audit.toml"
    empty.write_text("")
    findings = audit(
        capsys, "--upstream", "0.5.19", "--pristine", "--triage", str(empty)
    )
    # Exposed in upstream's code; the series (0003) fixes them.
    assert sorted(set(reclaim(findings))) == [
        ("torch.cuda.empty_cache", "exposed", True),
        ("torch.cuda.memory_reserved", "exposed", True),
    ]
    movers = [
        f
        for f in findings
        if f["file"] == "python/sglang/srt/mem_cache/memory_pool_host.py"
        and f["kind"] == "guarded-import"
        and f["verdict"] == "exposed"
    ]
    assert movers, "the kvcacheio movers imported under a CUDA/ROCm guard"
    assert {f["effect"] for f in movers} == {"raises"}
    assert any("transfer_kv" in f["api"] for f in movers)


@pytest.mark.skipif(
    not (ROOT / "build" / "sglang" / ".git").exists(),
    reason="no build/sglang tree (scripts/bootstrap builds it)",
)
def test_pin_pristine_has_the_reclaim_and_the_series_removes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pristine = audit(capsys, "--pristine")
    # Exposed in the release as shipped, and the series fixes them.
    assert sorted(set(reclaim(pristine))) == [
        ("torch.cuda.empty_cache", "exposed", True),
        ("torch.cuda.memory_reserved", "exposed", True),
    ]
    patched = audit(capsys)
    # On the tree with the series they are gone; the report lists them as
    # patched at their pristine place.
    assert {v for _, v, _ in reclaim(patched)} == {"patched"}
    live = [f for f in patched if f["file"] == SCHEDULER and f["verdict"] != "patched"]
    assert not [f for f in live if f["function"] == "Scheduler.continue_generation"]
