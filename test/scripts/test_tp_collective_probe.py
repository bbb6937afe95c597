"""scripts/tp_collective_probe.py with 2 gloo ranks on CPU."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import SCRIPTS


def probe(*args: str, env: dict | None = None) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "tp_collective_probe.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def test_two_gloo_ranks_pass() -> None:
    env = {"PATH": "/usr/bin:/bin", "FI_TCP_IFACE": "lo"}
    code, out, _ = probe("--nproc", "2", "--backend", "gloo", "--timeout", "60",
                         env=env)  # fmt: skip
    assert code == 0, out
    assert "rank 0: PASS" in out and "rank 1: PASS" in out
    assert "= 2" in out, "the all-reduce summed both ranks"
    assert "'FI_TCP_IFACE': 'lo'" in out


def test_a_rank_that_never_joins_is_a_hang_within_the_timeout() -> None:
    code, out, elapsed = probe(
        "--nproc", "2", "--backend", "gloo", "--timeout", "8", "--skip-rank", "1"
    )
    assert code == 1
    assert "rank 0: HANG" in out and "rank 1: HANG" in out
    assert "never joined" in out and "FI_TCP_IFACE=lo" in out
    assert elapsed < 30
