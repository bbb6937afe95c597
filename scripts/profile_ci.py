#!/usr/bin/env python3
"""Profile a run of scripts/test: where each step's CPU goes, by kind of process.

    python3 scripts/profile_ci.py                   every step, as CI runs them
    python3 scripts/profile_ci.py verify mutants    only these (scripts/test's args)
    python3 scripts/profile_ci.py --json P.json     the table as JSON too

It runs scripts/test as it is and reads /proc every --interval seconds: each
process's CPU (user + system, all its threads) and its command line, once. A
process belongs to the step whose `run_steps.py --reap` is its ancestor; its
kind is what it runs ("pytest test/unit", "sglang::scheduler", "git", ...). A
process shorter than the interval may never be seen, and one's last interval
is lost: the steps' own totals (build/reports/steps.json, from wait4) minus
what was seen are the "unseen" column. For a cold profile, run it in a fresh
clone. Linux only; standard library only (it runs before .venv exists).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
# Interpreters whose first argument says more than their own name.
PYTHONS = ("python", "python3", "python3.11", "python3.12")


@dataclass
class Seen:
    """One process as the samples saw it."""

    pid: int
    ppid: int
    comm: str
    argv: list[str]
    cpu_s: float = 0.0
    # Clock ticks after boot: which of the processes a pid has named is whose
    # parent (a pid is reused over a run of thousands of processes).
    start: int = 0


@dataclass
class Profile:
    """Every process seen, keyed by (pid, start time): a pid may be reused."""

    procs: dict[tuple[int, int], Seen] = field(default_factory=dict)
    # Every pid recorded: a new process whose parent is one of them is recorded.
    pids: set[int] = field(default_factory=set)


def _stat(pid: int) -> tuple[str, int, float, int] | None:
    """comm, ppid, CPU seconds and start time of `pid`; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses: it ends at the last ')'.
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    # Fields 4 (ppid), 14 and 15 (utime, stime), 22 (starttime), counted from 1.
    ppid, utime, stime, start = (
        int(rest[1]),
        int(rest[11]),
        int(rest[12]),
        int(rest[19]),
    )
    return comm, ppid, (utime + stime) / TICK, start


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def sample(profile: Profile, root_pid: int) -> None:
    """One pass over /proc: new processes under `root_pid`, everyone's CPU."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        got = _stat(pid)
        if got is None:
            continue
        comm, ppid, cpu, start = got
        key = (pid, start)
        seen = profile.procs.get(key)
        if seen is None:
            if pid != root_pid and not _descends(profile, ppid, root_pid):
                continue
            seen = Seen(pid, ppid, comm, _argv(pid), start=start)
            profile.procs[key] = seen
            profile.pids.add(pid)
        # A process renames itself after exec (setproctitle): keep the last name.
        seen.comm, seen.cpu_s = comm, cpu


def _descends(profile: Profile, ppid: int, root_pid: int) -> bool:
    return ppid == root_pid or ppid in profile.pids


def kind(seen: Seen) -> str:
    """What a process runs, in a few words."""
    if seen.comm.startswith("sglang::"):
        return seen.comm
    argv = seen.argv or [seen.comm]
    name = Path(argv[0]).name
    if name == "xpu-series":
        return " ".join(["xpu-series", *argv[1:2]])
    if name not in PYTHONS:
        return name
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        args = args[1:]
    if not args:
        return "python"
    if args[0] == "-c":
        return "python -c"
    if args[0] == "-m" and len(args) > 1:
        module = args[1]
        if module == "xpu_series":
            words, rest = [], args[2:]
            while rest:
                word, *rest = rest
                if word == "-C":  # names a folder, not the verb
                    rest = rest[1:]
                elif not word.startswith("-"):
                    words.append(word)
            return " ".join(["xpu-series", *words[:1]])
        if module == "pytest":
            paths = [a for a in args[2:] if "/" in a and not a.startswith("-")]
            where = "/".join(paths[0].split("/")[:2]) if paths else ""
            return f"pytest {where}".rstrip()
        return f"python -m {module}"
    script = Path(args[0]).name
    if script == "xpu-series":
        return " ".join(["xpu-series", *args[1:2]])
    if script == "run_steps.py" and "--reap" in args:
        return "run_steps --reap"
    return f"python {script}"


def step_tags() -> dict[tuple[str, ...], str]:
    """Each step's command, as its reaper's command line ends."""
    return {tuple(step.command): step.tag for step in run_steps.STEPS}


def attribute(profile: Profile) -> dict[str, dict[str, list[float]]]:
    """Per step, per kind: [CPU seconds, processes]."""
    commands = step_tags()
    by_pid: dict[int, list[Seen]] = defaultdict(list)
    for seen in sorted(profile.procs.values(), key=lambda s: s.start):
        by_pid[seen.pid].append(seen)

    def parent(seen: Seen) -> Seen | None:
        """The process of the pid `seen.ppid` that was running when `seen`
        started: the last one to start before it, not a later one that reused
        the pid (which charged a finished step's servers to a later step)."""
        before = [p for p in by_pid.get(seen.ppid, []) if p.start <= seen.start]
        return before[-1] if before else None

    def step_of(seen: Seen) -> str:
        current: Seen | None = seen
        for _ in range(256):
            if current is None:
                break
            argv = current.argv
            if "--reap" in argv:
                return commands.get(tuple(argv[argv.index("--reap") + 1 :]), "?")
            current = parent(current)
        return "(runner)"

    table: dict[str, dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(lambda: [0.0, 0])
    )
    for seen in profile.procs.values():
        cell = table[step_of(seen)][kind(seen)]
        cell[0] += seen.cpu_s
        cell[1] += 1
    return table


def report(
    table: dict[str, dict[str, list[float]]], totals: dict[str, float], top: int
) -> tuple[str, dict]:
    """The text table and its JSON: steps by CPU, each with its top kinds."""
    lines = [f"{'step':18} {'cpu s':>7} {'seen':>7} {'unseen':>7}  top kinds "
             "(cpu s / processes)"]  # fmt: skip
    data: dict = {"steps": {}}
    order = sorted(
        set(table) | set(totals),
        key=lambda s: -max(totals.get(s, 0.0), _sum(table.get(s, {}))),
    )
    for step in order:
        kinds = table.get(step, {})
        seen = _sum(kinds)
        total = totals.get(step, seen)
        ranked = sorted(kinds.items(), key=lambda kv: -kv[1][0])
        words = ", ".join(f"{k} {v[0]:.1f}/{int(v[1])}" for k, v in ranked[:top])
        unseen = max(total - seen, 0.0)
        lines.append(f"{step:18} {total:7.1f} {seen:7.1f} {unseen:7.1f}  {words}")
        data["steps"][step] = {
            "cpu_s": round(total, 1),
            "unseen_s": round(unseen, 1),
            "kinds": {
                k: {"cpu_s": round(v[0], 2), "processes": int(v[1])} for k, v in ranked
            },  # fmt: skip
        }
    overall: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for kinds in table.values():
        for k, (cpu, count) in kinds.items():
            overall[k][0] += cpu
            overall[k][1] += count
    lines.append("")
    lines.append(f"{'kind, over every step':40} {'cpu s':>7} {'processes':>9}")
    for k, (cpu, count) in sorted(overall.items(), key=lambda kv: -kv[1][0])[: top * 3]:
        lines.append(f"{k[:40]:40} {cpu:7.1f} {int(count):9}")
    return "\n".join(lines), data


def _sum(kinds: dict[str, list[float]]) -> float:
    return sum(v[0] for v in kinds.values())


def step_totals(path: Path) -> dict[str, float]:
    """Each step's CPU as scripts/test counted it (wait4), if it wrote them."""
    try:
        steps = json.loads(path.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return {}
    return {s["tag"]: float(s["cpu_s"]) for s in steps if s.get("cpu_s") is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Arguments after the options go to scripts/test (steps, -j, ...).",
    )
    parser.add_argument("--interval", type=float, default=0.2, metavar="S",
                        help="seconds between samples (default 0.2)")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="write the table as JSON to FILE too")  # fmt: skip
    parser.add_argument("--top", type=int, default=5,
                        help="kinds named per step (default 5)")  # fmt: skip
    args, rest = parser.parse_known_args(argv)
    if not Path("/proc/self/stat").exists():
        print("error: profile_ci reads /proc: Linux only", file=sys.stderr)
        return 2
    profile = Profile()
    proc = subprocess.Popen([str(ROOT / "scripts" / "test"), *rest], cwd=ROOT)
    try:
        while proc.poll() is None:
            sample(profile, proc.pid)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        proc.wait()
        print("profile_ci: interrupted; no table", file=sys.stderr)
        return 130
    table, data = report(
        attribute(profile),
        step_totals(ROOT / "build" / "reports" / "steps.json"),
        args.top,
    )
    print(f"\nprofile (every {args.interval} s; 'unseen' ran between samples):")
    print(table)
    if args.json:
        data["exit_code"] = proc.returncode
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
