"""Where a project keeps its pin, its series and its build folders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from xpu_series.errors import UsageError
from xpu_series.stack.operation import OperationStore
from xpu_series.stack.pin import Pin, load_pin
from xpu_series.stack.series import Series, load_series, load_series_for


@dataclass(frozen=True)
class Project:
    """A checkout of sglang-xpu (or a synthetic one made by a test)."""

    root: Path
    # Another project's build folder (range-diff materializes an old revision's
    # patches/ in a scratch folder but builds with the real cache).
    build_root: Path | None = None

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def build_dir(self) -> Path:
        return self.build_root or self.root / "build"

    @property
    def cache_dir(self) -> Path:
        override = os.environ.get("XPU_SERIES_CACHE")
        return Path(override) if override else self.build_dir / "cache"

    @property
    def default_tree(self) -> Path:
        return self.build_dir / "sglang"

    @property
    def operations(self) -> OperationStore:
        """The state of an apply or rebase in progress (`build/operation/`)."""
        return OperationStore(self.build_dir, self.patches_dir)

    @cached_property
    def pin(self) -> Pin:
        return load_pin(self.patches_dir / "upstream.toml")

    def series(self, version: str | None = None, every_retired: bool = False) -> Series:
        """The series; for a release older than the pin, with the retired
        patches that release still needs (`every_retired`: all of them)."""
        if version is None:
            return load_series(self.patches_dir)
        return load_series_for(
            self.patches_dir, version, self.pin.version, every_retired
        )


def find_project(start: Path | None = None) -> Project:
    """The nearest folder at or above `start` that holds patches/upstream.toml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "patches" / "upstream.toml").is_file():
            return Project(candidate)
        # A rebase killed while swapping patches/ in: --continue or --abort
        # must still find the project to put it back.
        if (candidate / "build" / "operation" / "state.json").is_file():
            return Project(candidate)
    raise UsageError(
        f"no patches/upstream.toml in {here} or any parent folder",
        hint="run xpu-series inside an sglang-xpu checkout or pass -C <project>",
    )
