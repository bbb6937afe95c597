"""Benchmark `xpu-series upstream PATCH --check` per carried patch, as CI runs it.

Per patch, medians of --runs:
  cold: no stored test outcomes (build/cache/upstream-check/ emptied first): two
        pytest runs of the exported tests, the collector and the lint hooks
  warm: the same command again (the outcomes of an unchanged tree are stored)
and then the whole list in one invocation, cold (`upstream PATCH... --check`,
what CI runs: one test interpreter shared by every patch), against the sum of
the per-patch cold medians.
Wall time and CPU time (the command and every child it waited for): on two shared
cores the CPU column is what the CI step costs.

Run: .venv/bin/python scripts/bench_upstream.py [PATCH ...] [--runs 3] [--tree DIR]
     --quick: one run of the patch whose recorded check was the shortest
              (patches/upstream-checks.json), so the benchmark cannot rot
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "xpu_series", "-C", str(ROOT)]
sys.path.insert(0, str(ROOT / "python"))

from xpu_series.errors import XpuSeriesError  # noqa: E402
from xpu_series.upstream.record import load_checks  # noqa: E402


def carried() -> list[str]:
    lines = (ROOT / "patches" / "series").read_text().splitlines()
    return [ln.strip()[:4] for ln in lines if ln.strip() and not ln.startswith("#")]


def quickest(patches: list[str]) -> str:
    """Of `patches` (numbers), the one whose recorded check took the least time:
    the record stands for most exports, so their outcomes are rarely stored and
    the quick run is a cold one."""
    try:
        checks = load_checks(ROOT / "patches") or {}
    except XpuSeriesError:
        checks = {}
    seconds = {
        name[:4]: float(kept.result.get("seconds", 1e9))
        for name, kept in checks.items()
    }
    return min(patches, key=lambda p: seconds.get(p, 1e9))


def timed(args: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the children, exit code) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode:
        print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
    return wall, cpu, done.returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("patches", nargs="*", help="default: every carried patch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", help="the series tree (default: build/sglang)")
    parser.add_argument("--quick", action="store_true", help="one warm run")
    args = parser.parse_args(argv)
    patches = args.patches or carried()
    tree = ["--tree", args.tree] if args.tree else []
    if args.quick:
        patch = quickest(patches)
        wall, cpu, code = timed([*CLI, "upstream", patch, "--check", *tree])
        print(f"{patch}: upstream --check in {wall:.1f} s ({cpu:.1f} s CPU)")
        return code
    rows = []
    failed = 0
    for patch in patches:
        cold: list[tuple[float, float]] = []
        warm: list[tuple[float, float]] = []
        for _ in range(args.runs):
            shutil.rmtree(ROOT / "build" / "cache" / "upstream-check", True)
            wall, cpu, code = timed([*CLI, "upstream", patch, "--check", *tree])
            cold.append((wall, cpu))
            failed += code != 0
            wall, cpu, code = timed([*CLI, "upstream", patch, "--check", *tree])
            warm.append((wall, cpu))
            failed += code != 0
        rows.append((patch, cold, warm))
        print(f"{patch}: cold {[f'{w:.0f}' for w, _c in cold]} s, "
              f"warm {[f'{w:.0f}' for w, _c in warm]} s", flush=True)  # fmt: skip
    print("\n| patch | cold wall | cold CPU | warm wall | warm CPU |")
    print("|---|---|---|---|---|")
    for patch, cold, warm in rows:
        walls_cpus = [*zip(*cold, strict=True), *zip(*warm, strict=True)]
        med = [statistics.median(v) for v in walls_cpus]
        print(f"| {patch} | {med[0]:.0f} s | {med[1]:.0f} s | {med[2]:.0f} s | "
              f"{med[3]:.0f} s |")  # fmt: skip
    walls = sum(statistics.median(w for w, _c in cold) for _p, cold, _w2 in rows)
    cpus = sum(statistics.median(c for _w, c in cold) for _p, cold, _w2 in rows)
    print(f"\none invocation per patch, cold: {walls:.0f} s wall, {cpus:.0f} s CPU")
    together: list[tuple[float, float]] = []
    for _ in range(args.runs):
        shutil.rmtree(ROOT / "build" / "cache" / "upstream-check", True)
        wall, cpu, code = timed([*CLI, "upstream", *patches, "--check", *tree])
        together.append((wall, cpu))
        failed += code != 0
    wall = statistics.median(w for w, _c in together)
    cpu = statistics.median(c for _w, c in together)
    ratio = f"x{walls / wall:.1f} wall, x{cpus / cpu:.1f} CPU"
    print(f"one invocation for all {len(rows)}, cold: {wall:.0f} s wall, "
          f"{cpu:.0f} s CPU ({ratio})")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
