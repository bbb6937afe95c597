"""The rebase's steps: start, continue and skip it, and on finishing build the new
patches/ (pin, series, patch files, retired and dropped ones, the recorded move)
and swap it in at once."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from xpu_series.errors import SeriesError, UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.rebase.plan import (
    DROPPED,
    MOVES,
    UPSTREAMED,
    decisions_of,
    dependency_drift,
    environment_violations,
    pinned_test_env,
    read_plan,
    requires_dist,
)
from xpu_series.rebase.state import (
    RebaseResult,
    new_operation,
    retired_entries,
    retired_header,
    run_retired_tests,
    set_field,
)
from xpu_series.stack.build import (
    allowed_prefixes,
    keep_foreign_head,
    save_local_edits,
)
from xpu_series.stack.engine import ProgressHook
from xpu_series.stack.operation import require_idle, snapshot, swap_in
from xpu_series.stack.plan import Decision, check_since, render_plan
from xpu_series.stack.sequencer import (
    Outcome,
    Runner,
    open_operation,
    record_applied,
    resolution_path,
    resume,
)
from xpu_series.stack.series import load_series, static_problems
from xpu_series.stack.tree import export_commit
from xpu_series.stack.wheel import fetch_wheel

# -- the write-out ------------------------------------------------------------


def _rewrite_pin(text: str, old: dict[str, str], new: dict[str, str]) -> str:
    """upstream.toml with every mention of the old release moved to the new one
    (a key the old pin lacked, such as git-tag, is added after sha256)."""
    out: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        for key in new:
            if re.match(rf"{re.escape(key)}\s*=", stripped):
                line = f'{key} = "{new[key]}"\n'
                seen.add(key)
        if stripped.startswith("#"):
            line = line.replace(f"=={old['version']}", f"=={new['version']}")
            line = line.replace(f"sglang {old['version']}", f"sglang {new['version']}")
        out.append(line)
    missing = [f'{key} = "{new[key]}"\n' for key in new if key not in seen]
    at = next(
        (i + 1 for i, line in enumerate(out) if line.startswith("sha256")), len(out)
    )
    return "".join(out[:at] + missing + out[at:])


def _rewrite_series(text: str, names: list[str], old: str, new: str) -> str:
    comments = [
        line.replace(f"sglang {old}", f"sglang {new}")
        for line in text.splitlines()
        if line.lstrip().startswith("#")
    ]
    return "\n".join([*comments, *names]) + "\n"


def build_new_patches(runner: Runner, dest: Path) -> None:
    """patches/ as the finished rebase leaves it, built complete in `dest`."""
    op, git, store = runner.op, runner.git, runner.store
    staging = dest.with_name(f".{dest.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(store.patches_backup, staging)
    new_version = op.target["version"]
    carried: list[str] = []
    for done in op.done:
        name = done["name"]
        path = staging / name
        if done.get("commit"):
            path.write_text(export_commit(git, done["commit"]), encoding="utf-8")
            carried.append(name)
            continue
        where = (
            DROPPED
            if done["status"] == "skipped" and not done.get(UPSTREAMED)
            else UPSTREAMED
        )
        text = path.read_text(encoding="utf-8")
        if where == UPSTREAMED:
            text = retired_header(text, done, new_version)
        else:
            text = set_field(text, "Dropped", f"{new_version}: {done.get('reason')}")
        (staging / where).mkdir(exist_ok=True)
        (staging / where / name).write_text(text, encoding="utf-8")
        path.unlink()
    for done in op.done:
        if done.get("resolved_on"):
            patch = runner.patch(done["name"])
            rel = resolution_path(patch, new_version, done["resolved_on"])
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(
                export_commit(git, done["commit"]), encoding="utf-8"
            )
    old = op.target["from"]
    (staging / MOVES).mkdir(exist_ok=True)
    (staging / MOVES / f"{old['version']}-to-{new_version}.plan").write_text(
        render_plan(decisions_of(op), old["version"], new_version), encoding="utf-8"
    )
    new = {
        "version": new_version,
        "wheel": op.target["wheel"],
        "sha256": op.target["sha256"],
        "git-tag": f"v{new_version}",
    }
    pin_file = staging / "upstream.toml"
    pin_file.write_text(_rewrite_pin(pin_file.read_text(), old, new))
    series_file = staging / "series"
    series_file.write_text(
        _rewrite_series(series_file.read_text(), carried, old["version"], new_version)
    )
    runner.notes += keep_user_files(
        project_patches=runner.project.patches_dir,
        backup=store.patches_backup,
        staging=staging,
        aside=runner.project.build_dir
        / f"rebase-kept-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(staging, dest)


def keep_user_files(
    project_patches: Path, backup: Path, staging: Path, aside: Path
) -> list[str]:
    """Carry into the new patches/ what the user changed in patches/ while the
    rebase ran (a new file, an edit, a removal). Where the write-out rewrote the
    same file, the user's copy is kept aside and named: nothing disappears."""
    now, before, after = snapshot(project_patches), snapshot(backup), snapshot(staging)
    notes: list[str] = []
    for rel in sorted(set(now) | set(before)):
        mine, was = now.get(rel), before.get(rel)
        if mine == was:
            continue
        untouched = after.get(rel) == was
        if untouched and mine is None:
            (staging / rel).unlink(missing_ok=True)
        elif untouched:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(mine)
            notes.append(f"kept your change to patches/{rel}")
        elif mine is not None:
            (aside / rel).parent.mkdir(parents=True, exist_ok=True)
            (aside / rel).write_bytes(mine)
            notes.append(
                f"the rebase rewrote patches/{rel}, which you changed meanwhile: "
                f"your copy is in {aside / rel}"
            )
    return notes


def _finish_rebase(runner: Runner) -> None:
    """Write pin, patches and series in one swap (redone safely if interrupted)."""
    project, store = runner.project, runner.store
    runner.save("write")
    patches = project.patches_dir
    new = store.dir / "patches.new"
    if not patches.exists() and new.exists():
        os.replace(new, patches)  # killed between the two renames of swap_in
    else:
        build_new_patches(runner, new)
        swap_in(new, patches, store.dir / "patches.replaced")
    record_applied(runner, load_series(patches).digest())


# -- the steps ----------------------------------------------------------------


def _result(
    project: Project,
    outcome: Outcome,
    test_retired: bool = True,
    say: Callable[[str], None] | None = None,
) -> RebaseResult:
    """The rebase's result; once finished, with what it retired, the retired
    patches' tests on the new base, the dependency drift, and its report file."""
    op = outcome.op
    result = RebaseResult(outcome, dict(op.target.get("from", {})))
    if not outcome.finished:
        return result
    result.retired = retired_entries(project, op)
    if test_retired:
        run_retired_tests(project, Path(op.tree), result.retired, say)
    try:
        old_pin = dataclasses.replace(
            project.pin,
            version=result.old["version"],
            sha256=result.old["sha256"],
            wheel=result.old["wheel"],
        )
        old_wheel = fetch_wheel(old_pin, project.cache_dir, offline=True)
        new_wheel = (
            project.cache_dir / "wheels" / op.target["sha256"] / (op.target["wheel"])
        )
        pyproject = project.root / "pyproject.toml"
        # Each wheel's METADATA is read once for both tables.
        reqs = requires_dist(old_wheel.path), requires_dist(new_wheel)
        pins = pinned_test_env(pyproject)
        result.drift = dependency_drift(*reqs, pins)
        result.violations = environment_violations(*reqs, pins)
    except (XpuSeriesError, OSError, zipfile.BadZipFile, KeyError) as exc:
        result.drift_note = f"dependency drift not computed: {exc}"
    reports = project.build_dir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    path = reports / f"rebase-{result.old['version']}-to-{op.target['version']}.json"
    result.report_file = str(path)
    path.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    return result


def run_rebase(
    project: Project,
    onto: str,
    wheel: Path | None = None,
    on_patch: ProgressHook | None = None,
    progress: bool = False,
    test_retired: bool = True,
    plan: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> RebaseResult:
    """Start a rebase of the series (as in patches/) onto sglang `onto`, with the
    decisions of `plan` (see stack/plan.py) taken as each named patch comes up."""
    require_idle(project.operations, "rebase")
    pin = project.pin
    if onto == pin.version:
        raise UsageError(
            f"the series is already on sglang {onto}",
            hint="name a newer release: --onto VERSION",
        )
    series = project.series()
    problems = static_problems(series, None, allowed_prefixes(project))
    if problems:
        raise SeriesError(
            "patches/ has problems, nothing was changed: " + "; ".join(problems),
            hint="fix them first ('xpu-series check' lists every problem)",
        )
    decisions: list[Decision] = []
    if plan is not None:
        decisions = read_plan(plan, [p.name for p in series.patches], onto)
    tree = project.default_tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tree_lock(tree, f"xpu-series rebase --onto {onto}"):
        git = Git(tree)
        notes: list[str] = []
        if git.is_repo():
            notes += save_local_edits(git, force=False)
            backup = keep_foreign_head(git, series)
            if backup:
                notes.append(f"the tree's previous HEAD is kept on branch {backup}")
        op = new_operation(pin, tree, onto, wheel, decisions)
        runner = Runner(project, op, on_patch, progress)
        runner.begin()
        runner.notes = notes
        outcome = resume(runner, _finish_rebase)
    return _result(project, outcome, test_retired, say)


def continue_rebase(
    project: Project,
    on_patch: ProgressHook | None = None,
    test_retired: bool = True,
    say: Callable[[str], None] | None = None,
) -> RebaseResult:
    """Go on with the stopped rebase (its conflict resolved by hand)."""
    op = open_operation(project, "rebase")
    runner = Runner(project, op, on_patch)
    with tree_lock(Path(op.tree), "xpu-series rebase --continue"):
        outcome = resume(runner, _finish_rebase)
    return _result(project, outcome, test_retired, say)


def skip_patch(
    project: Project,
    reason: str,
    upstreamed: bool,
    on_patch: ProgressHook | None = None,
    test_retired: bool = True,
    since: str = "",
    say: Callable[[str], None] | None = None,
) -> RebaseResult:
    """Drop the patch the rebase stopped at, with the reason, and go on (retired
    as upstreamed from `since`, or the target release, with `upstreamed`)."""
    op = open_operation(project, "rebase")
    if not reason.strip():
        raise UsageError(
            f"say why {op.current or 'the patch'} is dropped",
            hint="add --reason TEXT (and --upstreamed if upstream has the change)",
        )
    if since:
        check_since(since, op.target.get("version", ""), "--since")
    runner = Runner(project, op, on_patch)
    with tree_lock(Path(op.tree), "xpu-series rebase --skip"):
        runner.skip_current(
            {
                "reason": reason.strip(),
                UPSTREAMED: upstreamed,
                "detail": reason,
                "since": since if upstreamed else "",
            }
        )
        outcome = resume(runner, _finish_rebase)
    return _result(project, outcome, test_retired, say)
