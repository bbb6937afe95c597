#!/usr/bin/env python3
"""Benchmark the README's test command: `CI=true bash .ci/run` in a clean clone of
HEAD (cold: no .venv, no build/), then again in the same clone (warm: nothing
changed), and report each step's time from build/reports/steps.json.

    python3 scripts/bench_ci.py                # one clean clone: cold, then warm
    python3 scripts/bench_ci.py --runs 2       # medians of two clean clones
    python3 scripts/bench_ci.py --quick        # the last run's steps, no new run
    python3 scripts/bench_ci.py --quick-all    # every bench_*.py in quick mode

--quick reads build/reports/steps.json (what scripts/test writes as it goes) and
prints the same table; --quick-all is what CI runs so no benchmark rots: the
quick mode of bench_apply, bench_matrix, bench_rebase, bench_audit and
bench_upstream, then --quick.
bench_chunked_prefill needs a server: its quick mode runs in test/standin.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = Path("build") / "reports" / "steps.json"
QUICK = (
    "bench_apply.py",
    "bench_matrix.py",
    "bench_rebase.py",
    "bench_audit.py",
    "bench_upstream.py",
)


def load_steps(path: Path, field: str = "seconds") -> dict[str, float]:
    """Seconds per step tag of one run (`field`: wall "seconds" or "cpu_s"); a
    failed step is an error, not a time."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: cannot read {path}: {exc}") from None
    failed = [s["tag"] for s in data["steps"] if s["code"] not in (0, None)]
    if failed:
        raise SystemExit(f"error: {path}: these steps failed: {', '.join(failed)}")
    times = {
        s["tag"]: float(s.get(field, 0.0)) for s in data["steps"] if s["code"] == 0
    }
    if field == "seconds":
        times["(wall clock)"] = float(data["wall_s"])
    else:
        times["(wall clock)"] = sum(times.values())  # the total of the steps
    return times


def render(columns: dict[str, list[dict[str, float]]]) -> str:
    """One row per step, one median column per kind of run (cold, warm)."""
    tags: list[str] = []
    for runs in columns.values():
        for run in runs:
            tags += [t for t in run if t not in tags]
    tags.sort(key=lambda t: t == "(wall clock)")  # the total last
    head = ["step", *(f"{name} (median of {len(r)})" for name, r in columns.items())]
    rows = [head]
    for tag in tags:
        cells = [tag]
        for runs in columns.values():
            values = [run[tag] for run in runs if tag in run]
            cells.append(_clock(statistics.median(values)) if values else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    )


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f}s"


def _ci(clone: Path, log: Path) -> tuple[dict[str, float], dict[str, float]]:
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", ".ci/run"],
            cwd=clone,
            env={**os.environ, "CI": "true"},
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode:
        raise SystemExit(f"error: .ci/run failed in {clone} (see {log})")
    print(f"  .ci/run in {clone}: {time.monotonic() - start:.0f} s", flush=True)
    return load_steps(clone / STEPS), load_steps(clone / STEPS, "cpu_s")


def full(runs: int, warm: bool, keep: bool) -> int:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    columns: dict[str, list[dict[str, float]]] = {"cold": [], "cold cpu": []}
    if warm:
        columns["warm"] = []
    for number in range(1, runs + 1):
        clone = Path(tempfile.mkdtemp(prefix=f"bench-ci-{head}-"))
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT),
                        str(clone)], check=True)  # fmt: skip
        print(f"run {number}/{runs}: clean clone of {head}", flush=True)
        wall, cpu = _ci(clone, clone.with_suffix(".cold.log"))
        columns["cold"].append(wall)
        columns["cold cpu"].append(cpu)
        if warm:
            columns["warm"].append(_ci(clone, clone.with_suffix(".warm.log"))[0])
        if not keep:
            subprocess.run(["rm", "-rf", str(clone)], check=True)
    print(f"\nscripts/test on {head}, {os.cpu_count()} cores")
    print(render(columns))
    return 0


def quick_all() -> int:
    for script in QUICK:
        print(f"--- {script} --quick", flush=True)
        start = time.monotonic()
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / script),
                               "--quick"], cwd=ROOT, check=False)  # fmt: skip
        if done.returncode:
            print(f"error: {script} --quick failed (exit {done.returncode})")
            return 1
        print(f"    ({time.monotonic() - start:.0f} s)", flush=True)
    print("--- bench_ci.py --quick", flush=True)
    print(render({"this run so far": [load_steps(ROOT / STEPS)]}))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="clean clones to time")
    parser.add_argument("--no-warm", action="store_true", help="cold runs only")
    parser.add_argument("--keep", action="store_true", help="keep the clones")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the last run's steps")
    mode.add_argument("--quick-all", action="store_true", help="every quick mode")
    parser.add_argument(
        "--steps", type=Path, default=ROOT / STEPS, help="with --quick: this report"
    )
    args = parser.parse_args(argv)
    if args.quick:
        print(render({"last run": [load_steps(args.steps)]}))
        return 0
    if args.quick_all:
        return quick_all()
    return full(args.runs, not args.no_warm, args.keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
