"""matrix: each patch on several upstream releases, side by side: by text (does it
apply?) and, with --behaviour, by its tests (does the release still need it?).

Behaviour on a release: the series is committed there as far as each patch goes
(a patch that does not apply is left out, the rest go on), then each patch's
`Tests:` run with the patches below it and without it (and with it, where it
applies), through the same prefix runner and outcome cache as `verify`:
`needed` (fail without, pass with), `upstream-has-it` (pass without),
`tests-need-porting` (fail or error with the patch too, or the text says upstream
has it but the tests disagree), `untested` (no `Tests:`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from xpu_series.commands import Context, Output
from xpu_series.matrix.behaviour import run_matrix
from xpu_series.matrix.table import compared_releases, default_versions
from xpu_series.result import ExitCode
from xpu_series.ui import table

HELP = "each patch on several upstream releases: applies? still needed?"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "versions",
        nargs="*",
        metavar="VERSION",
        help="releases to compare with the pin (default: every newer release "
        "the package index lists)",
    )
    p.add_argument(
        "--wheel",
        action="append",
        metavar="PATH",
        help="a local wheel (its version comes from the file name); repeatable",
    )
    p.add_argument(
        "--behaviour",
        action="store_true",
        help="also run each patch's tests without and with it on every release",
    )
    p.add_argument(
        "--newer",
        action="store_true",
        help="by default, only the releases newer than the pin (not the served "
        "older ones)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="write the served releases below the pin into patches/"
        "matrix-record.json (with --behaviour; commit it: CI trusts unchanged "
        "cells from it and re-measures a seeded sample)",
    )
    p.add_argument(
        "--releases",
        action="store_true",
        help="only print the releases the matrix would compare (the pin, the "
        "served ones and every newer one the index lists), one per line, and "
        "exit: what the matrix reads from outside the checkout",
    )
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel pytest runs")
    p.add_argument(
        "--markdown", action="store_true", help="print the table as markdown"
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        help="also write matrix.json and matrix.md into DIR",
    )


def execute(ctx: Context) -> Output:
    project = ctx.project()
    args = ctx.args
    if args.releases:
        listed = compared_releases(project, default_versions(project))
        return Output(out=listed, data={"releases": listed})
    wheels = [Path(w) for w in args.wheel or []]
    matrix = run_matrix(
        project,
        args.versions,
        wheels,
        ctx.progress,
        args.behaviour,
        args.jobs,
        args.newer,
        ctx.say,
        args.record,
    )
    out = Output(data=matrix.to_json())
    if args.markdown:
        out.out.append(matrix.markdown())
    else:
        out.out.append(table(["patch", *matrix.versions], matrix.rows()))
        gone = [
            f"{row.name}: not needed from {row.no_longer_needed['version']} "
            f"({row.no_longer_needed['why']})"
            for row in matrix.rows_
            if row.no_longer_needed
        ]
        if gone:
            out.out += ["", *gone]
    out.out += [f"note: {d}" for d in matrix.disagreements]
    # DEP-3's Forwarded: the upstream pull request a carried patch was sent as.
    forwarded = {
        p.name: p.header.get("Forwarded")
        for p in project.series().patches
        if p.exists and p.header.get("Forwarded")
    }
    out.out += [f"forwarded: {name} {url}" for name, url in forwarded.items()]
    if forwarded:
        out.data = {**(out.data or {}), "forwarded": forwarded}
    for version, report in matrix.reports.items():
        out.err += [f"error: {version}: {p}" for p in report.problems]
    out.err += [f"error: {e}" for e in matrix.errors]
    out.err += [f"hint: {h}" for h in matrix.hints]
    if args.save:
        folder = Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "matrix.json").write_text(
            json.dumps(matrix.to_json(), indent=2, sort_keys=True) + "\n"
        )
        (folder / "matrix.md").write_text(matrix.markdown() + "\n")
    out.code = ExitCode.OK if matrix.ok else ExitCode.FAILED
    return out
