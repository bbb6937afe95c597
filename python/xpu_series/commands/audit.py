"""audit: XPU hazards on the paths an XPU server runs, per release.

Scans every module under python/sglang/ for CUDA-only code (torch.cuda calls,
.cuda(), "cuda" device literals, is_cuda tests, names imported only under a
CUDA/ROCm guard, CUDA-only packages) and for the other bug classes XPU users hit:
settings an XPU predicate silently overrides, behaviour keyed to a backend class
XPU's is not, non-SUM reductions on xccl, tensor IPC that only knows CUDA,
sgl_kernel names the XPU kernel package lacks, and platform dispatch with no XPU
arm. It decides from the import graph whether an XPU server imports the module,
from the conditions around each use whether XPU can get there, and what each
does on XPU. Findings the series fixes are `patched`; patches/audit.toml accepts
the rest with a reason (`triaged`); what remains is `exposed`. The summary comes
first, then the exposed findings (`--all` lists the others). `--trace` runs the
CPU stand-in server and marks the findings that executed; patches/xpu-reports.toml
(upstream's XPU reports) is re-checked on the audited release.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from xpu_series.audit.analysis import AuditReport, Finding, run_audit
from xpu_series.audit.ledger import (
    LedgerCheck,
    Report,
    check_ledger,
    load_ledger,
    wanted,
)
from xpu_series.audit.render import (
    render_json,
    render_markdown,
    render_sarif,
    render_text,
)
from xpu_series.audit.source import (
    TreeFiles,
    commit_files,
    folder_files,
    pristine_tree,
    release_base,
    series_tree,
)
from xpu_series.audit.surface import DEFAULT as DEFAULT_SURFACE
from xpu_series.audit.surface import load_surface
from xpu_series.audit.trace import cached_trace, commit_key, record_trace
from xpu_series.audit.triage import load_triage
from xpu_series.commands import Context, Output, add_tree
from xpu_series.errors import UsageError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.result import ExitCode
from xpu_series.stack.tree import UPSTREAM_TAG

HELP = "find XPU hazards on XPU server paths (per release, triaged)"
TRIAGE = "audit.toml"
LEDGER = "xpu-reports.toml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_tree(p)
    p.add_argument(
        "--upstream",
        metavar="VERSION",
        help="audit this release with the series (as 'apply --upstream' builds it)",
    )
    p.add_argument(
        "--pristine",
        action="store_true",
        help="audit the release as upstream shipped it (findings the series "
        "fixes are 'patched')",
    )
    p.add_argument(
        "--since",
        metavar="VERSION",
        help="only what is new relative to that release (file + function + API)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when an exposed finding is neither patched nor triaged",
    )
    p.add_argument(
        "--markdown", action="store_true", help="a Markdown table (job summary)"
    )
    p.add_argument("--sarif", metavar="FILE", help="also write SARIF 2.1.0 to FILE")
    p.add_argument(
        "--trace",
        action="store_true",
        help="run the CPU stand-in server on the tree and record which torch.cuda "
        "calls execute (about a minute; cached by tree)",
    )
    p.add_argument(
        "--all",
        "--verbose",
        dest="verbose",
        action="store_true",
        help="list every finding (triaged, patched, guarded, unreached, harmless) "
        "and what each triage entry covers, not only the exposed ones",
    )
    p.add_argument(
        "--triage",
        metavar="FILE",
        help=f"the triage file (default: patches/{TRIAGE})",
    )
    p.add_argument(
        "--ledger",
        metavar="FILE",
        help=f"the ledger of upstream XPU reports (default: patches/{LEDGER})",
    )
    p.add_argument(
        "--surface",
        metavar="FILE",
        help="the XPU kernel package's surface (default: the audit's own copy, "
        "python/xpu_series/audit/data/sgl-kernel-xpu-api.json)",
    )


def _pristine_of(tree: Path) -> TreeFiles | None:
    """The `upstream` commit of a tree the tool built, if it has one."""
    git = Git(tree)
    if not git.is_repo() or git.rev(UPSTREAM_TAG) is None:
        return None
    return commit_files(tree, UPSTREAM_TAG, f"{tree} at {UPSTREAM_TAG} (pristine)")


def _release(project: Project, version: str, pristine: bool) -> TreeFiles:
    if pristine:
        checkout = project.build_dir / "audit" / f"{version}-pristine"
        if Git(checkout).is_repo():  # made by --trace: it may have a trace
            return folder_files(checkout, f"sglang {version} (pristine)")
        repo, commit = release_base(project, version)
        return commit_files(repo, commit, f"sglang {version} (pristine)")
    tree = series_tree(project, version)
    return folder_files(tree, f"sglang {version} with the series ({tree})")


def _existing(tree: Path) -> Path:
    if not tree.is_dir():
        raise UsageError(
            f"{tree} does not exist",
            hint="build it with 'xpu-series apply' (or pass --tree DIR)",
        )
    return tree


def run(ctx: Context, project: Project) -> AuditReport:
    args = ctx.args
    if args.tree and args.upstream:
        raise UsageError(
            "--tree and --upstream name two different trees",
            hint="pass one of them",
        )
    say = ctx.say if not ctx.json else None
    series_files = pristine_files = since_files = None
    traced: Path | None = None
    if args.upstream:
        release_base(project, args.upstream)  # an unknown release fails first
    version = args.upstream or project.pin.version
    if args.since:
        since_files = _release(project, args.since, args.pristine)
    if args.pristine:
        if args.trace:
            pristine_tree(project, version)
        files = _release(project, version, True)
        checkout = project.build_dir / "audit" / f"{version}-pristine"
        traced = checkout if Git(checkout).is_repo() else None
        if args.upstream:
            series_files = _release(project, version, False)
        else:
            series_files = folder_files(_existing(ctx.tree(project)))
    elif args.upstream:
        traced = series_tree(project, version)
        files = folder_files(traced, f"sglang {version} with the series ({traced})")
        pristine_files = _release(project, version, True)
    else:
        traced = _existing(ctx.tree(project))
        files = folder_files(traced)
        pristine_files = _pristine_of(traced)
    executed: set[tuple[str, int, str]] | None = None
    source = ""
    if traced is not None and not Git(traced).is_repo() and not args.trace:
        traced = None  # a trace is keyed by the tree's commit: none to read
    if traced is None and files.repo is not None and not args.trace:
        # A commit read from a repository: a run on a clean checkout of the same
        # content (the stand-in test's, say) speaks for it.
        calls = cached_trace(
            project.cache_dir, files.repo, commit_key(files.repo, files.commit)
        )
        if calls is not None:
            executed = {(c.file, c.line, c.api) for c in calls}
            source = f"stand-in run of {files.label}, {len(executed)} call sites"
    if traced is not None:
        calls = cached_trace(project.cache_dir, traced)
        if args.trace:
            calls = record_trace(
                project.root, traced, project.cache_dir, _python(project), say
            )
        if calls is not None:
            executed = {(c.file, c.line, c.api) for c in calls}
            source = f"stand-in run of {traced}, {len(executed)} call sites"
    triage_path = Path(args.triage) if args.triage else project.patches_dir / TRIAGE
    if args.triage and not triage_path.is_file():
        raise UsageError(f"{triage_path} does not exist", hint="check the path")
    ledger_path = Path(args.ledger) if args.ledger else project.patches_dir / LEDGER
    if args.ledger and not ledger_path.is_file():
        raise UsageError(f"{ledger_path} does not exist", hint="check the path")
    triage = load_triage(triage_path)
    reports = load_ledger(ledger_path)
    surface = load_surface(Path(args.surface) if args.surface else DEFAULT_SURFACE)

    def recheck(findings: list[Finding]) -> LedgerCheck:
        return _recheck(reports, ledger_path, version, files, findings)

    return run_audit(
        files,
        project.cache_dir,
        triage,
        series_files=series_files,
        pristine_files=pristine_files,
        since_files=since_files,
        since=args.since or "",
        executed=executed,
        executed_source=source,
        surface=surface,
        ledger=recheck if reports else None,
        say=say,
    )


def _recheck(
    reports: list[Report],
    path: Path,
    version: str,
    files: TreeFiles,
    findings: list[Finding],
) -> LedgerCheck:
    """The ledger's locators against the audited tree's text and findings."""
    paths = wanted(reports, sorted(files.blobs))
    texts = {
        p: data.decode("utf-8", "replace") for p, data in files.read(paths).items()
    }
    return check_ledger(reports, path.name, version, texts, findings)


def _python(project: Project) -> Path:
    # The interpreter running the tool has the test environment sglang needs.
    return Path(sys.executable)


def execute(ctx: Context) -> Output:
    project = ctx.project()
    report = run(ctx, project)
    out = Output(data=render_json(report) if ctx.json else None)
    if ctx.args.markdown:
        out.out.append(render_markdown(report, ctx.args.verbose))
    else:
        out.out.append(render_text(report, ctx.args.verbose))
    if ctx.args.sarif:
        Path(ctx.args.sarif).write_text(
            json.dumps(render_sarif(report), indent=2) + "\n"
        )
        out.err.append(f"wrote {ctx.args.sarif} (SARIF 2.1.0)")
    if ctx.args.check and report.exposed:
        out.error(
            f"{len(report.exposed)} exposed finding(s) are neither patched nor triaged",
            hint="fix each in a patch, or accept it in patches/audit.toml with "
            "the reason",
        )
        out.code = ExitCode.FAILED
    return out
