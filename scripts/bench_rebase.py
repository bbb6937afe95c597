"""Benchmark `xpu-series rebase` on a move the series really made (wheels cached)
against the same by hand: `git am -3` of the series on a base of the new wheel.
Medians, runs alternated.

The move is one recorded in patches/moves/OLD-to-NEW.plan, by default the last
(the move to the pin from its predecessor). The series as it was on OLD comes from
git history, as scripts/replay_move.py finds it: the move commit's parent, with the
commit's plans and hand resolutions laid over it, and carried through the earlier
plans of the same commit (once, untimed) until it stands on OLD.

The tool's figure is the whole transaction (state, fetch and hash check, base,
carry, classify, write-out of pin/patches/series, report, drift) without the
retired patches' test run, which the hand version has no counterpart for; that run
is measured on its own line (not in --quick).

    .venv/bin/python scripts/bench_rebase.py --runs 3
    .venv/bin/python scripts/bench_rebase.py --onto 0.5.20    # an earlier move
    .venv/bin/python scripts/bench_rebase.py --quick   # one run (CI), no carry
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from xpu_series.project import Project  # noqa: E402
from xpu_series.stack.pin import version_tuple  # noqa: E402
from xpu_series.stack.share import link_settled  # noqa: E402
from xpu_series.stack.tree import ensure_base_cache  # noqa: E402
from xpu_series.stack.wheel import fetch_wheel  # noqa: E402

MOVES = "patches/moves/"
# What a move commit records besides the new series: laid over its parent's patches/.
RECORD = (MOVES, "patches/resolutions/")
# The cache folders a rebase reads: releases, their bases, bytecode, test outcomes.
SHARED = ("wheels", "bases", "bytecode", "outcomes")


@dataclass(frozen=True)
class Move:
    """One recorded rebase: OLD -> NEW, its plan, and the commit that added it."""

    old: str
    new: str
    plan: str
    commit: str


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def _files(root: Path, commit: str) -> dict[str, bytes]:
    """Every file under patches/ at `commit`, by path."""
    data = subprocess.run(["git", "-C", str(root), "archive", commit, "patches"],
                          capture_output=True, check=True).stdout  # fmt: skip
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            handle = archive.extractfile(member) if member.isfile() else None
            if handle:
                out[member.name] = handle.read()
    return out


def _pin_version(files: dict[str, bytes]) -> str:
    for line in files["patches/upstream.toml"].decode().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    return ""


def recorded_moves(root: Path) -> list[Move]:
    """Every move patches/moves/ records, oldest release first."""
    out = []
    for plan in sorted((root / MOVES).glob("*-to-*.plan")):
        old, _, new = plan.name.removesuffix(".plan").partition("-to-")
        rel = f"{MOVES}{plan.name}"
        commit = _git(root, "log", "--diff-filter=A", "-1", "--format=%H", "--", rel)
        out.append(Move(old, new, rel, commit))
    return sorted(out, key=lambda m: version_tuple(m.old) or ())


def pick_move(moves: list[Move], onto: str | None, quick: bool = False) -> Move:
    """The move to `onto`, or the last recorded one; with `quick`, the last one
    that is the first of its commit (no earlier plan to carry the series through
    first: that carry, an apply and a rebase, cost 27 of quick's 37 s of CPU)."""
    if not moves:
        raise SystemExit(
            f"error: {MOVES} records no move\nhint: run a rebase first "
            "('xpu-series rebase --onto VERSION'), then commit patches/"
        )
    if onto is None and quick:
        firsts = [m for i, m in enumerate(moves)
                  if all(p.commit != m.commit for p in moves[:i])]  # fmt: skip
        return firsts[-1]
    if onto is None:
        return moves[-1]
    found = [m for m in moves if m.new == onto]
    if not found:
        known = ", ".join(f"{m.old} -> {m.new}" for m in moves)
        raise SystemExit(
            f"error: no recorded move onto sglang {onto} (recorded: {known})\n"
            "hint: name the target of one of them with --onto, or leave --onto out "
            "for the last"
        )
    return found[-1]


def start_of(root: Path, move: Move) -> tuple[dict[str, bytes], list[Move]]:
    """patches/ where the move commit starts, and the earlier moves of the same
    commit that carry it to `move.old` (oldest first)."""
    after = _files(root, move.commit)
    files = _files(root, f"{move.commit}^")
    files.update({k: v for k, v in after.items() if k.startswith(RECORD)})
    start = _pin_version(files)
    chain = [m for m in recorded_moves(root) if m.commit == move.commit]
    before = chain[: chain.index(move)]
    steps = [start, *(m.new for m in before)]
    if [m.old for m in [*before, move]] != steps:
        raise SystemExit(
            f"error: {move.commit[:12]} starts on sglang {start}, and its plans do "
            f"not lead from there to {move.old}\nhint: check patches/moves/ in "
            "that commit (scripts/replay_move.py --commit says more)"
        )
    return files, before


def _tool(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run([sys.executable, "-m", "xpu_series", "-C", str(project),
                           *args], capture_output=True, env=env)  # fmt: skip
    if done.returncode:
        sys.stderr.buffer.write(done.stdout + done.stderr)
        raise SystemExit(f"error: 'xpu-series {' '.join(args)}' failed in {project}")
    return done


def _copy(dest: Path, patches: Path) -> None:
    """A scratch project: HEAD's files, the series of `patches`, the shared cache."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"],
                             capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    shutil.rmtree(dest / "patches")
    shutil.copytree(patches, dest / "patches")
    # Hard links of what a rebase reads from the cache: the rest of it (the
    # images' root filesystems, the audit's) is tens of thousands of files. CI's
    # other steps write to it meanwhile: only settled entries are linked.
    cache = dest / "build" / "cache"
    cache.mkdir(parents=True)
    for part in SHARED:
        link_settled(ROOT / "build" / "cache" / part, cache / part)


def prepare(move: Move, dest: Path) -> Path:
    """patches/ as the series stood on `move.old`, written under `dest`."""
    files, before = start_of(ROOT, move)
    project = dest / "start"
    project.mkdir()
    for rel, data in files.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_bytes(data)
    if before:
        work = dest / "carry"
        work.mkdir()
        _copy(work, project / "patches")
        # The checkout's own cache, as the replay uses: OLD's base is built once.
        env = dict(os.environ, XPU_SERIES_CACHE=str(ROOT / "build" / "cache"))
        _tool(work, "apply", "--no-link", env=env)
        for step in before:
            plan = work / step.plan
            _tool(work, "rebase", "--onto", step.new, "--plan", str(plan),
                  "--no-test-retired", env=env)  # fmt: skip
        shutil.rmtree(project / "patches")
        shutil.copytree(work / "patches", project / "patches")
        shutil.rmtree(work)
    return project / "patches"


def tool(move: Move, patches: Path, *extra: str) -> float:
    """The whole transaction: tree on OLD, then rebase with write-out."""
    with tempfile.TemporaryDirectory(prefix="bench-rebase-") as tmp:
        project = Path(tmp)
        _copy(project, patches)
        _tool(project, "apply", "--no-link")
        plan = str(project / move.plan)
        start = time.perf_counter()
        _tool(project, "rebase", "--onto", move.new, "--plan", plan, *extra)
        return time.perf_counter() - start


def decided(plan: Path) -> set[str]:
    """The patches a plan retires or drops (by hand, they are left out)."""
    words = [line.split() for line in plan.read_text().splitlines()]
    return {w[1] for w in words if len(w) > 1 and w[0] in ("retire", "drop")}


def bases(move: Move, patches: Path) -> tuple[Path, Path]:
    """The bases of the move's new and old wheels, in the checkout's cache: built
    once there, where the scratch projects link them from (and where the run's
    other steps find them), not once per scratch project."""
    start_project = Project(patches.parent)
    cache = ROOT / "build" / "cache"
    new_pin = start_project.pin.for_version(move.new)
    base, _ = ensure_base_cache(fetch_wheel(new_pin, cache), new_pin, cache)
    old_pin = start_project.pin
    old_base, _ = ensure_base_cache(fetch_wheel(old_pin, cache), old_pin, cache)
    return base, old_base


def by_hand(move: Move, patches: Path) -> float:
    """Clone the cached base of the new wheel, fetch the old blobs, git am -3."""
    start_project = Project(patches.parent)
    base, old_base = bases(move, patches)
    skip = decided(patches.parent / move.plan)
    series = start_project.series().patches
    todo = [str(p.path) for p in series if p.name not in skip]
    with tempfile.TemporaryDirectory(prefix="bench-hand-") as tmp:
        tree = Path(tmp) / "t"
        # No automatic gc (see bench_apply's naive baseline): untimed, not free.
        git = ["git", "-c", "user.name=b", "-c", "user.email=b@b", "-c", "gc.auto=0"]
        start = time.perf_counter()
        subprocess.run([*git, "clone", "-q", str(base), str(tree)],
                       check=True)  # fmt: skip
        subprocess.run([*git, "-C", str(tree), "checkout", "-q", "-B", "x",
                        "upstream"], check=True)  # fmt: skip
        subprocess.run([*git, "-C", str(tree), "fetch", "-q", str(old_base),
                        "+refs/tags/upstream:refs/old"], check=True)  # fmt: skip
        for patch in todo:
            am = [*git, "-C", str(tree), "am", "-q", "-3", "-k", patch]
            done = subprocess.run(am, capture_output=True)
            if done.returncode:
                subprocess.run([*git, "-C", str(tree), "am", "--abort"],
                               capture_output=True)  # fmt: skip
        return time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--onto",
        metavar="VERSION",
        help="the target of a recorded move (default: the last recorded move)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one run of each case, without the retired patches' test run; "
        "unless --onto says otherwise, of the last move with no earlier plan in "
        "its commit to carry the series through first",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    move = pick_move(recorded_moves(ROOT), args.onto, args.quick)
    print(f"move: sglang {move.old} -> {move.new} ({move.plan}, "
          f"recorded in {move.commit[:12]})", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        patches = prepare(move, Path(tmp))
        # Untimed, in both modes: each case starts from the same cached bases.
        bases(move, patches)
        if not args.quick:
            # Warm: the rest a first run leaves (bytecode, outcomes) is cached too.
            tool(move, patches)
            by_hand(move, patches)
        times: dict[str, list[float]] = {
            "xpu-series rebase": [],
            "by hand (git am -3)": [],
            "rebase + retired tests": [],
        }
        if args.quick:
            # Minutes of pytest on the new base, from a tree without bytecode; the
            # rows left run the same transaction.
            del times["rebase + retired tests"]
        for _ in range(args.runs):
            times["xpu-series rebase"].append(tool(move, patches, "--no-test-retired"))
            times["by hand (git am -3)"].append(by_hand(move, patches))
            if "rebase + retired tests" in times:
                times["rebase + retired tests"].append(tool(move, patches))
    hand = statistics.median(times["by hand (git am -3)"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:24s} median {med:6.2f} s  ({med / hand:.2f}x by hand)  "
              f"runs {', '.join(f'{v:.2f}' for v in values)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
