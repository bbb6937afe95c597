"""Benchmark the static part of `xpu-series audit` on a real release.

Measures, side by side in one run (medians of --runs):
  (a) cold: an empty audit cache (every file parsed and scanned, all kinds)
  (b) warm: the same tree again (its placed findings come from the cache)
  (c) the release as shipped, after (a): only the files the series changes are
      scanned again, the rest are the same blobs (`audit --pristine`)
  (d) baseline: parsing every file with ast.parse, nothing else (one process)
Goals: (a) <= 15 s on this 2-core machine, (b) < 2 s.
Each case runs `xpu-series audit --json` in a new process, as a user would. Wall
time depends on what else the machine runs; the CPU seconds (user + system of the
process and its workers) do not, so both are printed.

Run: .venv/bin/python scripts/bench_audit.py [--runs 3] [--tree DIR]
     --quick: one run of (a) and (b) on the project's own audit cache (what CI
              runs, so the benchmark cannot rot): (a) is cold only if nothing
              audited the tree before, and the audit step's cold audit is not
              paid twice; no goal is judged
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "xpu_series", "-C", str(ROOT)]


def audit(tree: Path, cache: Path, *extra: str) -> None:
    result = subprocess.run(
        [*CLI, "audit", "--tree", str(tree), "--json", *extra],
        env={**os.environ, "XPU_SERIES_CACHE": str(cache)},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, 1):
        raise SystemExit(f"audit failed ({result.returncode}): {result.stderr}")


def parse_only(tree: Path) -> None:
    for path in sorted((tree / "python" / "sglang").rglob("*.py")):
        ast.parse(path.read_bytes())


def cpu_seconds() -> float:
    """User + system time of this process and the children it waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=ROOT / "build" / "sglang")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one run of (a) and (b) on the project's audit cache, no goal judged",
    )
    args = parser.parse_args()
    if not (args.tree / "python" / "sglang").is_dir():
        print(f"error: {args.tree} is not an sglang tree", file=sys.stderr)
        print("hint: run scripts/bootstrap first", file=sys.stderr)
        return 2
    runs = 1 if args.quick else args.runs
    scratch = Path(tempfile.mkdtemp(prefix="bench-audit-", dir=ROOT / "build"))
    # The real cache's wheels and bases are reused; only the audit's part is new.
    real = ROOT / "build" / "cache"
    cold_cache = scratch / "cache"

    def fresh_cache() -> None:
        shutil.rmtree(cold_cache, ignore_errors=True)
        cold_cache.mkdir(parents=True)
        for part in ("wheels", "bases"):
            if (real / part).exists():
                (cold_cache / part).symlink_to(real / part)

    # Quick: the project's cache, which the audit step fills too (one cold
    # audit of the tree per run, not two).
    cache = real if args.quick else cold_cache
    first = "(a) first, shared" if args.quick else "(a) cold"
    cases: dict[str, Callable[[], None]] = {
        first: lambda: audit(args.tree, cache),
        "(b) warm": lambda: audit(args.tree, cache),
    }
    if not args.quick:
        cases["(c) shipped, after"] = lambda: audit(args.tree, cold_cache, "--pristine")
        cases["(d) ast.parse only"] = lambda: parse_only(args.tree)
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for _ in range(runs):
            if not args.quick:
                fresh_cache()
            for name, fn in cases.items():  # cold first, then warm on its cache
                start, used = time.perf_counter(), cpu_seconds()
                fn()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_seconds() - used)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(v) for name, v in times.items()}
    files = sum(1 for _ in (args.tree / "python" / "sglang").rglob("*.py"))
    load = os.getloadavg()[0]
    print(
        f"audit of {args.tree} ({files} files), {runs} run(s), {os.cpu_count()} cpus, "
        f"load {load:.1f}"
    )
    print(f"{'case':<22}{'median s':>10}{'cpu s':>8}")
    for name, value in medians.items():
        print(f"{name:<22}{value:>10.2f}{statistics.median(cpu[name]):>8.2f}")
    if args.quick:
        print(
            "quick: (a) used the project's audit cache, so it is cold only if "
            "nothing audited this tree before; run without --quick for the goals"
        )
        return 0
    cold, warm = medians["(a) cold"], medians["(b) warm"]
    print(f"goals: cold <= 15 s: {'met' if cold <= 15 else 'MISSED'}; "
          f"warm < 2 s: {'met' if warm < 2 else 'MISSED'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
