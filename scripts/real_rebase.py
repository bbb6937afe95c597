"""Rebase the real series onto a newer sglang in a scratch copy of the project and
check the outcome; then run verify there and save its report (information only).

Run by scripts/test. Exits 0 with a 'skipped:' line when the package index cannot
be reached; exits 1 when the rebase itself does not do what it must.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = [sys.executable, "-m", "xpu_series"]
# What the tool must find moving 0.5.19 -> 0.5.20 (docs/maintainers.md).
EXPECTED = {
    "0.5.20": {
        "retired": [
            "0001-xpu-attention-causal.patch",
            "0002-xpu-dflash-wiring.patch",
            "0009-xpu-dflash-graph-rejection.patch",
        ],
        "carried": 6,  # 0009 is retired at 0.5.20 by its Applied-Upstream field
    }
}


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOOL, "-C", str(project), *args], capture_output=True, text=True, check=False
    )


def _scratch_copy(dest: Path) -> None:
    """The committed project plus a hard-linked wheel cache (no second download)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    cache = ROOT / "build" / "cache"
    if cache.is_dir():
        (dest / "build").mkdir()
        subprocess.run(["cp", "-al", str(cache), str(dest / "build" / "cache")],
                       check=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onto", default="0.5.20")
    parser.add_argument("--reports", type=Path, default=ROOT / "build" / "reports")
    args = parser.parse_args()
    args.reports.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xpu-real-rebase-") as tmp:
        project = Path(tmp)
        _scratch_copy(project)
        pin_before = (project / "patches" / "upstream.toml").read_text()
        proc = _run(project, "rebase", "--onto", args.onto, "--json")
        if proc.returncode != 0 and "could not reach the package index" in proc.stderr:
            print(f"skipped: the package index cannot be reached ({args.onto})")
            return 0
        print(proc.stderr.strip())
        data = json.loads(proc.stdout)
        (args.reports / f"real-rebase-{args.onto}.json").write_text(proc.stdout)
        problems = []
        if proc.returncode != 0 or not data.get("finished"):
            problems.append(f"rebase exited {proc.returncode}: {proc.stderr.strip()}")
        want = EXPECTED.get(args.onto)
        retired = sorted(r["name"] for r in data.get("retired", []))
        carried = [p for p in data.get("patches", []) if p["commit"]]
        if want and retired != want["retired"]:
            problems.append(f"retired {retired}, expected {want['retired']}")
        if want and len(carried) != want["carried"]:
            problems.append(f"carried {len(carried)}, expected {want['carried']}")
        pin = (project / "patches" / "upstream.toml").read_text()
        sha = data.get("onto", {}).get("sha256", "")
        if pin == pin_before or f'version = "{args.onto}"' not in pin or sha not in pin:
            problems.append("patches/upstream.toml was not moved to the new release")
        for r in data.get("retired", []):
            if not (project / r["moved_to"]).is_file():
                problems.append(f"{r['moved_to']} is missing")
        print(f"rebase onto {args.onto}: retired {', '.join(retired) or 'none'}; "
              f"carried {len(carried)}")  # fmt: skip
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 1
        # verify on the new base is information for the maintainer (tests that
        # need porting show up here), not a failure of the tool.
        env = dict(os.environ)
        verify = subprocess.run(
            [*TOOL, "-C", str(project), "verify"], capture_output=True, text=True,
            env=env, check=False,
        )  # fmt: skip
        print(verify.stdout.strip())
        (args.reports / f"real-rebase-{args.onto}-verify.txt").write_text(
            verify.stdout + verify.stderr
        )
        shutil.rmtree(project / "build", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
