#!/usr/bin/env python3
"""Benchmark the README's test command (`CI=true bash .ci/run`): cold in a clean
clone of HEAD (no .venv, an empty build/), warm (the same clone again, nothing
changed), and the marginal cost of a patch (a clone with the top patch of the
series left out, against the whole series), side by side, per step: wall, CPU
and system seconds from build/reports/steps.json.

    python3 scripts/bench_ci.py                  # cold, warm and marginal
    python3 scripts/bench_ci.py --no-marginal    # cold and warm only
    python3 scripts/bench_ci.py --dirty          # the checkout as it is, not HEAD
    python3 scripts/bench_ci.py --runs 2         # medians of two clean clones
    python3 scripts/bench_ci.py --keep-going     # time every step, even failed ones
    python3 scripts/bench_ci.py --quick          # the last run's steps, no new run
    python3 scripts/bench_ci.py --quick-all      # every bench_*.py in quick mode
    python3 scripts/bench_ci.py --replay A.steps.json ...  # the lanes' order, replayed

The marginal runs happen in the cold run's clone once it is done, its content
caches warm, each running afresh (XPU_SERIES_FRESH) the steps that prove patches
(MARGINAL_STEPS; the overlay's diffs and the audit's triage name every patch, so
the series is whole there), all with one proof seed:
- the whole series;
- the top patch new: its records taken out (unrecord), run outside CI, where a
  patch with no record is proven in full (the run that records it); in CI a
  missing record fails;
- the series without the top patch (the one a series grows by; a patch lower
  down would change the record of every patch above it): its line in
  patches/series, its file, its record and the test files only it names. Its
  registered tests' record, keyed by the whole tree, is written first
  (record_registered), and one untimed run builds its own trees, so that both
  sides find their trees built.
Marginal = the whole series' CPU minus the series without the top patch (the
cost CI pays for a recorded patch); first proof = new minus whole.

--replay reads the steps.json of runs (a cold run's is kept beside its log) and
replays each through the scheduler (step_lanes.replay) with each step's measured
seconds: once in the order the committed cost_s give, once with the run's own
seconds as costs (the best that order could do knowing the run). The lanes' cost_s
are kept up to date with it.

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
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = Path("build") / "reports" / "steps.json"
QUICK = (
    "bench_apply.py",
    "bench_matrix.py",
    "bench_rebase.py",
    "bench_audit.py",
    "bench_upstream.py",
)
# What writes the registered tests' record (the hint the registered step gives).
REGISTERED_WRITE = (
    ".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
    "-p", "xpu_series.registered.plugin",
    "--registered-record=patches/registered.json", "--registered-write",
    "test/registered/unit",
)  # fmt: skip
# The steps whose work is per patch and that stay whole with the top patch left
# out (bootstrap runs before them anyway).
MARGINAL_STEPS = ("verify", "mutants", "matrix", "registered", "upstream-check")
TOTAL = "(wall clock)"


def load_steps(
    path: Path, field: str = "seconds", failed_ok: bool = False
) -> dict[str, float]:
    """Seconds per step tag of one run (`field`: wall "seconds", "cpu_s" or
    "sys_s"); a failed step is an error, not a time (with `failed_ok`, its
    time is kept under "TAG (failed)")."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: cannot read {path}: {exc}") from None
    failed = [s["tag"] for s in data["steps"] if s["code"] not in (0, None)]
    if failed and not failed_ok:
        raise SystemExit(f"error: {path}: these steps failed: {', '.join(failed)}")
    times = {
        s["tag"] + ("" if s["code"] == 0 else " (failed)"): float(s.get(field, 0.0))
        for s in data["steps"]
        if s["code"] is not None
    }
    if field == "seconds":
        times[TOTAL] = float(data["wall_s"])
    else:
        times[TOTAL] = sum(times.values())  # the total of the steps
    return times


def render(columns: dict[str, list[dict[str, float]]]) -> str:
    """One row per step, one median column per kind of run (cold, warm...)."""
    tags: list[str] = []
    for runs in columns.values():
        for run in runs:
            tags += [t for t in run if t not in tags]
    tags.sort(key=lambda t: t == TOTAL)  # the total last
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
    sign = "-" if seconds < 0 else ""
    minutes, rest = divmod(round(abs(seconds)), 60)
    return f"{sign}{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f}s"


def top_patch(root: Path) -> str:
    """The last patch of patches/series."""
    names = [
        line.strip()
        for line in (root / "patches" / "series").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    if not names:
        raise SystemExit("error: patches/series lists no patch")
    return names[-1]


def leave_out(clone: Path, name: str) -> list[str]:
    """The series without `name` (the top patch): its line, its file, its
    records (unrecord) and the test files no other patch names. Returns the
    files removed."""
    patches = clone / "patches"
    series = (patches / "series").read_text().splitlines(keepends=True)
    if top_patch(clone) != name:
        raise SystemExit(f"error: {name} is not the top patch of the series")
    only = _only_tests(patches, name)
    unrecord(clone, name)
    (patches / "series").write_text(
        "".join(line for line in series if line.strip() != name)
    )
    (patches / name).unlink()
    removed = [f"patches/{name}"]
    for test in sorted(only):
        path = clone / test
        if path.is_file():
            path.unlink()
            removed.append(test)
    return removed


def unrecord(clone: Path, name: str) -> list[str]:
    """`name` as a patch just added: its entries out of every committed record
    (verify's, the matrix's, the upstream checks' and the registered tests' of
    the files only it names). Returns the records changed."""
    patches = clone / "patches"
    # Each record's tables, and the keys of `name` in them.
    only = sorted(_only_tests(patches, name))
    records = {
        "proofs.json": (lambda d: [d["patches"]], [name]),
        "matrix-record.json": (lambda d: list(d["releases"].values()), [name]),
        "upstream-checks.json": (lambda d: [d["checks"]], [name]),
        "registered.json": (lambda d: [d["files"]], only),
    }
    changed = []
    for record, (tables, keys) in records.items():
        path = patches / record
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        if [t.pop(k) for t in tables(data) for k in keys if k in t]:
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            changed.append(f"patches/{record}")
    return changed


def _only_tests(patches: Path, name: str) -> set[str]:
    """The test files `name` names and no other patch of `patches` does."""
    only = _tests_of(patches / name)
    for other in patches.glob("*.patch"):
        if other.name != name:
            only -= _tests_of(other)
    return only


def record_registered(clone: Path, log: Path) -> None:
    """Untimed: bootstrap `clone` and write its registered tests' record. The
    record is keyed by the whole tree, which the left-out patch changes, so the
    clone would otherwise run every registered file where the whole series runs
    a sample: the marginal column would be the record's staleness, not the
    patch."""
    with log.open("w") as out:
        for command in (["scripts/test", "bootstrap"], [*REGISTERED_WRITE]):
            done = subprocess.run(command, cwd=clone, stdout=out,
                                  stderr=subprocess.STDOUT, check=False)  # fmt: skip
            if done.returncode:
                raise SystemExit(f"error: {' '.join(command)} failed (see {log})")


def _tests_of(patch: Path) -> set[str]:
    text = patch.read_text(errors="replace").split("\n---\n", 1)[0]
    return {
        match.split("::")[0]
        for line in re.findall(r"^(?:Fast-)?Tests: *(.+)$", text, re.M)
        for match in line.split()
    }


def _clone(head: str, dirty: bool, label: str, extra: Path | None) -> Path:
    """A clean clone of HEAD (with `dirty`, plus the checkout's uncommitted
    changes and untracked files; `extra`, a diff applied on top): no .venv, no
    build/."""
    clone = Path(tempfile.mkdtemp(prefix=f"bench-ci-{head}-{label}-"))
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)],
                   check=True)  # fmt: skip
    if dirty:
        diff = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "HEAD", "--binary"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
        if diff:
            subprocess.run(["git", "-C", str(clone), "apply", "--whitespace=nowarn"],
                           input=diff, check=True)  # fmt: skip
        untracked = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "-o", "--exclude-standard"],
            capture_output=True, check=True,
        ).stdout.split(b"\0")  # fmt: skip
        for name in (os.fsdecode(n) for n in untracked if n):
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    if extra is not None:
        applied = subprocess.run(["git", "-C", str(clone), "apply",
                                  str(extra.resolve())], check=False)  # fmt: skip
        if applied.returncode:
            raise SystemExit(f"error: {extra} does not apply in {clone}")
    return clone


def _ci(
    clone: Path,
    log: Path,
    steps: list[str],
    seed: int,
    keep_going: bool = False,
    fresh: bool = False,
    ci: bool = True,
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """One run of the README's command in `clone` (only `steps`, when named;
    `fresh`: none passed from the steps' cache; not `ci`: as a developer runs
    it): wall, CPU and system seconds per step."""
    start = time.monotonic()
    command = ["bash", ".ci/run"] if not steps else ["scripts/test", *steps]
    if keep_going:
        command = ["scripts/test", "--keep-going", *steps]
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "XPU_SERIES_FRESH")}
    env["XPU_SERIES_PROOF_SEED"] = str(seed)
    env.update({"CI": "true"} if ci else {})
    env.update({"XPU_SERIES_FRESH": "1"} if fresh else {})
    with log.open("w") as out:
        done = subprocess.run(command, cwd=clone, env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False)  # fmt: skip
    if done.returncode and not keep_going:
        raise SystemExit(f"error: {' '.join(command)} failed in {clone} (see {log})")
    print(f"  {' '.join(command)} in {clone}: {time.monotonic() - start:.0f} s",
          flush=True)  # fmt: skip
    # Kept beside the log: the next run in this clone writes its own.
    path = log.with_suffix(".steps.json")
    shutil.copyfile(clone / STEPS, path)
    return (
        load_steps(path, failed_ok=keep_going),
        load_steps(path, "cpu_s", keep_going),
        load_steps(path, "sys_s", keep_going),
    )


def marginal(
    clone: Path, name: str, steps: list[str], seed: int, keep_going: bool
) -> tuple[dict[str, float], dict[str, float]]:
    """In the cold run's clone: CPU seconds per step of the whole series minus
    the series without `name`, and of `name` new minus the whole series (see the
    module's docstring). Leaves `clone` without `name`."""

    def cpu(label: str, ci: bool = True) -> dict[str, float]:
        log = clone.with_suffix(f".{label}.log")
        return _ci(clone, log, steps, seed, keep_going, fresh=True, ci=ci)[1]

    def minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        # Bootstrap runs each time (never skipped): not a step timed here.
        diff = {t: a[t] - b.get(t, 0.0) for t in steps if t in a}
        return {**diff, TOTAL: sum(diff.values())}

    whole = cpu("whole")
    # Put back byte for byte after: a --dirty clone's records are not HEAD's.
    kept = {p: p.read_bytes() for p in (clone / "patches").glob("*.json")}
    print(f"  {name} new: took out of {', '.join(unrecord(clone, name))}",
          flush=True)  # fmt: skip
    new = cpu("new", ci=False)
    for path, data in kept.items():
        path.write_bytes(data)
    removed = leave_out(clone, name)
    print(f"  without {name}: removed {', '.join(removed)}", flush=True)
    record_registered(clone, clone.with_suffix(".record.log"))
    cpu("without-untimed")
    return minus(whole, cpu("without")), minus(new, whole)


def full(args: argparse.Namespace) -> int:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip() + ("+dirty" if args.dirty else "")  # fmt: skip
    seed = args.seed or random.SystemRandom().randrange(1, 10**9)
    columns: dict[str, list[dict[str, float]]] = {
        "cold": [], "cold cpu": [], "cold sys": [],
    }  # fmt: skip
    if not args.no_warm:
        columns["warm"] = []
    costs: list[dict[str, float]] = []
    firsts: list[dict[str, float]] = []
    left = args.leave_out or top_patch(ROOT)
    for number in range(1, args.runs + 1):
        print(f"run {number}/{args.runs}: clean clone of {head} (seed {seed})",
              flush=True)  # fmt: skip
        clone = _clone(head, args.dirty, "whole", args.apply)
        wall, cpu, system = _ci(
            clone, clone.with_suffix(".cold.log"), args.steps, seed, args.keep_going
        )
        columns["cold"].append(wall)
        columns["cold cpu"].append(cpu)
        columns["cold sys"].append(system)
        if not args.no_warm:
            warm = _ci(
                clone, clone.with_suffix(".warm.log"), args.steps, seed,
                args.keep_going,
            )[0]  # fmt: skip
            columns["warm"].append(warm)
        if not args.no_marginal:
            steps = [s for s in (args.steps or MARGINAL_STEPS) if s != "bootstrap"]
            cost, first = marginal(clone, left, steps, seed, args.keep_going)
            costs.append(cost)
            firsts.append(first)
        if not args.keep:
            shutil.rmtree(clone, ignore_errors=True)
    if costs:
        columns[f"cpu of {left[:4]}"] = costs
        columns[f"first proof of {left[:4]}"] = firsts
    print(f"\nscripts/test on {head}, {os.cpu_count()} cores, proof seed {seed}")
    print(render(columns))
    return 0


def replay(paths: list[Path]) -> str:
    """Each run's wall clock, and its steps replayed in the lanes' order with the
    committed cost_s and with its own seconds as costs (see the docstring)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import run_steps
    import step_lanes

    rows = [("run", "wall clock", "replayed: cost_s", "replayed: own seconds")]
    for path in paths:
        took = load_steps(path)
        first = sum(took.get(s.tag, 0.0) for s in run_steps.STEPS if s.lane == "first")
        lanes = run_steps.lanes_of([s for s in run_steps.STEPS if s.tag in took])
        own = [
            [SimpleNamespace(cost_s=round(took[s.tag]), tag=s.tag) for s in lane]
            for lane in lanes
        ]

        def seconds(step: Any, took: dict[str, float] = took) -> float:
            return took[step.tag]

        rows.append((
            path.name,
            _clock(took[TOTAL]),
            # Two cores: what CI's machines have, and what cost_s is for.
            _clock(first + step_lanes.replay(lanes, 2, seconds)),
            _clock(first + step_lanes.replay(own, 2, seconds)),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = (
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows
    )
    return "\n".join(line.rstrip() for line in lines)


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
    parser.add_argument("--no-warm", action="store_true", help="no warm run")
    parser.add_argument(
        "--no-marginal", action="store_true", help="no run without a patch"
    )
    parser.add_argument(
        "--leave-out", metavar="PATCH", help="the patch left out (default: the top)"
    )
    parser.add_argument(
        "--steps", nargs="+", default=[], metavar="STEP", help="only these steps"
    )
    parser.add_argument(
        "--dirty", action="store_true", help="with the uncommitted changes too"
    )
    parser.add_argument("--seed", type=int, default=0, help="the proofs' seed")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="time every step even when one fails (scripts/test --keep-going)",
    )
    parser.add_argument(
        "--apply", type=Path, metavar="DIFF", help="apply this diff in each clone"
    )
    parser.add_argument("--keep", action="store_true", help="keep the clones")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the last run's steps")
    mode.add_argument("--quick-all", action="store_true", help="every quick mode")
    mode.add_argument(
        "--replay",
        nargs="+",
        type=Path,
        metavar="STEPS_JSON",
        help="replay these runs' step times through the lanes' order",
    )
    parser.add_argument(
        "--steps-file", type=Path, default=ROOT / STEPS, help="with --quick: this"
    )
    args = parser.parse_args(argv)
    if args.quick:
        path = args.steps_file
        print(
            render(
                {
                    "last run": [load_steps(path)],
                    "cpu": [load_steps(path, "cpu_s")],
                    "sys": [load_steps(path, "sys_s")],
                }
            )
        )
        return 0
    if args.quick_all:
        return quick_all()
    if args.replay:
        print(replay(args.replay))
        return 0
    return full(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
