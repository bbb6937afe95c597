"""rebase: move the series to a newer upstream release in one transaction.

The new wheel is fetched and hash-recorded, the tree is put on its base, each patch
is carried with `git am -3 -k` and classified. Only when every patch is carried,
retired or dropped are the pin, the patch files and `series` rewritten, in one
swap of the patches/ folder. A conflict stops the rebase (state in
build/operation/); `--continue`, `--skip` and `--abort` go on from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import time
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import (
    Context,
    Output,
    add_operation_flags,
    progress_hook,
    render_stop,
)
from xpu_series.errors import SeriesError, UsageError, XpuSeriesError
from xpu_series.git import Git
from xpu_series.lock import tree_lock
from xpu_series.project import Project
from xpu_series.result import ExitCode
from xpu_series.stack.build import (
    allowed_prefixes,
    keep_foreign_head,
    save_local_edits,
)
from xpu_series.stack.engine import ProgressHook
from xpu_series.stack.header import parse_header
from xpu_series.stack.operation import Operation, require_idle, snapshot, swap_in
from xpu_series.stack.plan import Decision, check_since, parse_plan, render_plan
from xpu_series.stack.sequencer import (
    Outcome,
    Runner,
    abort_operation,
    open_operation,
    record_applied,
    resolution_path,
    resume,
)
from xpu_series.stack.series import load_series, static_problems
from xpu_series.stack.tree import export_commit
from xpu_series.stack.wheel import fetch_wheel
from xpu_series.ui import render_report, table

HELP = "move the series to a newer sglang release (--continue/--skip/--abort)"
UPSTREAMED = "upstreamed"
DROPPED = "dropped"
# Each finished rebase's decisions, replayable: patches/moves/OLD-to-NEW.plan.
MOVES = "moves"
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


# -- the write-out ------------------------------------------------------------


def set_field(text: str, key: str, value: str) -> str:
    """The patch text with `key: value` in place of that field, or as the last
    header field when it has none.

    >>> text = "Subject: x\\n\\nWhy.\\n\\nUpstream-Status: Pending\\nConcern: a\\n"
    >>> text += "---\\n"
    >>> set_field(text, "Applied-Upstream", "0.5.20").splitlines()[4:7]
    ['Upstream-Status: Pending', 'Concern: a', 'Applied-Upstream: 0.5.20']
    >>> set_field(text, "Upstream-Status", "Backport [1]").splitlines()[4:6]
    ['Upstream-Status: Backport [1]', 'Concern: a']
    """
    lines = text.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line == "---\n"), len(lines))
    field = f"{key}: {value}\n"
    at = next((i for i in range(cut) if lines[i].startswith(f"{key}:")), None)
    if at is None:
        return "".join([*lines[:cut], field, *lines[cut:]])
    head = [line for line in lines[at + 1 : cut] if not line.startswith(f"{key}:")]
    return "".join([*lines[:at], field, *head, *lines[cut:]])


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
            text = _retired_header(text, done, new_version)
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


def _retired_header(text: str, done: dict[str, Any], new_version: str) -> str:
    """A retired patch's header says from which release upstream has it and why.

    The release is the one the maintainer named (`--since`, the plan), else the
    patch's own `Applied-Upstream:`, else the release the rebase moved to.
    """
    declared = parse_header(text).get("Applied-Upstream")
    since = done.get("since") or declared or new_version
    text = set_field(text, "Applied-Upstream", since)
    reason = done.get("reason", "")
    status = parse_header(text).get("Upstream-Status")
    if reason and not status.startswith("Backport"):
        text = set_field(
            text,
            "Upstream-Status",
            f"Inappropriate [not needed from {since}: {reason}]",
        )
    return text


def decisions_of(op: Operation) -> list[Decision]:
    """Every decision of the rebase: the plan's (retire, drop, edit) and those of
    --skip, in series order."""
    out = []
    edits = {d["name"] for d in op.plan if d["action"] == "edit"}
    for done in op.done:
        if done["name"] in edits:
            out.append(Decision("edit", done["name"], ""))
            continue
        if done.get("commit") or not done.get("reason"):
            continue
        retire = bool(done.get(UPSTREAMED))
        out.append(
            Decision(
                "retire" if retire else "drop",
                done["name"],
                done["reason"],
                done.get("since") or (op.target["version"] if retire else ""),
            )
        )
    return out


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


# -- dependency drift ---------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requires_dist(wheel: Path) -> dict[str, str]:
    """name -> specifier of a wheel's unconditional Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(
            (n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None
        )
        text = archive.read(meta).decode("utf-8", "replace") if meta else ""
    reqs: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        value = line.split(":", 1)[1].strip()
        if ";" in value and "extra" in value.split(";", 1)[1]:
            continue
        match = _REQ.match(value.split(";", 1)[0].strip())
        if match:
            spec = match.group(3).strip().strip("()")
            reqs[_norm(match.group(1))] = spec
    return reqs


def pinned_test_env(pyproject: Path) -> dict[str, str]:
    """name -> version that pyproject.toml pins with `==` for the test environment."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    entries = list(data.get("project", {}).get("optional-dependencies", {}).get(
        "test", []))  # fmt: skip
    entries += data.get("tool", {}).get("xpu-series", {}).get("no-deps", [])
    pins: dict[str, str] = {}
    for entry in entries:
        name, sep, version = entry.partition("==")
        if sep:
            pins[_norm(name.strip())] = version.strip()
    return pins


def _satisfies(version: str, spec: str) -> bool | None:
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
    except ImportError:  # pragma: no cover - packaging ships with pip's users
        return None
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


@dataclass
class DriftRow:
    """One requirement that differs between the old and the new release."""

    name: str
    old: str
    new: str
    pinned: str
    action: str

    def to_json(self) -> dict[str, str]:
        return self.__dict__.copy()


def _shown(spec: str | None) -> str:
    """A requirement for the table: '-' when absent, 'any' when unversioned."""
    return "-" if spec is None else spec or "any"


Requirements = dict[str, str]


def dependency_drift(
    before: Requirements, after: Requirements, pins: Requirements
) -> list[DriftRow]:
    """What changed between the two releases' requirements, and what that change
    asks of the test environment (only what the change itself causes).
    `before`/`after`: the two wheels' requires_dist(); `pins`: pinned_test_env()."""
    rows = []
    for name in sorted(set(before) | set(after)):
        if before.get(name) == after.get(name):
            continue
        spec = after.get(name)
        pinned = pins.get(name, "")
        if spec is None:
            action = "no longer required" + (
                f": the test environment may drop {name}" if pinned else ""
            )
        elif not pinned:
            action = "not in the test environment"
        else:
            fits = _satisfies(pinned, spec)
            fitted = _satisfies(pinned, before[name]) if name in before else True
            if fits is False and fitted is False:
                action = f"{name}=={pinned} did not satisfy the old release either"
            else:
                action = {
                    False: f"change pyproject.toml: {name}=={pinned} does not "
                    f"satisfy {spec}",
                    True: "the pinned version still satisfies it",
                    None: f"compare {name}=={pinned} with {spec} by hand",
                }[fits]
        rows.append(
            DriftRow(name, _shown(before.get(name)), _shown(spec), pinned, action)
        )
    return rows


def environment_violations(
    before: Requirements, after: Requirements, pins: Requirements
) -> list[DriftRow]:
    """Every pin of the test environment the new release's requirements reject,
    changed or not, and whether the old release rejected it too."""
    rows = []
    for name, pinned in sorted(pins.items()):
        spec = after.get(name)
        if spec is None or _satisfies(pinned, spec) is not False:
            continue
        was = before.get(name)
        old_too = was is not None and _satisfies(pinned, was) is False
        rows.append(
            DriftRow(
                name,
                _shown(was),
                _shown(spec),
                pinned,
                "unmet by the old release too"
                if old_too
                else "unmet from this release",
            )
        )
    return rows


# -- the verb -----------------------------------------------------------------


@dataclass
class RebaseResult:
    """A finished or stopped rebase, with what it changed in patches/."""

    outcome: Outcome
    old: dict[str, str]
    retired: list[dict[str, Any]] = field(default_factory=list)
    drift: list[DriftRow] = field(default_factory=list)
    violations: list[DriftRow] = field(default_factory=list)
    drift_note: str = ""
    report_file: str = ""

    def to_json(self) -> dict[str, Any]:
        op = self.outcome.op
        return {
            "finished": self.outcome.finished,
            "from": self.old,
            "onto": {k: op.target.get(k, "") for k in ("version", "wheel", "sha256")},
            "stopped_at": op.current if not self.outcome.finished else "",
            "patches": [p.to_json() for p in self.outcome.report.patches],
            "retired": self.retired,
            "dependency_drift": [row.to_json() for row in self.drift],
            "environment_violations": [row.to_json() for row in self.violations],
            "dependency_drift_note": self.drift_note,
            "report": self.report_file,
            "ok": self.outcome.finished,
        }


def _retired(project: Project, op: Operation) -> list[dict[str, Any]]:
    out = []
    for done in op.done:
        if done.get("commit"):
            continue
        where = UPSTREAMED if done["status"] == "absorbed" or done.get(
            UPSTREAMED) else DROPPED  # fmt: skip
        path = project.patches_dir / where / done["name"]
        tests = []
        if path.is_file():
            tests = parse_header(path.read_text(encoding="utf-8")).tests
        out.append(
            {
                "name": done["name"],
                "status": done["status"],
                "moved_to": f"patches/{where}/{done['name']}",
                "reason": done.get("detail") or done.get("reason", ""),
                "tests": tests,
            }
        )
    return out


def _test_retired(
    project: Project,
    tree: Path,
    retired: list[dict[str, Any]],
    say: Callable[[str], None] | None = None,
) -> None:
    """Run the retired patches' tests on the new base (one pytest process, one
    sglang import): passing ones stay as regression tests of upstream's
    behaviour, failing ones are listed for the maintainer."""
    from xpu_series.proofs.proof import count, run_pytest

    wanted: dict[str, list[str]] = {}
    for entry in retired:
        present = [
            t for t in entry["tests"] if (project.root / t.split("::")[0]).exists()
        ]
        wanted[entry["name"]] = present
        if not present:
            entry["tests_on_new_base"] = (
                "its tests are gone" if entry["tests"] else "no tests"
            )
    every = sorted({t for tests in wanted.values() for t in tests})
    if not every:
        return
    started = time.monotonic()
    if say:
        say(
            f"running the tests of {len(wanted)} retired patches on the new base "
            f"({len(every)} files, one pytest run; --no-test-retired skips this)"
        )
    outcomes, _log = run_pytest(project, tree, every)
    if say:
        say(f"retired patches' tests done in {time.monotonic() - started:.0f} s")
    for entry in retired:
        tests = wanted[entry["name"]]
        if not tests:
            continue
        counts = count(outcomes, tuple(tests))
        if not counts.total:
            verdict = "produced no outcome: run them by hand"
        elif counts.failed or counts.errors:
            verdict = (
                f"fail on the new base ({counts}): port them, or remove them with "
                f"'xpu-series unregister {entry['name']} --reason TEXT'"
            )
        elif not counts.passed:
            verdict = (
                f"skip on the new base ({counts.skipped} skipped): they speak only "
                "for the older releases that still need the patch"
            )
        else:
            verdict = (
                f"pass on the new base ({counts}): kept as regression tests of "
                "upstream's behaviour"
            )
        entry["tests_on_new_base"] = verdict


def _result(
    project: Project,
    outcome: Outcome,
    test_retired: bool = True,
    say: Callable[[str], None] | None = None,
) -> RebaseResult:
    op = outcome.op
    result = RebaseResult(outcome, dict(op.target.get("from", {})))
    if not outcome.finished:
        return result
    result.retired = _retired(project, op)
    if test_retired:
        _test_retired(project, Path(op.tree), result.retired, say)
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
    decisions of `plan` (see plan.py) taken as each named patch comes up."""
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
        try:
            text = plan.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the plan {plan}: {exc.strerror}") from None
        names = [p.name for p in series.patches]
        decisions = parse_plan(text, names, onto, str(plan))
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
        target: dict[str, Any] = {
            "version": onto,
            "from": {
                "version": pin.version,
                "wheel": pin.wheel,
                "sha256": pin.sha256,
                "git-tag": pin.git_tag,
            },
        }
        if wheel:
            target["local"] = str(wheel.resolve())
        op = Operation(
            kind="rebase",
            tree=str(tree),
            target=target,
            plan=[d.to_json() for d in decisions],
        )
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--onto", metavar="VERSION", help="the sglang release to move to")
    p.add_argument(
        "--wheel", metavar="PATH", help="use this local wheel of that release"
    )
    add_operation_flags(p, "rebase", skip=True)
    p.add_argument("--reason", default="", help="why --skip drops the patch")
    p.add_argument(
        "--since",
        metavar="VERSION",
        default="",
        help="with --skip --upstreamed: the release upstream has it from "
        "(default: the release of the rebase)",
    )
    p.add_argument(
        "--plan",
        metavar="FILE",
        help="decide named patches as they come up: lines 'retire NAME SINCE "
        "REASON', 'drop NAME REASON' or 'edit NAME' (stop after it to amend it); "
        "a finished rebase records its decisions in patches/moves/OLD-to-NEW.plan",
    )
    p.add_argument(
        "--no-test-retired",
        dest="test_retired",
        action="store_false",
        help="do not run the retired patches' tests on the new base",
    )
    p.add_argument(
        "--upstreamed",
        action="store_true",
        help="with --skip: upstream has the change (patches/upstreamed/)",
    )


def _render(out: Output, result: RebaseResult) -> None:
    outcome = result.outcome
    op = outcome.op
    onto = op.target.get("version")
    out.data = result.to_json()
    out.out.append(render_report(outcome.report))
    if not outcome.finished:
        render_stop(out, outcome, "rebase")
        out.code = ExitCode.CONFLICT
        return
    out.out.append("")
    out.out.append(
        f"rebased onto sglang {onto}: patches/upstream.toml, series and "
        f"patch files rewritten (sha256 {op.target.get('sha256', '')[:12]})"
    )
    for r in result.retired:
        out.out.append(f"retired {r['name']} -> {r['moved_to']} ({r['reason']})")
        if r["tests"]:
            out.out.append(
                f"  its tests {', '.join(r['tests'])}: "
                f"{r.get('tests_on_new_base', 'not run')}"
            )
    if result.drift:
        out.out.append("")
        out.out.append(
            f"dependency drift {result.old.get('version')} -> {onto} "
            "(Requires-Dist vs the test environment in pyproject.toml):"
        )
        rows = [[d.name, d.old, d.new, d.pinned or "-", d.action] for d in result.drift]
        out.out.append(table(["package", "old", "new", "pinned", "action"], rows))
    if result.violations:
        out.out.append("")
        out.out.append(
            f"test environment pins that sglang {onto} rejects (pyproject.toml; "
            "changed or not):"
        )
        rows = [[d.name, d.pinned, d.new, d.action] for d in result.violations]
        out.out.append(table(["package", "pinned", "requires", "since"], rows))
    if result.drift_note:
        out.out.append(f"note: {result.drift_note}")
    if result.report_file:
        out.out.append(f"report: {result.report_file}")
    out.err.append(
        "hint: run 'xpu-series verify' to prove every carried patch on the new base"
    )


def execute(ctx: Context) -> Output:
    args = ctx.args
    project = ctx.project()
    out = Output()
    resuming = args.cont or args.skip or args.abort
    if resuming and (args.onto or args.wheel):
        raise UsageError("--continue, --skip and --abort take no --onto or --wheel")
    if (args.reason or args.upstreamed or args.since) and not args.skip:
        raise UsageError("--reason, --upstreamed and --since go with --skip")
    if args.since and not args.upstreamed:
        raise UsageError(
            "--since goes with --upstreamed: it says from when upstream has it"
        )
    if resuming and args.plan:
        raise UsageError("--plan goes with --onto: it is read when the rebase starts")
    hook = progress_hook(ctx)
    if args.abort:
        op, notes = abort_operation(project, "rebase")
        out.out.append(
            f"aborted the rebase onto sglang {op.target.get('version')}: the pin, "
            f"series, patch files and {op.tree} are as they were"
        )
        out.out += [f"note: {n}" for n in notes]
        out.data = {"aborted": True, "notes": notes, "ok": True}
        return out
    if args.cont:
        result = continue_rebase(project, hook, args.test_retired, ctx.say)
    elif args.skip:
        result = skip_patch(
            project,
            args.reason,
            args.upstreamed,
            hook,
            args.test_retired,
            args.since,
            ctx.say,
        )
    else:
        if not args.onto:
            raise UsageError(
                "rebase needs --onto VERSION (or --continue, --skip, --abort)",
                hint="e.g. 'xpu-series rebase --onto 0.5.20'",
            )
        result = run_rebase(
            project, args.onto, ctx.path("wheel"), hook, ctx.progress,
            args.test_retired, ctx.path("plan"), ctx.say,
        )  # fmt: skip
    _render(out, result)
    return out
