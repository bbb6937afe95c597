"""When each step of scripts/test starts: lanes, cores, and one step more that
waits. Standard library only (see run_steps.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol


class Lanestep(Protocol):
    """What the scheduler reads of a step (run_steps.Step)."""

    cost_s: int
    waits: bool


def run_lanes(
    lanes: Sequence[Sequence[Lanestep]],
    jobs: int,
    work: Callable[[Lanestep], None],
) -> None:
    """Run `work` on every step: each lane's in its order and one at a time, up
    to `jobs` steps at once, and with two jobs or more, one step more if it
    `waits`. A free slot goes to the ready lane with the most cost_s left whose
    next step fits: the longest lane starts first, so the run ends when the
    cores run out of work, not when a lane started late is left to run alone.

    Not more than that, even while the steps running leave a core idle: on two
    cores, starting steps into the idle time (up to two more, once 0.5 cores
    had been idle for 8 s) cut the idle time of a cold run from 94 to 62
    core-seconds but not its wall time (654 s both, the same proof seed): the
    four steps at once spent what the idle cores gave."""
    pending = [list(lane) for lane in lanes]
    busy: list[Lanestep | None] = [None] * len(pending)
    turn = threading.Condition()
    cores = max(1, jobs)
    slots = cores + (1 if cores > 1 else 0)

    def fits(step: Lanestep) -> bool:
        running = [s for s in busy if s is not None]
        if len(running) >= slots:
            return False
        return step.waits or sum(not s.waits for s in running) < cores

    def take() -> tuple[int, Lanestep] | None:
        with turn:
            while True:
                ready = [
                    i
                    for i, left in enumerate(pending)
                    if left and busy[i] is None and fits(left[0])
                ]
                if ready:
                    # max() keeps the first of equals: the lanes' own order.
                    i = max(ready, key=lambda k: sum(s.cost_s for s in pending[k]))
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

    threads = [threading.Thread(target=worker) for _ in range(slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
