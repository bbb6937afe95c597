"""scripts/profile_ci.py: what it calls each process, which step it charges it
to, and its table; and a real sample of /proc that sees a child's CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import load_script

profile_ci = load_script("profile_ci.py")
Seen = profile_ci.Seen

PY = "/repo/.venv/bin/python"


@pytest.mark.parametrize(
    ("comm", "argv", "expected"),
    [
        ("sglang::schedul", [PY, "-c", "from multiprocessing..."], "sglang::schedul"),
        ("git", ["git", "-C", "/x", "status"], "git"),
        (
            "python",
            [PY, "-m", "pytest", "-q", "-p", "no:x", "test/unit/a.py"],
            "pytest test/unit",
        ),  # fmt: skip
        ("python", [PY, "-m", "pytest", "-q"], "pytest"),
        (
            "python",
            [PY, "-m", "xpu_series", "-C", "/p", "verify", "--all"],
            "xpu-series verify",
        ),  # fmt: skip
        ("python", [PY, "-m", "xpu_series", "--json", "fetch"], "xpu-series fetch"),
        (
            "python",
            [PY, "-m", "xpu_series", "--json", "-C", "/p", "audit"],
            "xpu-series audit",
        ),  # fmt: skip
        (
            "python",
            [PY, "/repo/.venv/bin/xpu-series", "upstream", "--all"],
            "xpu-series upstream",
        ),  # fmt: skip
        (
            "python",
            [PY, "-u", "-m", "sglang.launch_server", "--port", "1"],
            "python -m sglang.launch_server",
        ),  # fmt: skip
        ("python", [PY, "-c", "import sys"], "python -c"),
        ("python", [PY, "scripts/run_steps.py", "--reap", "x"], "run_steps --reap"),
        ("python", [PY, "scripts/check_image.py"], "python check_image.py"),
        ("python3", [], "python"),
    ],
)
def test_each_process_is_named_by_what_it_runs(comm, argv, expected) -> None:
    assert profile_ci.kind(Seen(1, 0, comm, argv)) == expected


def _profile(*procs: Seen):
    profile = profile_ci.Profile()
    for i, seen in enumerate(procs):
        profile.procs[(seen.pid, i)] = seen
        profile.pids.add(seen.pid)
    return profile


def test_a_process_is_charged_to_the_step_whose_reaper_it_descends_from() -> None:
    verify = list(
        next(s for s in profile_ci.run_steps.STEPS if s.tag == "verify").command
    )
    reaper = [PY, "scripts/run_steps.py", "--reap", *verify]
    matrix = list(
        next(s for s in profile_ci.run_steps.STEPS if s.tag == "matrix").command
    )
    profile = _profile(
        Seen(10, 1, "python", [PY, "scripts/run_steps.py"], 0.5, start=1),
        Seen(20, 10, "python", reaper, 0.1, start=2),
        Seen(30, 20, "python", [PY, "-m", "xpu_series", "verify"], 2.0, start=3),
        Seen(40, 30, "git", ["git", "status"], 0.25, start=4),
        Seen(41, 30, "git", ["git", "log"], 0.25, start=4),
        # Its parent died and it came back to the reaper: still verify's.
        Seen(50, 20, "sglang::detoken", [], 3.0, start=5),
        # A reaper whose command is no step's.
        Seen(
            60,
            10,
            "python",
            [PY, "scripts/run_steps.py", "--reap", "nope"],
            1.0,
            start=6,
        ),  # fmt: skip
        # Later, verify is over and a matrix process is given pid 30 again: the
        # two git runs above stay verify's, its own child is the matrix's.
        Seen(
            70,
            10,
            "python",
            [PY, "scripts/run_steps.py", "--reap", *matrix],
            0.0,
            start=20,
        ),  # fmt: skip
        Seen(30, 70, "bash", ["bash", "-c", "matrix"], 0.0, start=21),
        Seen(80, 30, "git", ["git", "am"], 4.0, start=22),
    )
    table = profile_ci.attribute(profile)
    assert dict(table["verify"]) == {
        "run_steps --reap": [0.1, 1],
        "xpu-series verify": [2.0, 1],
        "git": [0.5, 2],
        "sglang::detoken": [3.0, 1],
    }
    assert dict(table["matrix"]) == {
        "run_steps --reap": [0.0, 1], "bash": [0.0, 1], "git": [4.0, 1],
    }  # fmt: skip
    assert dict(table["(runner)"]) == {"python run_steps.py": [0.5, 1]}
    assert dict(table["?"]) == {"run_steps --reap": [1.0, 1]}

    text, data = profile_ci.report(table, {"verify": 7.0}, top=2)
    lines = text.splitlines()
    # Steps by CPU; what was not seen is the step's own total less the seen.
    assert lines[1].split()[:4] == ["verify", "7.0", "5.6", "1.4"]
    assert "sglang::detoken 3.0/1, xpu-series verify 2.0/1" in lines[1]
    assert data["steps"]["verify"]["unseen_s"] == 1.4
    assert data["steps"]["verify"]["kinds"]["git"] == {"cpu_s": 0.5, "processes": 2}


def test_a_sample_of_proc_sees_a_busy_child_and_not_a_stranger() -> None:
    if not os.path.exists("/proc/self/stat"):
        pytest.skip("no /proc: profile_ci reads Linux's /proc")
    busy = (
        "import time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.3:\n    pass\ninput()"
    )
    child = subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE)
    stranger = subprocess.Popen(
        [sys.executable, "-c", "input()"], stdin=subprocess.PIPE
    )
    try:
        profile = profile_ci.Profile()
        # The test's own process stands for scripts/test: its children are seen.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            profile_ci.sample(profile, os.getpid())
            mine = [s for s in profile.procs.values() if s.pid == child.pid]
            if mine and mine[0].cpu_s >= 0.25:
                break
            time.sleep(0.05)
        (seen,) = [s for s in profile.procs.values() if s.pid == child.pid]
        assert seen.cpu_s >= 0.25 and seen.argv[:2] == [sys.executable, "-c"]
        assert stranger.pid in {s.pid for s in profile.procs.values()}
        # Rooted at the busy child: the other child is no descendant of it.
        other = profile_ci.Profile()
        profile_ci.sample(other, child.pid)
        assert {s.pid for s in other.procs.values()} == {child.pid}
    finally:
        for proc in (child, stranger):
            proc.kill()
            proc.wait()
