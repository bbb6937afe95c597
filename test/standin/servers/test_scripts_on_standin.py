"""The measurement and serving scripts against real SGLang servers on the CPU
stand-in: xpu-verify must call a random-weight model's answer garbage, the GSM8K
A/B must find chunked and unchunked greedy generations identical, and the
chunked-prefill sweep must run sglang's offline benchmark and print its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cpu_standin
from standin_servers import CHUNK

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"


def _env() -> dict[str, str]:
    return {**os.environ, **cpu_standin.ENVIRONMENT}


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout,
        env=_env(), cwd=ROOT,
    )  # fmt: skip


def test_xpu_verify_calls_the_random_model_garbage(servers) -> None:
    port = servers["on"].rsplit(":", 1)[1]
    proc = _run(str(SCRIPTS / "xpu-verify"), "--port", port, "--timeout", "120")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "READY" in proc.stdout
    assert "GARBAGE:" in proc.stdout, proc.stdout
    assert "SMOKE TEST PASS" not in proc.stdout


def _questions(path: Path, count: int) -> Path:
    """GSM8K-shaped questions of our own (the data set cannot be downloaded here)."""
    rows = []
    for i in range(count):
        a, b = 3 + i, 7 + 2 * i
        rows.append({
            "question": f"Natalia had {a} clips and bought {b} more in April. "
                        "How many clips does she have now?",
            "answer": f"She has {a} + {b} = {a + b} clips.\n#### {a + b}",
        })  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_ab_finds_chunked_and_unchunked_generations_identical(
    servers, tmp_path: Path
) -> None:
    data = _questions(tmp_path / "questions.jsonl", 10)
    proc = _run(
        str(SCRIPTS / "gsm8k_chunked_ab.py"), "--url-on", servers["on"],
        "--url-off", servers["off"], "--data", str(data), "--num-shots", "2",
        "--num-questions", "8", "--max-tokens", "24", "--chunk", str(CHUNK),
        "--compare-tokens",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same generations: all 8 answers identical" in proc.stdout
    # Every prompt crossed a chunk boundary, so the chunked path really ran.
    assert "crossed a chunk       8 of 8" in proc.stdout, proc.stdout


def test_bench_chunked_prefill_runs_the_offline_benchmark(tmp_path: Path) -> None:
    conversations = [
        {"conversations": [
            {"from": "human", "value": "The quick brown fox jumps over the dog. " * 6},
            {"from": "gpt", "value": "Intel GPUs serve language models. " * 4},
        ]}
        for _ in range(8)
    ]  # fmt: skip
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text(json.dumps(conversations))
    proc = _run(
        str(SCRIPTS / "bench_chunked_prefill.py"), "--model",
        str(cpu_standin.model_dir()), "--device", "cpu", "--quick",
        "--dataset-path", str(dataset),
        "--", *cpu_standin.launch_args()[2:],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # One engine, chunking off: its flags and its result line still work.
    assert proc.stdout.count("--- chunked-prefill-size") == 1, proc.stdout
    table = proc.stdout[proc.stdout.index("size    duration s") :]
    rows = table.splitlines()
    assert rows[1].split()[0] == "off" and float(rows[1].split()[2]) > 0, table
    assert rows[2] == "sanity: no run at size 96 (= input length)", table
