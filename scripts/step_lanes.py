"""When each step of scripts/test starts: lanes, cores, and the cores its steps
leave idle. Standard library only (see run_steps.py)."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol


class Lanestep(Protocol):
    """What the scheduler reads of a step (run_steps.Step)."""

    tag: str
    cost_s: int
    waits: bool


# The machine's idle time is averaged over this long: a server start, a pip
# install or a test's timeout leaves a core idle for longer than that.
WINDOW_S = 8.0
# A step may start beside the others when this many cores have been idle...
FILL_IDLE_CORES = 0.5
# ...since at least this long after the last start: a step that has just
# started is still starting its interpreters, and has not yet shown its load.
SETTLE_S = 10.0
# How often a scheduler with steps waiting to start looks at the load.
POLL_S = 1.0
# Steps at once past the cores, at most, when they leave cores idle (memory:
# each may start a server of the stand-in).
FILL_MAX_EXTRA = 2


class Load:
    """The idle cores of this machine over the last WINDOW_S seconds, from
    /proc/stat: every process counts, ours or not, since all share the cores."""

    def __init__(
        self,
        path: Path = Path("/proc/stat"),
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.window_s = window_s
        self.clock = clock
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.samples: deque[tuple[float, int]] = deque()

    def _idle_ticks(self) -> int | None:
        try:
            with self.path.open() as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if len(fields) < 6 or fields[0] != "cpu":
            return None
        # idle and iowait: a core waiting on a disk is a core no one computes on.
        return int(fields[4]) + int(fields[5])

    def idle_cores(self) -> float | None:
        """Samples now. The average number of idle cores over the window, or
        None until the samples span one (or where /proc/stat cannot be read)."""
        ticks = self._idle_ticks()
        if ticks is None:
            return None
        now = self.clock()
        self.samples.append((now, ticks))
        # Keep the newest sample at least a window old, and nothing older.
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        then, before = self.samples[0]
        # Less than a window seen, or a gap that would average over much more.
        if not self.window_s <= now - then <= 2 * self.window_s:
            return None
        return (ticks - before) / self.tick / (now - then)


def run_lanes(
    lanes: Sequence[Sequence[Lanestep]],
    jobs: int,
    work: Callable[[Lanestep], None],
    load: Load | None = None,
    say: Callable[[str], None] = lambda _text: None,
) -> None:
    """Run `work` on every step: each lane's in its order and one at a time, up
    to `jobs` steps at once, and with two jobs or more, one step more if it
    `waits`. A free slot goes to the ready lane with the most cost_s left whose
    next step fits: the longest lane starts first, so the run ends when the
    cores run out of work, not when a lane started late is left to run alone.

    With `load`, a step may also start past those limits (by FILL_MAX_EXTRA at
    most) when the steps running have left FILL_IDLE_CORES idle for a window
    and none started in the last SETTLE_S seconds: their servers start and
    stop, their tests wait out timeouts, and a core that waits with them is
    time the run loses. `say` tells each such start."""
    pending = [list(lane) for lane in lanes]
    busy: list[Lanestep | None] = [None] * len(pending)
    turn = threading.Condition()
    cores = max(1, jobs)
    slots = cores + (1 if cores > 1 else 0)
    filling = load is not None and cores > 1
    last_start = [float("-inf")]

    def fits(step: Lanestep) -> bool:
        running = [s for s in busy if s is not None]
        if len(running) >= slots:
            return False
        return step.waits or sum(not s.waits for s in running) < cores

    def idle_enough() -> float | None:
        """The idle cores when a step may start past the limits, else None."""
        # Sampled on every look, so that the window is whole when it counts.
        idle = load.idle_cores() if load is not None and filling else None
        running = sum(s is not None for s in busy)
        if idle is None or idle < FILL_IDLE_CORES or not running:
            return None
        if running >= cores + FILL_MAX_EXTRA:
            return None
        return idle if time.monotonic() - last_start[0] >= SETTLE_S else None

    def take() -> tuple[int, Lanestep] | None:
        with turn:
            while True:
                ready = [
                    i for i, left in enumerate(pending) if left and busy[i] is None
                ]
                fit = [i for i in ready if fits(pending[i][0])]
                idle = None if fit or not ready else idle_enough()
                if fit or idle is not None:
                    # max() keeps the first of equals: the lanes' own order.
                    i = max(
                        fit or ready, key=lambda k: sum(s.cost_s for s in pending[k])
                    )
                    busy[i] = step = pending[i].pop(0)
                    last_start[0] = time.monotonic()
                    if idle is not None:
                        others = sum(s is not None for s in busy) - 1
                        say(
                            f"[lanes] {idle:.1f} of {cores} cores idle over the last "
                            f"{WINDOW_S:.0f} s: {step.tag} starts beside {others} "
                            "steps"
                        )
                    return i, step
                if all(s is None for s in busy):
                    return None
                turn.wait(timeout=POLL_S if filling and ready else None)

    def worker() -> None:
        while (got := take()) is not None:
            lane, step = got
            try:
                work(step)
            finally:
                with turn:
                    busy[lane] = None
                    turn.notify_all()

    # One thread per step that may run at once: the slots, or those past them.
    count = cores + FILL_MAX_EXTRA if filling else slots
    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
