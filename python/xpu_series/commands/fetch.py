"""fetch: get the pinned upstream wheel into the cache and prove its sha256."""

from __future__ import annotations

from pathlib import Path

from xpu_series.project import Project
from xpu_series.wheel import FetchedWheel, fetch_wheel


def run_fetch(
    project: Project,
    version: str | None = None,
    wheel: Path | None = None,
    progress: bool = False,
) -> FetchedWheel:
    pin = project.pin.for_version(version or project.pin.version)
    return fetch_wheel(pin, project.cache_dir, local=wheel, progress=progress)
