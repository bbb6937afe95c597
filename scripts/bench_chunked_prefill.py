"""Sweep --chunked-prefill-size with sglang's offline throughput benchmark.

Runs `python -m sglang.benchmark.offline_throughput` once per size (one engine at a
time, so one GPU is enough), reads the JSON line each run appends to
--result-filename, and prints: size, duration, input tok/s, and the change in input
throughput against chunking off (-1). Sanity line: the size equal to the input
length does no chunking, so it must be within 1% of off; if it is not, the numbers
are noise and the sweep should be repeated with more prompts.

    python scripts/bench_chunked_prefill.py --model Qwen/Qwen3-0.6B --device xpu \\
        --input-len 4096 --num-prompts 64

The random dataset draws its prompts' tokens from ShareGPT, which it downloads;
offline, pass a local ShareGPT-format json with --dataset-path.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

OFF = -1
SANITY_TOLERANCE = 0.01


@dataclass(frozen=True)
class SweepPoint:
    size: int
    duration_s: float
    input_tok_s: float


def parse_sizes(text: str, input_len: int) -> list[int]:
    """Sizes from a comma list; 'input' means the input length; off (-1) is added.

    >>> parse_sizes("512,1024,input", 4096)
    [512, 1024, 4096, -1]
    >>> parse_sizes("-1,256,256", 100)
    [256, -1]
    """
    sizes: list[int] = []
    for word in text.split(","):
        word = word.strip()
        size = input_len if word == "input" else int(word)
        if size != OFF and size not in sizes:
            sizes.append(size)
    return [*sizes, OFF]


def read_result(path: Path) -> SweepPoint:
    """The last JSON line offline_throughput appended: duration and input tok/s."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} has no result line")
    data = json.loads(lines[-1])
    return SweepPoint(0, float(data["total_latency"]), float(data["input_throughput"]))


def render(points: list[SweepPoint], input_len: int) -> str:
    """The sweep as a table, plus the sanity line.

    >>> pts = [SweepPoint(512, 10.0, 900.0), SweepPoint(4096, 8.05, 1001.0),
    ...        SweepPoint(-1, 8.0, 1000.0)]
    >>> print(render(pts, 4096))
    size    duration s  input tok/s  vs off
    512         10.000        900.0  -10.0%
    4096         8.050       1001.0   +0.1%
    off          8.000       1000.0       -
    sanity: size 4096 (= input length) is +0.1% vs off: within 1%
    """
    off = next(p for p in points if p.size == OFF)
    rows = ["size    duration s  input tok/s  vs off"]
    for p in points:
        label = "off" if p.size == OFF else str(p.size)
        change = (
            "-"
            if p.size == OFF
            else f"{(p.input_tok_s - off.input_tok_s) / off.input_tok_s:+.1%}"
        )
        # A space before each number: one too wide for its column (a 19x
        # change on a loaded machine) still parses as its own word.
        rows.append(
            f"{label:<6}{p.duration_s:>12.3f} {p.input_tok_s:>12.1f} {change:>7}"
        )
    same = next((p for p in points if p.size == input_len), None)
    if same is None:
        rows.append(f"sanity: no run at size {input_len} (= input length)")
    else:
        delta = (same.input_tok_s - off.input_tok_s) / off.input_tok_s
        verdict = "within 1%" if abs(delta) <= SANITY_TOLERANCE else "OUTSIDE 1%: noisy"
        rows.append(
            f"sanity: size {input_len} (= input length) is {delta:+.1%} vs off: "
            f"{verdict}"
        )
    return "\n".join(rows)


def bench_command(args: argparse.Namespace, size: int, result: Path) -> list[str]:
    return [
        sys.executable, "-m", "sglang.benchmark.offline_throughput",
        "--model-path", args.model, "--device", args.device,
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
        "--num-prompts", str(args.num_prompts), "--seed", str(args.seed),
        "--chunked-prefill-size", str(size), "--result-filename", str(result),
        *(["--dataset-path", str(args.dataset_path)] if args.dataset_path else []),
        *args.extra,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--device", default="xpu")
    parser.add_argument("--sizes", default="512,1024,2048,input")
    parser.add_argument("--input-len", type=int, default=4096)
    parser.add_argument("--output-len", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--dataset-path", help="local ShareGPT json for the prompts (else download)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the smallest run (what CI runs on the CPU stand-in, so the "
        "benchmark cannot rot): one engine, chunking off, 2 prompts of 96 tokens; "
        "the engine's flags and its result file are what can rot, and an engine "
        "start is half a minute of CPU there",
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- server args")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes, args.input_len)
    if args.quick:
        sizes, args.input_len, args.num_prompts = [OFF], 96, 2
    args.extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    points: list[SweepPoint] = []
    with tempfile.TemporaryDirectory(prefix="chunk-sweep-") as tmp:
        for size in sizes:
            result = Path(tmp) / f"size-{size}.jsonl"
            print(f"--- chunked-prefill-size {size}", flush=True)
            proc = subprocess.run(bench_command(args, size, result))
            if proc.returncode != 0:
                print(f"error: size {size} failed (exit {proc.returncode})")
                return 1
            point = read_result(result)
            points.append(SweepPoint(size, point.duration_s, point.input_tok_s))
    print(render(points, args.input_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
