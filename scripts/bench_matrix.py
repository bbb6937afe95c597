"""Benchmark `xpu-series matrix` over newer releases: text only and with behaviour,
cold (nothing cached: wheels, bases, outcomes) and warm, with `verify` on the pin
measured in the same run as the yardstick. Medians; the cases alternate per round.

    .venv/bin/python scripts/bench_matrix.py --runs 3 0.5.20 0.5.21 0.5.22 0.5.23

--quick (what CI runs, so the benchmark cannot rot): one run, the pin only, the
text matrix cold and warm; the verify yardstick and the behavioural cases, which
CI's own verify and matrix steps exercise, are left to the full run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from xpu_series.stack.share import link_settled  # noqa: E402


def _copy(dest: Path) -> None:
    """The committed project, with no build/ at all (a cold start)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"],
                             capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def _link_wheels(project: Path) -> None:
    """Quick mode: the checkout's cached wheels, hard-linked in (content-addressed,
    so sharing them is safe), so that no download is part of the quick run. CI's
    other steps may fetch a wheel meanwhile: only settled ones are linked."""
    wheels = ROOT / "build" / "cache" / "wheels"
    link_settled(wheels, project / "build" / "cache" / "wheels")


def _timed(project: Path, *args: str) -> float:
    env = dict(os.environ, XPU_SERIES_CACHE=str(project / "build" / "cache"))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "xpu_series", "-C", str(project), *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed: {proc.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    newer = ["0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    parser.add_argument("versions", nargs="*", default=newer)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="one run, the pin, text matrix only"
    )
    args = parser.parse_args()
    if args.quick:
        # The smallest case: the pin's column alone (no versions would mean every
        # served release, four bases to unpack cold).
        pin = tomllib.loads((ROOT / "patches" / "upstream.toml").read_text())
        args.runs, args.versions = 1, [pin["upstream"]["version"]]
    cases = ["text matrix, cold", "text matrix, warm"]
    if not args.quick:
        cases = ["verify on the pin (cold)", *cases]
        cases += ["behavioural matrix, cold", "behavioural matrix, warm"]
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
            project = Path(tmp)
            _copy(project)
            if not args.quick:
                # verify on the pin, from nothing: the yardstick (wheel, base, tests).
                times["verify on the pin (cold)"].append(_timed(project, "verify"))
                shutil.rmtree(project / "build")
            if args.quick:
                _link_wheels(project)
            times["text matrix, cold"].append(_timed(project, "matrix", *args.versions))
            times["text matrix, warm"].append(_timed(project, "matrix", *args.versions))
            if args.quick:
                continue
            shutil.rmtree(project / "build")
            behaviour = ("matrix", "--behaviour", *args.versions)
            times["behavioural matrix, cold"].append(_timed(project, *behaviour))
            times["behavioural matrix, warm"].append(_timed(project, *behaviour))
    verify = statistics.median(times.get("verify on the pin (cold)", [0.0]))
    for name, values in times.items():
        med = statistics.median(values)
        ratio = f"({med / verify:.2f}x verify)  " if verify else ""
        print(f"{name:26s} median {med:7.2f} s  {ratio}"
              f"runs {', '.join(f'{v:.1f}' for v in values)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
