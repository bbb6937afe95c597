"""upstream: make a carried patch into a ready SGLang pull request under
build/upstream/<patch>/v<N>/ (one commit with its tests, and pr.md), or several as
one feature pull request with --bundle NAME (patches/bundles.toml); --check proves
it the way upstream's CI would, --compare-to N shows what changed since vN,
--forwarded URL records the pull request in the patch headers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from xpu_series.commands import Context, Output, add_tree
from xpu_series.errors import UsageError
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.proofs.record import PatchInputs, Recorded, in_ci
from xpu_series.result import ExitCode
from xpu_series.upstream.bundle import Bundle, check_name, find_bundle, load_bundles
from xpu_series.upstream.check import CheckResult, StepResult, run_check
from xpu_series.upstream.export import (
    Export,
    Workspace,
    export_bundle,
    export_patch,
    find_target,
)
from xpu_series.upstream.pr import gather, render
from xpu_series.upstream.record import (
    RECORD,
    RECORD_HINT,
    CheckPlan,
    check_inputs,
    disagreement,
    load_checks,
    plan_checks,
    save_checks,
)
from xpu_series.upstream.related import load_upstream_work
from xpu_series.upstream.revise import check_url, range_diff, record_forwarded
from xpu_series.upstream.runner import TestServer

HELP = (
    "export a carried patch, or a bundle of them, as an upstream pull request "
    "(--check proves it)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "patch",
        metavar="PATCH",
        nargs="*",
        help="name, stem or number of a patch; several are exported one after "
        "another, and with --check share one test interpreter; with --bundle, "
        "the bundle's patches",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every patch of the series, bottom first, then every bundle "
        "patches/bundles.toml declares",
    )
    p.add_argument(
        "--bundle",
        metavar="NAME",
        help="export the patches as one feature pull request under "
        "build/upstream/NAME/ (one commit each); without PATCH, the ones "
        "patches/bundles.toml declares for NAME",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="apply the export to pristine upstream and prove it: its tests fail "
        "without the change and pass with it, upstream's collector and lint hooks",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="with --check: write each check into patches/upstream-checks.json "
        "(commit it: --all --check then trusts unchanged exports and re-checks a "
        "seeded sample)",
    )
    p.add_argument(
        "--compare-to",
        type=int,
        metavar="N",
        help="write and print a range-diff of revision vN against this export",
    )
    p.add_argument(
        "--forwarded",
        metavar="URL",
        help="record the pull request in the patch header (Forwarded: URL), "
        "through the tree and refresh; with --bundle, in each of its patches",
    )
    add_tree(p)


def execute(ctx: Context) -> Output:
    args = ctx.args
    _check_usage(args)
    project = ctx.project()
    tree = ctx.tree(project)
    # What to export, in order: a patch by name, or a bundle.
    jobs: list[str | Bundle]
    if args.bundle is not None:
        jobs = [find_bundle(project, args.bundle, list(args.patch))]
    elif args.all:
        jobs = [patch.name for patch in project.series().patches]
        jobs += load_bundles(project)
    else:
        jobs = list(dict.fromkeys(args.patch))
    # Checked before anything is written: pr.md quotes it.
    load_upstream_work(project)
    work = project.build_dir / "upstream" / ".work"
    with tree_lock(work, "upstream"):
        if args.forwarded is not None:
            return _forward(ctx, jobs[0], args.forwarded)
        with TestServer(project.root, work) as server:
            exports = []
            for number, job in enumerate(jobs, start=1):
                if len(jobs) > 1 and not ctx.json:
                    ctx.say(f"[{number}/{len(jobs)}] exporting {_what(job)} ...")
                exports.append(_export(ctx, project, tree, job))
            plan, keys = None, {}
            if args.check:
                keys = {
                    _what(job): check_inputs(
                        project, export, Workspace(project, tree).git
                    )
                    for job, export in zip(jobs, exports, strict=True)
                }
                recorded = load_checks(project.patches_dir)
                plan = plan_checks(list(keys), keys, recorded, named=not args.all)
                if plan.line:
                    ctx.say(plan.line)
            outputs, checked = [], {}
            for number, (job, export) in enumerate(zip(jobs, exports, strict=True), 1):
                what = _what(job)
                if len(jobs) > 1 and not ctx.json:
                    ctx.say(f"[{number}/{len(jobs)}] {what} ...")
                check = None
                if plan is not None:
                    check = _check(ctx, project, tree, export, server, plan, what)
                    checked[what] = check
                outputs.append(_finish(ctx, project, tree, export, check))
    out = outputs[0] if len(outputs) == 1 else _merge(outputs)
    if plan is not None:
        _after_checks(ctx, project, plan, keys, checked, out)
    return out


def _what(job: str | Bundle) -> str:
    return job if isinstance(job, str) else f"bundle {job.name}"


def _check(
    ctx: Context,
    project: Project,
    tree: Path,
    export: Export,
    server: TestServer,
    plan: CheckPlan,
    what: str,
) -> CheckResult:
    """The export's check: from the record where the plan trusts it, else run
    (a sampled re-check must agree with the record)."""
    if what in plan.trusted:
        check = plan.trusted[what]
    else:
        if ctx.progress:
            ctx.say(f"checking {export.folder} ...")
        check = run_check(project, export, tree, server)
    # pr.md's test tables read it, whichever way the check came.
    (export.folder / "check.json").write_text(
        json.dumps(check.to_json(), indent=2, sort_keys=True) + "\n"
    )
    if what in plan.trusted:
        return check
    kept = plan.recheck.get(what)
    differs = disagreement(check, kept) if kept is not None else ""
    if differs:
        check.steps.append(
            StepResult(
                "record",
                False,
                f"re-checked, it disagrees with patches/{RECORD}: {differs}",
            )
        )
    return check


def _after_checks(
    ctx: Context,
    project: Project,
    plan: CheckPlan,
    keys: dict[str, PatchInputs],
    checked: dict[str, CheckResult],
    out: Output,
) -> None:
    """--record writes what was checked (or trusted); under CI, a missing or
    stale record fails the run, with the command that writes it."""
    if ctx.args.record:
        if out.code == ExitCode.OK:
            path = save_checks(
                project.patches_dir,
                {
                    what: Recorded(dict(keys[what].digests), check.to_json())
                    for what, check in checked.items()
                },
                list(keys),
            )
            out.out.append(f"check record: wrote {path}")
        else:
            out.out.append("check record: not written (a check failed)")
    elif plan.stale and in_ci():
        shown = "; ".join(plan.stale[:5])
        more = f" and {len(plan.stale) - 5} more" if len(plan.stale) > 5 else ""
        out.error(
            f"patches/{RECORD} is stale for {len(plan.stale)} export(s), checked "
            f"in full here: {shown}{more}",
            RECORD_HINT,
        )
        out.code = max(out.code, ExitCode.FAILED)


def _check_usage(args: argparse.Namespace) -> None:
    if args.bundle is not None:
        check_name(args.bundle)
        if args.all:
            raise UsageError(
                "give --bundle NAME or --all, not both",
                hint="'xpu-series upstream --all --check' checks every patch and "
                "every declared bundle",
            )
    elif args.all and args.patch:
        raise UsageError(
            "name patches or give --all, not both",
            hint="'xpu-series upstream --all --check' checks every patch",
        )
    elif not args.all and not args.patch:
        raise UsageError(
            "no patch named",
            hint="name one ('xpu-series status' lists them), or export every "
            "one: 'xpu-series upstream --all'",
        )
    several = args.bundle is None and (args.all or len(set(args.patch)) > 1)
    if several and (args.forwarded is not None or args.compare_to is not None):
        option = "--forwarded URL" if args.forwarded is not None else "--compare-to N"
        raise UsageError(
            f"{option.split()[0]} takes one patch",
            hint=f"run it once per patch: 'xpu-series upstream PATCH {option}'",
        )
    if args.forwarded is not None:
        check_url(args.forwarded)
    if args.compare_to is not None and args.compare_to < 1:
        raise UsageError(
            f"--compare-to {args.compare_to}: revisions are numbered from 1",
            hint="name a revision as in build/upstream/<patch>/vN",
        )


def _export(ctx: Context, project: Project, tree: Path, job: str | Bundle) -> Export:
    if ctx.progress:
        ctx.say(f"exporting {job if isinstance(job, str) else job.name} ...")
    if isinstance(job, str):
        return export_patch(project, tree, job)
    return export_bundle(project, tree, job)


def _finish(
    ctx: Context,
    project: Project,
    tree: Path,
    export: Export,
    check: CheckResult | None,
) -> Output:
    args = ctx.args
    pr = render(project, export, gather(project, export, tree))
    pr_path = export.folder / "pr.md"
    pr_changed = not pr_path.is_file() or pr_path.read_text() != pr
    pr_path.write_text(pr)
    compared = None
    if args.compare_to is not None:
        compared = range_diff(project, export, args.compare_to, tree)
    return _render(export, check, pr_changed, compared, args.compare_to)


def _merge(outputs: list[Output]) -> Output:
    """One export's output after another; it fails if any one fails."""
    data = [o.data or {} for o in outputs]
    merged = Output(data={"patches": [d for d in data if "bundle" not in d]})
    bundles = [d for d in data if "bundle" in d]
    if bundles:
        merged.data["bundles"] = bundles
    for output in outputs:
        merged.out += output.out
        merged.err += output.err
        merged.code = max(merged.code, output.code)
    assert merged.data is not None
    merged.data["ok"] = merged.code == ExitCode.OK
    return merged


def _forward(ctx: Context, job: str | Bundle, url: str) -> Output:
    """Forwarded: URL in the patch's header, or in each of a bundle's patches
    (one pull request carries them all)."""
    project = ctx.project()
    tree = ctx.tree(project)
    words = [job] if isinstance(job, str) else list(job.patches)
    out = Output(data={"forwarded": url, "patches": [], "changed": False})
    assert out.data is not None
    for word in words:
        # Found again each time: recording rewrites the commits above.
        target = find_target(project, tree, word)
        changed = record_forwarded(project, tree, target, url)
        out.data["patches"].append(target.patch.name)
        out.data["changed"] |= changed
        if changed:
            out.out.append(
                f"{target.patch.name}: Forwarded: {url} (in the tree's commit; "
                "patches/ refreshed)"
            )
        else:
            out.out.append(f"{target.patch.name}: already Forwarded: {url}")
    if isinstance(job, str):
        out.data["patch"] = out.data["patches"][0]
    return out


def _render(
    export: Export,
    check: CheckResult | None,
    pr_changed: bool,
    compared: tuple[object, str] | None,
    old: int | None,
) -> Output:
    data = export.to_json()
    data["pr"] = str(export.folder / "pr.md")
    out = Output(data=data)
    stem = export.name
    state = "new revision" if export.new else "unchanged since the last export, kept"
    out.out.append(f"{stem}: v{export.revision} ({state}): {export.folder}")
    if export.bundle is not None:
        out.out.append(f"  bundle of {', '.join(t.stem for t in export.targets)}")
        if not export.bundle.declared:
            out.out.append(
                "  not as patches/bundles.toml declares it: declare it there so "
                "'upstream --all --check' checks it"
            )
    for patch_file in export.patch_files:
        out.out.append(f"  patch: {patch_file.name}")
    out.out.append(
        f"  branch: {export.branch} (in {export.folder.parents[1] / '.work'})"
    )
    out.out.append(
        f"  pr.md: {export.folder / 'pr.md'}"
        + (" (updated)" if pr_changed and not export.new else "")
    )
    if export.depends:
        out.out.append(f"  builds on: {', '.join(export.depends)}")
    for test in export.tests:
        for module, names in test.inlined:
            out.out.append(f"  {test.path}: inlined {', '.join(names)} from {module}")
        for dropped in test.dropped:
            out.out.append(f"  {test.path}: left out {dropped}")
    out.out += [f"  left out {path}" for path in export.left_out]
    if compared is not None:
        path, text = compared
        data["range_diff"] = {"file": str(path), "text": text}
        out.out.append(f"range-diff v{old}..v{export.revision} ({path}):")
        out.out.append(text.rstrip() or "  (no difference)")
    if check is not None:
        data["check"] = check.to_json()
        out.out.append(f"check of v{export.revision} ({check.seconds:.0f}s):")
        for step in check.steps:
            out.out.append(f"  {'ok  ' if step.ok else 'FAIL'} {step.name}: "
                           f"{step.summary}")  # fmt: skip
            if not step.ok and step.detail:
                out.out += [f"       {line}" for line in step.detail.splitlines()]
        if check.ok:
            out.out.append(f"ok: {stem} v{export.revision} is ready for upstream")
        else:
            failed = [s.name for s in check.steps if not s.ok]
            out.error(
                f"{stem} v{export.revision} fails upstream's checks: "
                + ", ".join(failed),
                "fix the commit in the tree (or its tests), refresh, and run "
                f"'{_again(export)}' again",
            )
            out.code = ExitCode.FAILED
    return out


def _again(export: Export) -> str:
    if export.bundle is not None:
        return f"xpu-series upstream --bundle {export.name} --check"
    return f"xpu-series upstream {export.name[:4]} --check"
