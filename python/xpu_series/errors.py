"""Errors the library raises; the CLI renders each as one error line plus a hint."""

from __future__ import annotations

from xpu_series.result import ExitCode


class XpuSeriesError(Exception):
    """A failure the user can act on: a message, a next step and an exit code."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(XpuSeriesError):
    """The command line or the project layout is wrong."""

    exit_code = ExitCode.USAGE


class IntegrityError(XpuSeriesError):
    """A hash or the pin does not match what is on disk."""

    exit_code = ExitCode.INTEGRITY


class NetworkError(XpuSeriesError):
    """The package index could not be reached and nothing usable is cached."""


class WheelError(XpuSeriesError):
    """A wheel file is truncated, corrupt or unsafe to unpack."""

    exit_code = ExitCode.INTEGRITY


class SeriesError(XpuSeriesError):
    """The series or a patch file is malformed or unsafe; nothing was applied."""


class TreeError(XpuSeriesError):
    """The target tree is in a state we refuse to touch (dirty, foreign, locked)."""


class GitError(XpuSeriesError):
    """A git command failed in a way the engine did not expect."""


class Interrupted(XpuSeriesError):
    """The run was interrupted; the tree was put back to its last good state."""

    exit_code = ExitCode.FAILED


class StandinError(XpuSeriesError):
    """The CPU stand-in server did not start or died while serving."""
