"""overlay: write the series into an installed sglang (the XPU image's, a venv's).

Checks before writing: the installed release is one the series serves (and the one
--upstream names), it has a RECORD, and every file the series patches is byte for
byte that release's (compared with the blob ids in the patch files; no wheel
needed). A mismatch names each file and writes nothing (exit 4).

The write is all or nothing (a journal beside the install; the next run or --undo
finishes an interrupted one). The install stays consistent for pip: RECORD has the
new hashes and the version carries a local label naming the series
(0.5.23+xpu.s<sha>); the provenance record (pin, series sha256, each patch's sha256,
our revision) and the original bytes live in the dist-info, so `pip uninstall`
removes everything and `--undo` gives every original byte back.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from xpu_series.commands import Context, Output
from xpu_series.errors import SeriesError, UsageError
from xpu_series.git import Git
from xpu_series.overlay.installed import OverlayReport, python_site, read_status
from xpu_series.overlay.plan import describe, export_text, release_diff_path
from xpu_series.overlay.undo import run_undo
from xpu_series.overlay.write import run_overlay
from xpu_series.project import Project
from xpu_series.result import ExitCode
from xpu_series.stack.build import ScratchRequest, allowed_prefixes, build_scratch
from xpu_series.stack.tree import read_record

HELP = "write the series into an installed sglang (undoable; checked first)"


def run_export(project: Project, release: str, check: bool) -> tuple[Path, bool]:
    """Apply the series to `release` in a scratch tree and write (or, with `check`,
    compare) patches/overlay/<release>.diff; returns the path and whether it was
    already up to date."""
    if release == project.pin.version:
        raise UsageError(
            f"{release} is the pin: the overlay uses the patch files themselves",
            hint="export an older release the series serves",
        )
    describe(project, release)  # refuses a release the series does not serve
    tree = project.build_dir / "overlay-export" / release
    report = build_scratch(project, ScratchRequest(tree=tree, version=release))
    bad = report.problems + [o.name for o in report.patches if not o.status.ok]
    if bad:
        raise SeriesError(
            f"the series does not apply to sglang {release} ({', '.join(bad)})",
            hint=f"run 'xpu-series check --upstream {release}' to see why",
        )
    git = Git(tree)
    base = read_record(git)["base"]
    diff = git.run(
        "diff", "--full-index", "--no-renames", base, report.head, "--",
        *allowed_prefixes(project),
    ).stdout  # fmt: skip
    text = export_text(project, release, diff)
    path = release_diff_path(project, release)
    same = path.is_file() and path.read_text(encoding="utf-8") == text
    if not check and not same:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path, same


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--into",
        metavar="SITE_DIR",
        help="the site-packages folder that holds the installed sglang/",
    )
    where.add_argument(
        "--python",
        metavar="PATH",
        help="the Python whose sglang to overlay (its site folder is found for you)",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--undo",
        action="store_true",
        help="restore every original byte the overlay replaced",
    )
    what.add_argument(
        "--describe",
        action="store_true",
        help="print what an overlay for --upstream (default: the pin) installs: "
        "series sha256, version label, patches (no target needed)",
    )
    what.add_argument(
        "--export",
        metavar="VERSION",
        help="write patches/overlay/VERSION.diff: the series as it applies to an "
        "older served release (with --check: only say whether it is current)",
    )
    what.add_argument(
        "--status",
        action="store_true",
        help="say what is installed: release, overlay provenance, files intact",
    )
    p.add_argument(
        "--upstream",
        metavar="VERSION",
        help="the sglang release the install must be (default: whatever is "
        "installed, if the series serves it)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="with --export: exit 1 if the committed diff is not what export writes",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --undo: restore the originals even over files edited since",
    )
    p.add_argument(
        "--revision",
        metavar="REV",
        help="the sglang-xpu revision to record (default: git HEAD of the project)",
    )


def _site(ctx: Context) -> Path:
    if ctx.args.python:
        return python_site(ctx.args.python)
    return Path(ctx.args.into)


def _render_status(report: OverlayReport, out: Output) -> None:
    prov = report.provenance
    out.out.append(f"sglang {report.version} in {report.site}")
    if report.repaired == "pending":
        out.out.append(
            "an interrupted overlay or undo is pending: run the overlay (or "
            "--undo) again to finish it"
        )
    if prov is None:
        out.out.append("no overlay: sglang as installed")
        return
    out.out.append(
        f"overlay of the sglang-xpu series sha256 {prov['series_sha256']} "
        f"(pin {prov['pin']['version']}, {prov['tool']}, revision "
        f"{prov['revision'] or 'unknown'}{' +dirty' if prov['revision_dirty'] else ''})"
    )
    for patch in prov["patches"]:
        retired = " (retired upstream later; carried here)" if patch["retired"] else ""
        out.out.append(f"  {patch['name']}  sha256 {patch['sha256'][:16]}{retired}")
    changed = [f["path"] for f in report.files if f["state"] != "intact"]
    out.out.append(
        f"files: {len(report.files) - len(changed)} of {len(report.files)} intact"
    )
    if changed:
        out.code = ExitCode.FAILED
        out.error(
            "changed since the overlay: " + ", ".join(changed),
            hint=f"run 'xpu-series overlay --undo --force --into {report.site}', "
            "then overlay again",
        )


def execute(ctx: Context) -> Output:
    args = ctx.args
    if args.force and not args.undo:
        raise UsageError("--force only goes with --undo")
    if args.check and not args.export:
        raise UsageError("--check only goes with --export")
    if args.export:
        project = ctx.project()
        path, same = run_export(project, args.export, args.check)
        rel = path.relative_to(project.root).as_posix()
        out = Output(data={"ok": same or not args.check, "path": rel, "current": same})
        if same:
            out.out.append(f"{rel} is current")
        elif args.check:
            out.code = ExitCode.FAILED
            out.error(
                f"{rel} is not what the series gives on sglang {args.export}",
                hint=f"run 'xpu-series overlay --export {args.export}' and commit it",
            )
        else:
            out.out.append(f"wrote {rel}")
        return out
    if args.describe:
        data = describe(ctx.project(), args.upstream)
        lines = [
            f"release {data['release']}",
            f"series sha256 {data['series_sha256']}",
            f"version {data['version']}",
            *(f"  {name}" for name in data["patches"]),
        ]
        return Output(out=lines, data=data)
    if not (args.into or args.python):
        raise UsageError(
            "say which install: --into SITE_DIR or --python PATH",
            hint="xpu-series overlay --into /opt/venv/lib/python3.12/site-packages",
        )
    site = _site(ctx)
    if args.status:
        report = read_status(site)
        out = Output(data=report.to_json())
        _render_status(report, out)
        return out
    if args.undo:
        report = run_undo(site, force=args.force)
        out = Output(data=report.to_json())
        if report.repaired:
            out.out.append(f"finished an interrupted {report.repaired} first")
        if not report.changed:
            out.out.append(
                f"nothing to undo: {report.site} has sglang {report.version} as "
                "installed"
            )
        else:
            out.out.append(
                f"restored sglang {report.version} in {report.site}: every file "
                "the overlay replaced has its original bytes"
            )
        return out
    report = run_overlay(ctx.project(), site, args.upstream, args.revision)
    out = Output(data=report.to_json())
    if report.repaired:
        out.out.append(f"finished an interrupted {report.repaired} first")
    prov = report.provenance or {}
    if not report.changed:
        out.out.append(
            f"already overlaid: {report.site} has sglang {report.version} "
            f"(series sha256 {prov.get('series_sha256', '')[:12]}); nothing to do"
        )
        return out
    out.out.append(
        f"overlaid sglang {report.release} in {report.site} with "
        f"{len(prov['patches'])} patches ({len(report.files)} files); it now "
        f"reports {report.version}"
    )
    for rel in (f["path"] for f in report.files):
        out.out.append(f"  {rel}")
    out.out.append(
        f"check it: xpu-series overlay --status --into {report.site}; "
        f"undo it: xpu-series overlay --undo --into {report.site}"
    )
    return out
