"""When scripts/test starts each step (scripts/step_lanes.py): one step more
than the cores, the lane with the most work first."""

from __future__ import annotations

from pathlib import Path

from conftest import fake_steps


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


def lanes_of(steps, *specs: tuple[str, str, str, dict]) -> None:
    """A bootstrap that does nothing, then one step per (tag, lane, shell
    script, Step's other fields)."""
    steps.STEPS = (
        steps.Step("bootstrap", "boot", steps.sh("true"), "first"),
        *(
            steps.Step(tag, tag, steps.sh(script), lane, **extra)
            for tag, lane, script, extra in specs
        ),
    )


def test_steps_run_one_per_core_and_the_lanes_keep_their_order(
    steps, tmp_path: Path
) -> None:
    # Each step notes when it started and ended; three lanes, one step at a
    # time under -j 1, three (two cores and one more) under -j 2.
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
    assert max(len(running) for _tag, running in starts(log)) == 3


def test_any_step_runs_as_the_one_more_than_the_cores(steps, tmp_path: Path) -> None:
    # Five lanes, each a step that sleeps: on two cores three run at once,
    # whichever they are, and never a fourth.
    log = tmp_path / "build" / "spans"
    log.parent.mkdir()
    lanes_of(steps, *(
        (tag, lane, span(log, tag, 0.4), {})
        for tag, lane in (
            ("s1", "tool"), ("s2", "proof"), ("s3", "serve"), ("s4", "install"),
            ("s5", "upstream"),
        )
    ))  # fmt: skip

    assert steps.main(["--fresh", "-j", "2"]) == 0
    seen = [running for _tag, running in starts(log)]
    assert max(len(s) for s in seen) == 3
    assert len(seen) == 5
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
    lanes_of(steps, *(
        (tag, lane, f"echo {tag} >>{log}", {"cost_s": cost})
        for tag, lane, cost in (
            ("tool1", "tool", 10), ("tool2", "tool", 10),
            ("serve1", "serve", 100), ("serve2", "serve", 5),
            ("proof1", "proof", 30),
        )
    ))  # fmt: skip
    assert steps.main(["--fresh", "-j", "1"]) == 0
    # serve has 105 left, then proof 30 against serve's 5 and tool's 20, ...
    assert log.read_text().split() == ["serve1", "proof1", "tool1", "tool2", "serve2"]


def test_a_replay_orders_steps_as_the_lanes_do_and_costs_decide_the_end() -> None:
    import threading
    from dataclasses import dataclass

    from conftest import load_script

    lanes_module = load_script("step_lanes.py")

    @dataclass(frozen=True)
    class Fake:
        tag: str
        seconds: float
        cost_s: int

    def lanes(long_cost: int) -> list[list[Fake]]:
        return [
            [Fake("b", 10, 10)], [Fake("c", 10, 10)], [Fake("d", 10, 10)],
            [Fake("a", 30, long_cost)],
        ]  # fmt: skip

    def took(step: Fake) -> float:
        return step.seconds

    # Two cores, three slots: the long lane first when its cost says so, and it
    # ends the run alone when its cost understates it.
    assert lanes_module.replay(lanes(30), 2, took) == 30
    assert lanes_module.replay(lanes(1), 2, took) == 40
    # One core, one slot: one after another, whatever the costs.
    assert lanes_module.replay(lanes(1), 1, took) == 60
    # The same choice as the threaded scheduler: the order steps start in.
    order: list[str] = []
    lock = threading.Lock()

    def work(step: Fake) -> None:
        with lock:
            order.append(step.tag)

    lanes_module.run_lanes(lanes(1), 1, work)
    assert order == ["b", "c", "d", "a"]
    order.clear()
    lanes_module.run_lanes(lanes(30), 1, work)
    assert order == ["a", "b", "c", "d"]
