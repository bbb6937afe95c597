"""The processes of scripts/test's steps: waiting with their CPU, reaping what
they leave behind, stopping them. Standard library only (see run_steps.py)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def wait_counted(proc: subprocess.Popen[bytes]) -> tuple[int, float, float]:
    """The exit code, CPU seconds and system seconds of the process and what it
    waited for (wait4's rusage: per step, where the whole run's would mix the
    lanes)."""
    while True:
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped elsewhere: no rusage to read
            return proc.wait(), 0.0, 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime, usage.ru_stime


# prctl(2): orphans of this process's descendants are reparented to it.
_PR_SET_CHILD_SUBREAPER = 36
# How long what a step leaves running may go on before it is stopped.
GRACE_ENV = "XPU_SERIES_LEFTOVER_GRACE_S"
LEFTOVER_GRACE_S = 20.0


def reap(command: list[str]) -> int:
    """Run a step's command as a child subreaper: a process it starts whose
    parent dies first (a server's scheduler, a stopped test's workers) comes
    back here and is waited for, so the step's CPU counts it (wait4 sees only
    what was waited for) and none outlives the step: what still runs
    LEFTOVER_GRACE_S after the command ended is stopped. The command's exit
    code is the step's."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, as before
    try:
        proc = subprocess.Popen(command)
    except OSError as exc:
        print(f"cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    code = proc.wait()
    grace = float(os.environ.get(GRACE_ENV) or LEFTOVER_GRACE_S)
    deadline, stopped = time.monotonic() + grace, False
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0]:
                continue
        except ChildProcessError:
            return code
        if time.monotonic() > deadline and not stopped:
            left = _children()
            print(f"note: {len(left)} process(es) outlived the step: stopped",
                  file=sys.stderr)  # fmt: skip
            for child in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            stopped = True
        time.sleep(0.1)


def _children() -> list[int]:
    """This process's children (Linux: the 4th field of /proc/PID/stat)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if stat.read_text().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
                found.append(int(stat.parent.name))
    return found


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
