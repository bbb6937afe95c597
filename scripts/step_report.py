"""What scripts/test says when it ends: the summary table (text and markdown) and
the end of each failed step's output. Standard library only (see run_steps.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

# Lines of a failed step's log repeated under the table: its error and the lines
# that led to it, where the relayed output of the other lanes buried them.
TAIL_LINES = 30


class Named(Protocol):
    tag: str
    lane: str


class Stepped(Protocol):
    """What the report reads of a step's outcome (run_steps.Outcome)."""

    @property
    def step(self) -> Named: ...

    seconds: float
    started_s: float | None
    cpu_s: float
    code: int | None
    note: str


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f}s"


def rows(outcomes: Iterable[Stepped]) -> list[tuple[str, str, str, str, str]]:
    out = []
    for o in outcomes:
        if o.code is None:
            result = o.note or "-"
        elif o.code == 0:
            result = o.note or "ok"
        else:
            result = o.note or f"FAILED (exit {o.code})"
        ran = o.code is not None and not o.note.endswith("(cached)")
        spent = clock(o.seconds) if ran else "-"
        cpu = clock(o.cpu_s) if ran else "-"
        out.append((o.step.tag, o.step.lane, spent, cpu, result))
    return out


def totals(outcomes: Iterable[Stepped], wall_s: float) -> str:
    cpu = sum(o.cpu_s for o in outcomes)
    return f"wall clock {clock(wall_s)}, cpu {clock(cpu)}"


def summary(outcomes: list[Stepped], wall_s: float) -> str:
    table = [("step", "lane", "time", "cpu", "result"), *rows(outcomes)]
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in table
    ]
    lines.append(totals(outcomes, wall_s))
    return "\n".join(lines)


def markdown(outcomes: list[Stepped], wall_s: float) -> str:
    """The same table for a CI job summary (.github/workflows/test.yml)."""
    lines = ["| step | lane | time | cpu | result |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(outcomes)]
    lines.append("\n" + totals(outcomes, wall_s))
    return "\n".join(lines) + "\n"


def failed_ends(outcomes: Iterable[Stepped], logs: Path) -> str:
    """The last TAIL_LINES lines of each failed step's log (`logs`/TAG.log), so a
    run's output ends with why it failed; "" when none failed."""
    parts = []
    for o in outcomes:
        if not o.code:
            continue
        log = logs / f"{o.step.tag}.log"
        lines: list[str] = []
        if o.started_s is not None:  # else its log, if any, is an earlier run's
            try:
                lines = log.read_text(errors="replace").splitlines()
            except OSError:
                pass
        head = f"--- [{o.step.tag}] failed; the end of its output ({log}):"
        if not lines:
            head = f"--- [{o.step.tag}] failed: {o.note or 'it printed nothing'}"
        parts.append("\n".join([head, *lines[-TAIL_LINES:]]))
    return "\n\n".join(parts)
