"""Benchmark `xpu-series apply` on the real pin against doing the same by hand.

Measures, alternating and side by side in one run (medians of --runs):
  (a) warm apply: cached wheel and cached base, re-applying into an existing tree
  (a') warm apply into a new tree (cached wheel, cached base)
  (b) cold-base apply: cached wheel, no cached base, new tree
  (c) the naive baseline: unzip the wheel, git init/add/commit, git am the patches
Goals: (a) <= 0.25 x (c), (b) <= 1.1 x (c).

Run: .venv/bin/python scripts/bench_apply.py [--runs 5]
     --quick: one run of each case (what CI runs, so the benchmark cannot rot);
              (b) shares the compiled bytecode of the real cache; no goal is judged
"""

from __future__ import annotations

import argparse
import json
import os
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
GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def run(args: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
    subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **GIT_ENV, **(env or {})},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def series_files() -> list[str]:
    lines = (ROOT / "patches" / "series").read_text().splitlines()
    names = [line.split()[0] for line in lines if line.strip() and line[0] != "#"]
    return [str(ROOT / "patches" / name) for name in names]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one run of each case")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1

    # Make sure the wheel is cached (and its hash checked); the cache is
    # content-addressed (wheels/<sha256>/<name>), so ask fetch where it is.
    fetched = subprocess.run(
        [*CLI, "fetch", "--json"], capture_output=True, text=True, check=True
    )
    wheel = Path(json.loads(fetched.stdout)["path"])
    patches = series_files()
    scratch = Path(tempfile.mkdtemp(prefix="bench-apply-", dir=ROOT / "build"))
    # A project of its own (the series, its own build/), on the checkout's cache:
    # an apply keeps its state in the project's build/operation/ while it runs,
    # and the checkout's commands (refresh --check beside it in CI) must not
    # find one there.
    project = scratch / "project"
    shutil.copytree(ROOT / "patches", project / "patches")
    tool = [sys.executable, "-m", "xpu_series", "-C", str(project)]
    shared = {"XPU_SERIES_CACHE": str(ROOT / "build" / "cache")}
    warm_tree = scratch / "warm"
    if args.quick:
        # One run: (a') makes the tree that (a) then re-applies into, so the
        # tree is not built a time more only to prime it.
        warm_tree = scratch / "warm-new"
    else:
        # Prime the base and tree.
        run([*tool, "apply", "--tree", str(warm_tree)], env=shared)

    def warm() -> None:
        run([*tool, "apply", "--tree", str(warm_tree)], env=shared)

    def warm_new_tree() -> None:
        tree = scratch / "warm-new"
        shutil.rmtree(tree, ignore_errors=True)
        run([*tool, "apply", "--tree", str(tree)], env=shared)

    def cold_base() -> None:
        cache = scratch / "cold-cache"
        shutil.rmtree(cache, ignore_errors=True)
        (cache / "wheels" / wheel.parent.name).mkdir(parents=True)
        os.link(wheel, cache / "wheels" / wheel.parent.name / wheel.name)
        compiled = wheel.parents[2] / "bytecode"
        if args.quick and compiled.is_dir():
            # Only shows the case still runs: the compiled bytecode is shared
            # (compiling ~4700 modules again is half of a cold base's CPU).
            (cache / "bytecode").symlink_to(compiled)
        tree = scratch / "cold"
        shutil.rmtree(tree, ignore_errors=True)
        run([*tool, "apply", "--tree", str(tree)], env={"XPU_SERIES_CACHE": str(cache)})

    def naive() -> None:
        tree = scratch / "naive"
        shutil.rmtree(tree, ignore_errors=True)
        (tree / "python").mkdir(parents=True)
        run(["unzip", "-q", str(wheel), "sglang/*", "-d", str(tree / "python")])
        # No automatic gc: with ~5500 loose objects, a commit or am now and then
        # starts one in the background (8 s of CPU, measured in CI), untimed
        # here but paid by whatever runs beside.
        git = ["git", "-c", "gc.auto=0"]
        run([*git, "init", "-q"], cwd=tree)
        run([*git, "add", "-A"], cwd=tree)
        run([*git, "commit", "-q", "-m", "upstream"], cwd=tree)
        run([*git, "am", "-q", "-3", "-k", *patches], cwd=tree)

    cases: dict[str, Callable[[], None]] = {
        "(a) warm, existing tree": warm,
        "(a') warm, new tree": warm_new_tree,
        "(b) cold base": cold_base,
        "(c) naive baseline": naive,
    }
    if args.quick:
        order = ["(a') warm, new tree", "(a) warm, existing tree"]
        cases = {name: cases[name] for name in [*order, *cases]}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, fn in cases.items():  # alternate so drift hits every case alike
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    shutil.rmtree(scratch, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["(c) naive baseline"]
    print(f"sglang wheel {wheel.name}, {len(patches)} patches, {args.runs} runs each")
    print(f"{'case':<26}{'median s':>10}{'vs (c)':>9}")
    for name, value in medians.items():
        print(f"{name:<26}{value:>10.3f}{value / base:>8.2f}x")
    a, b = medians["(a) warm, existing tree"] / base, medians["(b) cold base"] / base
    if args.quick:
        # One run, and (b) not cold: its ratios are no verdict either way.
        print(
            "quick: (b) shared the compiled bytecode; no goal is judged on one run; "
            "run without --quick for them"
        )
        return 0
    print(f"goal (a) <= 0.25x: {'met' if a <= 0.25 else 'MISSED'} ({a:.2f}x)")
    print(f"goal (b) <= 1.10x: {'met' if b <= 1.10 else 'MISSED'} ({b:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
