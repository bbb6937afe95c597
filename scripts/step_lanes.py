"""When each step of scripts/test starts: lanes, and one step more than the
cores. Standard library only (see run_steps.py)."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Sequence
from typing import Protocol


class Lanestep(Protocol):
    """What the scheduler reads of a step (run_steps.Step)."""

    cost_s: int


def run_lanes(
    lanes: Sequence[Sequence[Lanestep]],
    jobs: int,
    work: Callable[[Lanestep], None],
) -> None:
    """Run `work` on every step: each lane's in its order and one at a time, up
    to one step more than `jobs` at once (one at a time with one job). A free
    slot goes to the ready lane with the most cost_s left: the longest lane
    starts first, so the run ends when the cores run out of work, not when a
    lane started late is left to run alone.

    Why one more than the cores, of any kind: every step waits part of its time
    (servers that start and stop, pip, buildah, worker interpreters loading),
    and on two cores a third step fills those waits, whatever its kind. Clean
    clones at proof seed 1, side by side with a third slot kept for steps
    marked as mostly waiting: 643 s against 659 s (19m52s and 19m20s of CPU),
    and in an earlier pair 627 s against 679 s. Two steps more (-j 3 on
    two cores) gained nothing (656 s against 662 s): four steps at once spent
    in contention what the idle cores gave. Starting steps into measured idle
    time (up to two more, once 0.5 cores had been idle for 8 s) did not shorten
    a run either (654 s both)."""
    pending = [list(lane) for lane in lanes]
    busy: list[Lanestep | None] = [None] * len(pending)
    turn = threading.Condition()

    def take() -> tuple[int, Lanestep] | None:
        with turn:
            while True:
                # One thread per slot: a thread asking has no step running,
                # so a ready lane always has a slot.
                i = _next_lane(pending, [b is not None for b in busy])
                if i is not None:
                    busy[i] = step = pending[i].pop(0)
                    return i, step
                if all(s is None for s in busy):
                    return None
                turn.wait()

    def worker() -> None:
        while (got := take()) is not None:
            lane, step = got
            try:
                work(step)
            finally:
                with turn:
                    busy[lane] = None
                    turn.notify_all()

    threads = [threading.Thread(target=worker) for _ in range(_slots(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _slots(jobs: int) -> int:
    cores = max(1, jobs)
    return cores + (1 if cores > 1 else 0)


def _next_lane(
    pending: Sequence[Sequence[Lanestep]], busy: Sequence[bool]
) -> int | None:
    """The lane a free slot goes to: of the ready ones, the one with the most
    cost_s left (max() keeps the first of equals: the lanes' own order)."""
    ready = [i for i, left in enumerate(pending) if left and not busy[i]]
    if not ready:
        return None
    return max(ready, key=lambda k: sum(s.cost_s for s in pending[k]))


def replay(
    lanes: Sequence[Sequence[Lanestep]],
    jobs: int,
    seconds: Callable[[Lanestep], float],
) -> float:
    """When run_lanes would end if each step took `seconds(step)` whatever ran
    beside it: the scheduler's order for a run's measured step times, to weigh
    one set of costs against another (bench_ci.py --replay)."""
    pending = [list(lane) for lane in lanes]
    busy = [False] * len(pending)
    ends: list[tuple[float, int]] = []  # (when, lane) of the steps running
    now, free = 0.0, _slots(jobs)
    while True:
        while free and (i := _next_lane(pending, busy)) is not None:
            step = pending[i].pop(0)
            busy[i], free = True, free - 1
            heapq.heappush(ends, (now + seconds(step), i))
        if not ends:
            return now
        now, i = heapq.heappop(ends)
        busy[i], free = False, free + 1
