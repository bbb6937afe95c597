"""Run the CLI in a child that delivers a real signal to itself at one point of an
apply or rebase: `python interrupter.py WHERE SIGNAL -C PROJECT VERB ...`.

WHERE is a phase name (the state was just saved with that phase), `checkout`
(a new tree is cloned, not yet renamed in), `patchK` (right after the k-th patch
was committed, before the state says so), `write` (between the two renames that
swap the new patches/ in), or a point of an overlay: `stageK` (after the k-th
entry is staged, before the journal is committed), `commit` (the journal was just
committed, nothing replaced yet) or `entryK` (right after the k-th file was
replaced).
"""

import os
import signal
import sys

from xpu_series import cli
from xpu_series.overlay import write as overlay
from xpu_series.rebase import steps as rebase
from xpu_series.stack import engine, sequencer, tree


def arm(where: str, sig: int) -> None:
    """Patch the one function that stands at `where` so it signals this process."""

    def hit() -> None:
        os.kill(os.getpid(), sig)

    if where == "checkout":
        real_configure = tree._configure

        def configure(git):
            real_configure(git)
            hit()

        tree._configure = configure
    elif where.startswith("patch"):
        k, calls, real_commit = int(where[5:]), [], engine.commit_patch

        def commit(*args, **kwargs):
            calls.append(1)
            out = real_commit(*args, **kwargs)
            if len(calls) == k:
                hit()
            return out

        engine.commit_patch = commit
    elif where.startswith(("stage", "entry")):
        name = "_stage_entry" if where.startswith("stage") else "_write_entry"
        k, calls, real = int(where[5:]), [], getattr(overlay, name)

        def step(*args, **kwargs):
            out = real(*args, **kwargs)
            calls.append(1)
            if len(calls) == k:
                hit()
            return out

        setattr(overlay, name, step)
    elif where == "commit":
        real_commit_journal = overlay._commit_journal

        def commit_journal(*args):
            real_commit_journal(*args)
            hit()

        overlay._commit_journal = commit_journal
    elif where == "write":

        def swap(new, target, old):
            os.replace(target, old)  # the first of the two renames, then death
            hit()

        rebase.swap_in = swap
    else:
        real_save = sequencer.Runner.save

        def save(self, phase=None):
            real_save(self, phase)
            if phase == where:
                hit()

        sequencer.Runner.save = save


if __name__ == "__main__":
    # As at a terminal: a job started in the background by a shell (a CI runner,
    # a benchmark) inherits SIGINT ignored, and then Python never raises
    # KeyboardInterrupt. The tests are about what Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    arm(sys.argv[1], getattr(signal, sys.argv[2]))
    sys.exit(cli.main(sys.argv[3:]))
