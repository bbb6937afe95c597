"""Benchmark `xpu-series rebase --onto V` (wheel cached) against the same by hand:
`git am -3` of the series on a base of the new wheel. Medians, runs alternated.

The tool's figure is the whole transaction (state, fetch and hash check, base,
carry, classify, write-out of pin/patches/series, report, drift) without the
retired patches' test run, which the hand version has no counterpart for; that run
is measured on its own line.

    .venv/bin/python scripts/bench_rebase.py --onto 0.5.20 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from xpu_series.project import Project  # noqa: E402
from xpu_series.tree import ensure_base_cache  # noqa: E402
from xpu_series.wheel import fetch_wheel  # noqa: E402


def _copy(dest: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"],
                             capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    (dest / "build").mkdir()
    subprocess.run(["cp", "-al", str(ROOT / "build" / "cache"),
                    str(dest / "build" / "cache")], check=True)  # fmt: skip


def tool(onto: str, *extra: str) -> float:
    """The whole transaction: tree on the old pin, then rebase with write-out."""
    with tempfile.TemporaryDirectory(prefix="bench-rebase-") as tmp:
        project = Path(tmp)
        _copy(project)
        run = [sys.executable, "-m", "xpu_series", "-C", str(project)]
        subprocess.run([*run, "apply", "--no-link"], check=True, capture_output=True)
        start = time.perf_counter()
        subprocess.run([*run, "rebase", "--onto", onto, *extra], check=True,
                       capture_output=True)  # fmt: skip
        return time.perf_counter() - start


def by_hand(onto: str) -> float:
    """Clone the cached base of the new wheel, fetch the old blobs, git am -3."""
    project = Project(ROOT)
    pin = project.pin.for_version(onto)
    wheel = fetch_wheel(pin, project.cache_dir)  # a download on the first run only
    base, _ = ensure_base_cache(wheel, pin, project.cache_dir)
    old_base, _ = ensure_base_cache(
        fetch_wheel(project.pin, project.cache_dir, offline=True),
        project.pin, project.cache_dir,
    )  # fmt: skip
    patches = [str(p.path) for p in project.series().patches]
    with tempfile.TemporaryDirectory(prefix="bench-hand-") as tmp:
        tree = Path(tmp) / "t"
        git = ["git", "-c", "user.name=b", "-c", "user.email=b@b"]
        start = time.perf_counter()
        subprocess.run([*git, "clone", "-q", "--local", str(base), str(tree)],
                       check=True)  # fmt: skip
        subprocess.run([*git, "-C", str(tree), "checkout", "-q", "-B", "x",
                        "upstream"], check=True)  # fmt: skip
        subprocess.run([*git, "-C", str(tree), "fetch", "-q", str(old_base),
                        "+refs/tags/upstream:refs/old"], check=True)  # fmt: skip
        for patch in patches:
            am = [*git, "-C", str(tree), "am", "-q", "-3", "-k", patch]
            done = subprocess.run(am, capture_output=True)
            if done.returncode:
                subprocess.run([*git, "-C", str(tree), "am", "--abort"],
                               capture_output=True)  # fmt: skip
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onto", default="0.5.20")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run of each case")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    if not args.quick:
        # Warm: the new wheel and its base are cached. Quick mode only shows the
        # benchmark still runs, so its first run may include building the base.
        tool(args.onto)
        by_hand(args.onto)
    times: dict[str, list[float]] = {
        "xpu-series rebase": [],
        "by hand (git am -3)": [],
        "rebase + retired tests": [],
    }
    for _ in range(args.runs):
        times["xpu-series rebase"].append(tool(args.onto, "--no-test-retired"))
        times["by hand (git am -3)"].append(by_hand(args.onto))
        times["rebase + retired tests"].append(tool(args.onto))
    hand = statistics.median(times["by hand (git am -3)"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:24s} median {med:6.2f} s  ({med / hand:.2f}x by hand)  "
              f"runs {', '.join(f'{v:.2f}' for v in values)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
