"""wheel: build the patched sglang as a wheel that pip installs anywhere.

The wheel is the release's own wheel (its sha256 checked against
patches/upstream.toml before it is read) with the files the series changes
replaced by the series' bytes, as the series applies to that release. Its version
carries the series' local label (0.5.23+xpu.s<sha>, the overlay's label), its
dist-info records the series (sha256, patches, the sglang-xpu revision), and an
`sglang.srt.plugins` entry point logs the running series in every server process
(SGLANG_PLUGINS without `xpu_series` turns it off). Built twice from the same
inputs, it is the same bytes (entries sorted and dated SOURCE_DATE_EPOCH, default
1980-01-01).

One wheel per CPython version, as sglang's own: --python-tag cp312, or --python
PATH to build for that interpreter. Exit 4, with nothing written, for a release
the series does not serve or a wheel whose hash is not the recorded one. A
different wheel of the same name in --out is left alone unless --force.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from xpu_series.commands import Context, Output, progress_hook
from xpu_series.fork.wheel import WheelRequest, build_fork_wheel, python_tag

HELP = "build the patched sglang as a reproducible wheel (pip install it anywhere)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream",
        metavar="VERSION",
        help="a served sglang release other than the pin (serves-from .. pin)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where the wheel goes (default: build/wheels)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--python",
        metavar="PATH",
        help="build for this interpreter's CPython version",
    )
    which.add_argument(
        "--python-tag",
        metavar="TAG",
        help="build for this CPython tag, e.g. cp312 (default: the pin's, cp311)",
    )
    p.add_argument(
        "--wheel",
        metavar="PATH",
        help="the release wheel as a local file (offline use; its hash is checked)",
    )
    p.add_argument(
        "--revision",
        metavar="REV",
        help="the sglang-xpu revision to record (default: git HEAD of the project)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a different wheel of the same name in --out",
    )


def execute(ctx: Context) -> Output:
    args = ctx.args
    project = ctx.project()
    tag = python_tag(args.python) if args.python else args.python_tag
    request = WheelRequest(
        out=Path(args.out) if args.out else project.build_dir / "wheels",
        version=args.upstream,
        tag=tag,
        local=ctx.path("wheel"),
        revision=args.revision,
        force=args.force,
        progress=ctx.progress,
    )
    say = (lambda _line: None) if ctx.json else ctx.say
    built = build_fork_wheel(project, request, say, progress_hook(ctx))
    done = {
        "written": "",
        "replaced": " (it replaced a different wheel of that name)",
        "unchanged": " (the same bytes were there already)",
    }[built.state]
    return Output(
        out=[
            f"built {built.path}{done}",
            f"version {built.version} ({len(built.patches)} patches, "
            f"{len(built.files)} files changed)",
            f"size {built.size}",
            f"sha256 {built.sha256}",
            f"from {built.source} (sha256 {built.source_sha256[:12]}..., checked)",
            f"install: pip install --no-deps {built.path}",
        ],
        data=built.to_json(),
    )
