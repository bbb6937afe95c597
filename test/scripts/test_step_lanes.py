"""When scripts/test starts each step (scripts/step_lanes.py): one per core and
one more that waits, the lane with the most work first, and more while the
running steps leave cores idle."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fake_steps, load_script


def span(log: Path, tag: str, seconds: float) -> str:
    """A step's script that notes in `log` when it starts and ends, and sleeps
    `seconds` between."""
    return (
        f'echo "{tag} start $(date +%s.%N)" >>{log}; sleep {seconds}; '
        f'echo "{tag} end $(date +%s.%N)" >>{log}'
    )


def starts(log: Path) -> list[tuple[str, set[str]]]:
    """Each step's start, in time order, with the steps running then."""
    events = sorted(
        (float(t), kind, tag)
        for tag, kind, t in (line.split() for line in log.read_text().splitlines())
    )
    running: set[str] = set()
    starts = []
    for _t, kind, tag in events:
        if kind == "start":
            running.add(tag)
            starts.append((tag, set(running)))
        else:
            running.discard(tag)
    return starts


def test_steps_run_one_per_core_and_the_lanes_keep_their_order(
    steps, tmp_path: Path
) -> None:
    # Each step notes when it started and ended; three lanes, one slot each
    # under -j 1, two under -j 2.
    log = tmp_path / "build" / "spans"
    log.parent.mkdir()
    fake_steps(
        steps,
        ("bootstrap", "true", "first", 60),
        *[(f"{lane}{k}", span(log, f"{lane}{k}", 0.3), lane, 60)
          for lane in ("tool", "proof", "serve") for k in (1, 2)],
    )  # fmt: skip

    assert steps.main(["--fresh", "-j", "1"]) == 0
    seen = starts(log)
    assert max(len(running) for _tag, running in seen) == 1
    order = [tag for tag, _running in seen]
    for lane in ("tool", "proof", "serve"):
        assert order.index(f"{lane}1") < order.index(f"{lane}2")
    log.unlink()
    assert steps.main(["--fresh", "-j", "2"]) == 0
    assert max(len(running) for _tag, running in starts(log)) == 2


def test_a_step_that_waits_runs_as_one_step_more_than_the_cores(
    steps, tmp_path: Path
) -> None:
    # Four lanes, each a step that sleeps; two of them mostly wait.
    log = tmp_path / "build" / "spans"
    log.parent.mkdir()
    steps.STEPS = (
        steps.Step("bootstrap", "boot", steps.sh("true"), "first"),
        *(
            steps.Step(tag, tag, steps.sh(span(log, tag, 0.4)), lane, waits=waits)
            for tag, lane, waits in (
                ("light1", "tool", True), ("light2", "proof", True),
                ("heavy1", "serve", False), ("heavy2", "install", False),
                ("heavy3", "upstream", False),
            )
        ),
    )  # fmt: skip

    assert steps.main(["--fresh", "-j", "2"]) == 0
    seen = [running for _tag, running in starts(log)]
    # Never more than one step over the cores, and never over them in steps
    # that do not wait; but the extra one did run.
    assert max(len(s) for s in seen) == 3
    assert all(sum(t.startswith("heavy") for t in s) <= 2 for s in seen)
    log.unlink()
    # One job is one step at a time, waiting or not.
    assert steps.main(["--fresh", "-j", "1"]) == 0
    assert max(len(running) for _tag, running in starts(log)) == 1


def test_a_free_core_goes_to_the_lane_with_the_most_work_left(
    steps, tmp_path: Path
) -> None:
    # One core: the order steps start in is the scheduler's choice alone.
    log = tmp_path / "build" / "order"
    log.parent.mkdir()
    steps.STEPS = (
        steps.Step("bootstrap", "boot", steps.sh("true"), "first"),
        *(
            steps.Step(tag, tag, steps.sh(f"echo {tag} >>{log}"), lane, cost_s=cost)
            for tag, lane, cost in (
                ("tool1", "tool", 10), ("tool2", "tool", 10),
                ("serve1", "serve", 100), ("serve2", "serve", 5),
                ("proof1", "proof", 30),
            )
        ),
    )  # fmt: skip
    assert steps.main(["--fresh", "-j", "1"]) == 0
    # serve has 105 left, then proof 30 against serve's 5 and tool's 20, ...
    assert log.read_text().split() == ["serve1", "proof1", "tool1", "tool2", "serve2"]


class Idle:
    """A load that always reads `cores` idle."""

    def __init__(self, cores: float) -> None:
        self.cores = cores

    def idle_cores(self) -> float | None:
        return self.cores


def _five_lanes(steps, log: Path) -> None:
    """Five lanes of a step each that sleeps, none of them `waits`."""
    steps.STEPS = (
        steps.Step("bootstrap", "boot", steps.sh("true"), "first"),
        *(
            steps.Step(f"s{k}", f"s{k}", steps.sh(span(log, f"s{k}", 1.0)), lane)
            for k, lane in enumerate(("tool", "proof", "serve", "install", "upstream"))
        ),
    )


@pytest.fixture
def quick_lanes(steps, monkeypatch: pytest.MonkeyPatch):
    """The runner, looking at the load often and soon after a start."""
    monkeypatch.setattr(steps.step_lanes, "SETTLE_S", 0.2)
    monkeypatch.setattr(steps.step_lanes, "POLL_S", 0.05)
    return steps


def test_steps_start_into_the_cores_the_running_ones_leave_idle(
    quick_lanes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    steps = quick_lanes
    log = tmp_path / "build" / "spans"
    log.parent.mkdir()
    _five_lanes(steps, log)
    monkeypatch.setattr(steps.step_lanes, "Load", lambda: Idle(1.2))
    assert steps.main(["--fresh", "-j", "2"]) == 0
    # Two at first; then, with a core idle, two more, one at a time, and no more.
    seen = [running for _tag, running in starts(log)]
    assert [len(s) for s in seen[:2]] == [1, 2]
    assert max(len(s) for s in seen) == 4
    out = capsys.readouterr().out
    assert "[lanes] 1.2 of 2 cores idle over the last 8 s:" in out
    assert out.count("cores idle over the last") >= 2

    # Busy cores: the lanes' limits alone, as with --no-fill or one job.
    for load, args in ((Idle(0.3), []), (Idle(1.2), ["--no-fill"])):
        log.unlink()
        monkeypatch.setattr(steps.step_lanes, "Load", lambda load=load: load)
        assert steps.main(["--fresh", "-j", "2", *args]) == 0
        assert max(len(running) for _tag, running in starts(log)) == 2
    log.unlink()
    monkeypatch.setattr(steps.step_lanes, "Load", lambda: Idle(1.0))
    assert steps.main(["--fresh", "-j", "1"]) == 0
    assert max(len(running) for _tag, running in starts(log)) == 1
    assert "cores idle" not in capsys.readouterr().out


def test_a_step_started_into_idle_cores_waits_for_the_last_start_to_settle(
    quick_lanes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = quick_lanes
    log = tmp_path / "build" / "spans"
    log.parent.mkdir()
    _five_lanes(steps, log)
    monkeypatch.setattr(steps.step_lanes, "Load", lambda: Idle(1.5))
    # Longer than the steps run: the two first ones end before any other starts.
    monkeypatch.setattr(steps.step_lanes, "SETTLE_S", 5.0)
    assert steps.main(["--fresh", "-j", "2"]) == 0
    assert max(len(running) for _tag, running in starts(log)) == 2


def test_the_load_is_the_idle_cores_over_a_whole_window(tmp_path: Path) -> None:
    lanes = load_script("step_lanes.py")
    stat = tmp_path / "stat"
    now = [0.0]
    load = lanes.Load(path=stat, window_s=8.0, clock=lambda: now[0])
    tick = load.tick

    def at(seconds: float, idle_s: float, iowait_s: float = 0.0) -> float | None:
        now[0] = seconds
        idle, iowait = round(idle_s * tick), round(iowait_s * tick)
        stat.write_text(f"cpu  500 0 200 {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3\n")
        return load.idle_cores()

    assert at(0, 100) is None  # nothing to compare yet
    assert at(4, 102) is None  # less than a window
    # 8 s later, 6 s of idle and 2 of iowait: one core idle on average.
    assert at(8, 106, 2) == pytest.approx(1.0)
    # The oldest sample a window back stays: 9 s then.
    assert at(9, 107.5, 2) == pytest.approx((107.5 + 2 - 100) / 9)
    # A long silence averages over much more than a window: not told...
    assert at(40, 140, 2) is None
    # ...until a whole window has passed since.
    assert at(48, 144, 2) == pytest.approx(0.5)
    stat.write_text("garbage\n")
    assert load.idle_cores() is None
    stat.unlink()
    assert load.idle_cores() is None
