"""fetch: get the pinned upstream wheel into the cache and prove its sha256."""

from __future__ import annotations

import argparse
from pathlib import Path

from xpu_series.commands import Context, Output, add_upstream
from xpu_series.project import Project
from xpu_series.stack.wheel import FetchedWheel, fetch_wheel

HELP = "get the pinned wheel into the cache, verify its sha256"


def run_fetch(
    project: Project,
    version: str | None = None,
    wheel: Path | None = None,
    progress: bool = False,
) -> FetchedWheel:
    pin = project.pin.for_version(version or project.pin.version)
    return fetch_wheel(pin, project.cache_dir, local=wheel, progress=progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_upstream(p)


def execute(ctx: Context) -> Output:
    project = ctx.project()
    wheel = run_fetch(project, ctx.args.upstream, ctx.path("wheel"), ctx.progress)
    state = "sha256 verified against the pin" if wheel.pinned else "not the pin"
    return Output(
        out=[f"{wheel.path} ({wheel.source}; {state})", f"sha256 {wheel.sha256}"],
        data={
            "upstream": {"version": wheel.version, "sha256": wheel.sha256},
            "path": str(wheel.path),
            "pinned": wheel.pinned,
            "source": wheel.source,
            "ok": True,
        },
    )
