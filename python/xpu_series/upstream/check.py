"""`upstream --check`: the proof upstream's CI would ask of an export, run in the
scratch work tree with no project folder on sys.path."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.project import Project
from xpu_series.stack.bytecode import prime
from xpu_series.upstream.export import Export, Workspace
from xpu_series.upstream.lint import added_lines, lint_files, load_conventions
from xpu_series.upstream.runner import SERVER, TestServer
from xpu_series.upstream.tests import imports_of


@dataclass
class StepResult:
    """One of the five steps of --check."""

    name: str
    ok: bool
    summary: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.name,
            "ok": self.ok,
            "summary": self.summary,
            "detail": self.detail,
        }


@dataclass
class CheckResult:
    """What --check found, step by step, and how long it took."""

    steps: list[StepResult] = field(default_factory=list)
    without: dict[str, str] = field(default_factory=dict)
    with_export: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [s.to_json() for s in self.steps],
            "without": self.without,
            "with": self.with_export,
            "seconds": round(self.seconds, 1),
            "ok": self.ok,
        }


def _tally(outcomes: dict[str, str]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for value in outcomes.values():
        out[value if value in out else "failed"] += 1
    return out


def describe(outcomes: dict[str, str]) -> str:
    t = _tally(outcomes)
    text = f"{t['passed']} passed, {t['failed']} failed"
    text += f", {t['error']} errors" if t["error"] else ""
    return text + (f", {t['skipped']} skipped" if t["skipped"] else "")


# Bumped when what a stored run means changes (the runner script, its output).
_CACHE_FORMAT = "2"


def _tests_on(
    project: Project, work: Workspace, server: TestServer, mode: str, tests: list[str]
) -> dict[str, Any]:
    """The runner's answer for the work tree's index as it is: from the cache
    when the same tree, tests and interpreter ran before (a run that produced
    outcomes only)."""
    tree_id = work.git.out("write-tree")
    h = hashlib.sha256()
    for part in (_CACHE_FORMAT, SERVER, sys.executable, sys.version, tree_id, mode):
        h.update(part.encode() + b"\0")
    for test in tests:
        h.update(test.encode() + b"\0")
    cache = project.cache_dir / "upstream-check"
    path = cache / f"{h.hexdigest()}.json"
    try:
        data = json.loads(path.read_text())
        data["cached"] = True
        return data
    except (OSError, ValueError):
        pass
    data = server.run(mode, tests)
    if data.get("outcomes"):
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    return data


def _unexpected_imports(export: Export, allowed: set[str]) -> list[str]:
    out = []
    for test in export.tests:
        bad = sorted(
            m for m in imports_of(test.text) if m not in allowed and m != "sglang"
        )
        out += [f"{test.path} imports {m}" for m in bad]
    return out


def allowed_imports(project: Project) -> frozenset[str]:
    """The standard library, pytest, and the modules of sglang's own
    dependencies (what upstream's test environment has)."""
    return _allowed_imports(project.cache_dir, project.pin.wheel)


@functools.cache
def _allowed_imports(cache_dir: Path, wheel: str) -> frozenset[str]:
    # Once per process: `upstream --all --check` asks for every patch, and the
    # scan of the installed distributions is most of a second.
    from importlib import metadata

    names = {_dist_name(r) for r in _sglang_requirements(cache_dir, wheel)}
    allowed = set(sys.stdlib_module_names) | {"pytest", "_pytest"}
    for module, dists in metadata.packages_distributions().items():
        if any(_dist_name(d) in names for d in dists):
            allowed.add(module)
    return frozenset(allowed)


def _sglang_requirements(cache_dir: Path, wheel: str) -> list[str]:
    """Requires-Dist of an installed sglang, and of the pinned wheel (the test
    environment does not install sglang as a distribution)."""
    import zipfile
    from importlib import metadata

    requires: list[str] = []
    try:
        requires += metadata.requires("sglang") or []
    except metadata.PackageNotFoundError:
        pass
    for path in sorted((cache_dir / "wheels").glob(f"*/{wheel}"))[:1]:
        with zipfile.ZipFile(path) as zf:
            for member in zf.namelist():
                if member.endswith(".dist-info/METADATA"):
                    text = zf.read(member).decode(errors="replace")
                    requires += [
                        line.split(":", 1)[1]
                        for line in text.splitlines()
                        if line.startswith("Requires-Dist:")
                    ]
    return requires


def _dist_name(requirement: str) -> str:
    """'Torch_Audio[x]>=2; extra' -> 'torch-audio'."""
    name = re.split(r"[\s\[;=<>!~(]", requirement.strip(), maxsplit=1)[0]
    return name.lower().replace("_", "-")


def run_check(
    project: Project, export: Export, tree: Path, server: TestServer
) -> CheckResult:
    """The five steps; each one runs even when an earlier one failed, except
    the tests when the export does not apply. `server` runs the tests in the
    scratch work tree (one per invocation, shared by the patches it checks)."""
    began = time.monotonic()
    result = CheckResult()
    work = Workspace(project, tree)
    git = work.git
    # 1. git am onto the pristine tree (plus what the export builds on).
    work.reset(export.base)
    am = git.run("am", "-q", "-k", *map(str, export.patch_files), check=False)
    if not am.ok:
        git.run("am", "--abort", check=False)
        result.steps.append(
            StepResult("apply", False, "git am failed", (am.stderr + am.stdout)[-2000:])
        )
        result.seconds = time.monotonic() - began
        return result
    base = "pristine upstream" + (
        f" + {', '.join(export.depends)}" if export.depends else ""
    )
    result.steps.append(
        StepResult("apply", True, f"git am onto {base}: applied, no fuzz")
    )
    prime(git, project.cache_dir)
    tests = export.test_paths
    # 2. the tests on pristine + tests only: something must fail.
    in_base = set(git.out("ls-tree", "-r", "--name-only", export.base).splitlines())
    old = [p for p in export.code if p in in_base]
    added = [p for p in export.code if p not in in_base]
    if old:
        git.run("checkout", export.base, "--", *old)
    if added:
        git.run("rm", "-q", "-f", "--", *added)
    without = _tests_on(project, work, server, "run", tests)
    git.run("checkout", "HEAD", "--", *export.code)
    result.without = without.get("outcomes", {})
    tally = _tally(result.without)
    failing = tally["failed"] + tally["error"]
    # A bundle proves each patch: every one's tests must fail without it.
    idle = [
        part.target.stem
        for part in export.parts
        if len(export.parts) > 1 and not _fails(_of(result.without, part.test_paths))
    ]
    result.steps.append(
        StepResult(
            "fail-without",
            failing > 0 and not idle,
            f"{base} + tests: {describe(result.without)}"
            + _per_part(export, result.without)
            + ("" if failing else ": the tests prove nothing upstream")
            + (
                f": the tests of {', '.join(idle)} prove nothing upstream"
                if idle and failing
                else ""
            ),
            "" if failing and not idle else without.get("log", ""),
        )
    )
    # 3. the tests on pristine + the whole export: all pass.
    with_export = _tests_on(project, work, server, "collect", tests)
    result.with_export = with_export.get("outcomes", {})
    tally = _tally(result.with_export)
    passing = tally["passed"] > 0 and not (tally["failed"] or tally["error"])
    leaks = with_export.get("leaks", []) + without.get("leaks", [])
    scratch = str(work.root / "python")
    imported = with_export.get("sglang") or ""
    isolated = not leaks and imported.startswith(scratch)
    bad = _unexpected_imports(export, allowed_imports(project))
    result.steps.append(
        StepResult(
            "pass-with",
            passing and isolated and not bad,
            f"{base} + export: {describe(result.with_export)}"
            + _per_part(export, result.with_export)
            + (f"; project folders on sys.path: {leaks}" if leaks else "")
            + ("" if not imported or isolated else f"; sglang came from {imported}")
            + (f"; {'; '.join(bad)}" if bad else ""),
            "" if passing else _neighbours(export) + with_export.get("log", ""),
        )
    )
    # 4. upstream's collector: registered, in a suite that exists.
    result.steps.append(_collect(with_export, tests))
    # 5. upstream's lint hooks on the exported files: clean.
    diff = git.run("diff", "-U0", f"{export.base}", "HEAD").stdout
    lint = lint_files(
        work.root,
        [*export.code, *tests, *export.data_paths],
        project.cache_dir,
        added_lines(diff),
    )
    names = ", ".join(f"{h.id} {h.version}" for h in lint.hooks)
    result.steps.append(
        StepResult(
            "lint",
            lint.ok,
            f"{names}: clean"
            if lint.ok
            else f"{', '.join(lint.findings)} would change or reject the files",
            "\n".join(f"[{k}]\n{v}" for k, v in lint.findings.items()),
        )
    )
    result.seconds = time.monotonic() - began
    return result


def _of(outcomes: dict[str, str], paths: list[str]) -> dict[str, str]:
    """The outcomes of the tests in `paths` (node ids start with the file)."""
    return {k: v for k, v in outcomes.items() if k.split("::")[0] in paths}


def _fails(outcomes: dict[str, str]) -> bool:
    return any(v in ("failed", "error") for v in outcomes.values())


def _per_part(export: Export, outcomes: dict[str, str]) -> str:
    """`` (0015: 0 passed, 2 failed; ...)`` for a bundle; nothing for one patch."""
    if len(export.parts) < 2:
        return ""
    each = [
        f"{part.target.stem[:4]}: {describe(_of(outcomes, part.test_paths))}"
        for part in export.parts
    ]
    return f" ({'; '.join(each)})"


def _neighbours(export: Export) -> str:
    """Why tests that pass in the series can fail on pristine upstream."""
    if not export.neighbours:
        return ""
    return (
        f"The series carries {', '.join(export.neighbours)} below this patch, "
        "changing the same files; the export applies without it, but its tests "
        "may need that change: move such a test to that patch's Tests:, or "
        "make it independent of it.\n"
    )


def _collect(data: dict[str, Any], tests: list[str]) -> StepResult:
    """Judge what upstream's collector said of the exported test files."""
    if "registries" not in data:
        return StepResult(
            "collector",
            False,
            "sglang.test.ci.ci_register.collect_tests refused the files",
            data.get("collect_error") or data.get("log", ""),
        )
    suites = load_conventions()["suites"]
    problems = []
    seen = {t: 0 for t in tests}
    for reg in data["registries"]:
        seen[reg["file"]] = seen.get(reg["file"], 0) + 1
        backend = reg["backend"].lower()
        kind = f"{backend}-nightly" if reg["nightly"] else backend
        if reg["suite"] not in suites.get(kind, []):
            problems.append(
                f"{reg['file']}: register_{backend}_ci suite {reg['suite']!r} is not "
                f"a {kind} suite upstream runs ({', '.join(suites.get(kind, []))})"
            )
    for path, count in seen.items():
        if not count:
            problems.append(f"{path}: no registration")
    regs = ", ".join(
        f"{r['backend'].lower()}:{r['suite']} ({r['est_time']:g} s)"
        for r in data["registries"]
    )
    return StepResult(
        "collector",
        not problems,
        f"collect_tests: {regs}" + ("" if not problems else "; " + "; ".join(problems)),
        "\n".join(problems),
    )
