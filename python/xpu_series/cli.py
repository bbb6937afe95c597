"""xpu-series: apply, check and maintain the sglang-xpu patch series on a pinned
upstream SGLang."""

# This is the only module that prints or exits; the library returns results.

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xpu_series import __version__
from xpu_series.commands.apply import ApplyOptions, link_venv, run_apply
from xpu_series.commands.check import run_check
from xpu_series.commands.fetch import run_fetch
from xpu_series.commands.matrix import run_matrix
from xpu_series.commands.refresh import run_refresh
from xpu_series.commands.status import run_status
from xpu_series.commands.verify import run_verify
from xpu_series.errors import XpuSeriesError
from xpu_series.project import Project, find_project
from xpu_series.result import ExitCode
from xpu_series.series import Patch
from xpu_series.ui import render_report, table


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _emit_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _project(args: argparse.Namespace) -> Project:
    return find_project(Path(args.project) if args.project else None)


def _tree(args: argparse.Namespace, project: Project) -> Path:
    return Path(args.tree).resolve() if args.tree else project.default_tree


def _progress(args: argparse.Namespace) -> bool:
    return not args.json and sys.stderr.isatty()


def cmd_fetch(args: argparse.Namespace) -> int:
    project = _project(args)
    wheel = run_fetch(
        project,
        args.upstream,
        Path(args.wheel) if args.wheel else None,
        _progress(args),
    )
    data = {
        "upstream": {"version": wheel.version, "sha256": wheel.sha256},
        "path": str(wheel.path),
        "pinned": wheel.pinned,
        "source": wheel.source,
        "ok": True,
    }
    if args.json:
        _emit_json(data)
    else:
        state = "sha256 verified against the pin" if wheel.pinned else "not the pin"
        print(f"{wheel.path} ({wheel.source}; {state})")
        print(f"sha256 {wheel.sha256}")
    return ExitCode.OK


def _patch_progress(args: argparse.Namespace) -> Callable[[Patch, int, int], None]:
    def show(patch: Patch, index: int, total: int) -> None:
        if _progress(args):
            _err(f"[{index + 1}/{total}] {patch.name}")

    return show


def cmd_apply(args: argparse.Namespace) -> int:
    project = _project(args)
    tree = _tree(args, project)
    options = ApplyOptions(
        tree=tree,
        version=args.upstream,
        wheel=Path(args.wheel) if args.wheel else None,
        force=args.force,
        progress=_progress(args),
    )
    report = run_apply(project, options, on_patch=_patch_progress(args))
    if report.head and tree == project.default_tree and not args.no_link:
        pth = link_venv(project, tree)
        if pth:
            report.notes.append(f"this virtualenv imports sglang from {tree}/python")
    if args.json:
        _emit_json(report.to_json())
    else:
        print(render_report(report))
        _problems(report.problems)
        if report.exit_code == ExitCode.CONFLICT:
            bad = next(p for p in report.patches if not p.status.ok)
            _err(f"error: {bad.name} does not apply ({bad.detail})")
            _err(
                f"hint: resolve it by hand with 'git -C {tree} am -3 "
                f"{project.patches_dir / bad.name}', then run 'xpu-series refresh'"
            )
    return report.exit_code


def _problems(problems: Sequence[str]) -> None:
    for problem in problems:
        _err(f"error: {problem}")
    if problems:
        _err("hint: fix patches/ (run 'xpu-series check' to list every problem)")


def cmd_check(args: argparse.Namespace) -> int:
    project = _project(args)
    report = run_check(
        project,
        args.upstream,
        Path(args.wheel) if args.wheel else None,
        _progress(args),
    )
    if args.json:
        _emit_json(report.to_json())
    else:
        print(render_report(report))
        _problems(report.problems)
        print("ok: the series applies" if report.ok else "the series does not apply")
    # check is a dry run: nothing waits for a human, so a conflict is a plain failure.
    return ExitCode.OK if report.ok else ExitCode.FAILED


def cmd_status(args: argparse.Namespace) -> int:
    project = _project(args)
    status = run_status(project, _tree(args, project))
    if args.json:
        _emit_json(status.to_json())
        return ExitCode.OK
    pin = status.pin
    print(f"pin: sglang {pin['version']} {pin['wheel']} sha256 {pin['sha256'][:12]}")
    if not status.exists:
        print(f"tree: {status.tree} (not materialized; run 'xpu-series apply')")
        return ExitCode.OK
    up = status.upstream
    print(f"tree: {status.tree} on sglang {up['version']} ({up['commit'][:12]})")
    rows = [[p["name"], p["status"], p["commit"][:12]] for p in status.patches]
    print(table(["patch", "status", "commit"], rows))
    for line in status.local_edits:
        print(f"local edit: {line}")
    for line in status.unexported_commits:
        print(f"not exported: {line} (run 'xpu-series refresh')")
    if status.series_changed:
        print("patches/ changed since the last apply (run 'xpu-series apply')")
    return ExitCode.OK


def cmd_refresh(args: argparse.Namespace) -> int:
    project = _project(args)
    result = run_refresh(project, _tree(args, project))
    if args.json:
        _emit_json(result.to_json())
        return ExitCode.OK
    for name in result.written:
        print(f"wrote {name}")
    for name in result.removed:
        print(f"removed {name} (no longer a commit in the tree)")
    print(f"{len(result.unchanged)} unchanged, {len(result.written)} written")
    return ExitCode.OK


def cmd_verify(args: argparse.Namespace) -> int:
    project = _project(args)
    result = run_verify(project, jobs=args.jobs)
    if args.json:
        _emit_json(result.to_json())
    else:
        if not result.apply.ok:
            print(render_report(result.apply))
            _problems(result.apply.problems)
        rows = [
            [
                p.name,
                ", ".join(Path(t.split("::")[0]).name for t in p.tests) or "-",
                f"failed {p.without.failed}",
                f"passed {p.with_patch.passed}",
                p.verdict,
            ]
            for p in result.proofs
        ]
        print(table(["patch", "tests", "without", "with", "verdict"], rows))
        if args.verbose:
            for key, log in sorted(result.logs.items()):
                print(f"--- {key}\n{log}")
        elif not result.ok:
            _err("hint: re-run with -v to see the pytest output of each prefix")
    return ExitCode.OK if result.ok else ExitCode.FAILED


def cmd_matrix(args: argparse.Namespace) -> int:
    project = _project(args)
    matrix = run_matrix(
        project, args.versions, [Path(w) for w in args.wheel or []], _progress(args)
    )
    if args.json:
        _emit_json(matrix.to_json())
        return ExitCode.OK
    print(table(["patch", *matrix.reports], matrix.rows()))
    for version, report in matrix.reports.items():
        _problems([f"{version}: {p}" for p in report.problems])
    return ExitCode.OK


Command = tuple[Callable[[argparse.Namespace], int], str, Callable[..., None]]


def _with_upstream(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--upstream", metavar="VERSION", help="an sglang release other than the pin"
    )
    p.add_argument(
        "--wheel", metavar="PATH", help="use this local wheel file (offline use)"
    )


def _with_tree(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tree", metavar="DIR", help="the git tree to use (default: build/sglang)"
    )


def _apply_args(p: argparse.ArgumentParser) -> None:
    _with_tree(p)
    _with_upstream(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="reset a tree with local edits (they are stashed or branched, not lost)",
    )
    p.add_argument(
        "--no-link", action="store_true", help="do not point .venv at the tree"
    )


def _matrix_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("versions", nargs="*", metavar="VERSION", help="e.g. 0.5.20 0.5.23")
    p.add_argument(
        "--wheel",
        action="append",
        metavar="PATH",
        help="a local wheel (its version comes from the file name); repeatable",
    )


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--jobs", type=int, default=2, help="parallel pytest runs")
    p.add_argument("-v", "--verbose", action="store_true", help="show pytest output")


# The command table: verb -> (handler, one-line help, argument adder).
COMMANDS: dict[str, Command] = {
    "fetch": (cmd_fetch, "get the pinned wheel into the cache, verify its sha256",
              _with_upstream),
    "apply": (cmd_apply, "build the tree: upstream commit + one commit per patch",
              _apply_args),
    "status": (cmd_status, "show the pin, the tree, applied patches, local edits",
               _with_tree),
    "check": (cmd_check, "dry run: would the series apply? plus static checks",
              _with_upstream),
    "matrix": (cmd_matrix, "status of every patch on several upstream releases",
               _matrix_args),
    "refresh": (cmd_refresh, "export the tree's commits into patches/, byte-stable",
                _with_tree),
    "verify": (cmd_verify, "prove each patch's tests fail without it, pass with it",
               _verify_args),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xpu-series",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="exit codes: 0 ok, 1 a patch or test failed, 2 usage, "
        "3 conflict needing a human, 4 integrity (hash/pin)",
    )
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument(
        "-C", dest="project", metavar="DIR", help="project root (default: search up)"
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, (handler, help_text, add_args) in COMMANDS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        add_args(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except XpuSeriesError as exc:
        if getattr(args, "json", False):
            _emit_json({"ok": False, "error": exc.message, "hint": exc.hint})
        _err(f"error: {exc.message}")
        if exc.hint:
            _err(f"hint: {exc.hint}")
        return int(exc.exit_code)
    except KeyboardInterrupt:
        _err("error: interrupted")
        return int(ExitCode.FAILED)


if __name__ == "__main__":
    sys.exit(main())
