"""unregister: remove the tests of a retired patch that no longer hold, and say why.

A retired patch (patches/upstreamed/ or patches/dropped/) whose tests fail on the
new base either gets them ported, or loses them here: each test file that no
carried patch also names is deleted, and the retired patch's `Tests:` lines become
`Tests-Removed: PATH (REASON)`, so the record of what was tested, and why it no
longer is, stays with the patch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.commands import Context, Output
from xpu_series.errors import UsageError
from xpu_series.project import Project
from xpu_series.stack.header import parse_header
from xpu_series.stack.operation import require_idle

HELP = "remove a retired patch's tests that no longer hold, recording why"
RETIRED_DIRS = ("upstreamed", "dropped")


@dataclass
class Unregistered:
    """What unregister did to one retired patch."""

    patch: str
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "removed": self.removed,
            "kept": self.kept,
            "ok": True,
        }


def _find_retired(project: Project, name: str) -> Path:
    carried = [p.name for p in project.series().patches]
    if any(n == name or n.split("-", 1)[0] == name for n in carried):
        raise UsageError(
            f"{name} is carried by the series: its tests are what proves it",
            hint="unregister is for retired patches (patches/upstreamed/, "
            "patches/dropped/)",
        )
    found = [
        path
        for folder in RETIRED_DIRS
        for path in sorted((project.patches_dir / folder).glob("*.patch"))
        if path.name == name or path.name.split("-", 1)[0] == name
    ]
    if len(found) != 1:
        raise UsageError(
            f"no retired patch named {name!r}"
            if not found
            else f"{name!r} names more than one retired patch",
            hint="name a file of patches/upstreamed/ or patches/dropped/",
        )
    return found[0]


def run_unregister(project: Project, name: str, reason: str) -> Unregistered:
    """Remove the retired patch `name`'s test files and record why in its header."""
    require_idle(project.operations, "unregister")
    if not reason.strip():
        raise UsageError(
            "say why the tests go", hint="add --reason TEXT (it is kept in the patch)"
        )
    path = _find_retired(project, name)
    text = path.read_text(encoding="utf-8")
    tests = parse_header(text).tests
    if not tests:
        raise UsageError(f"{path.name} names no Tests: there is nothing to remove")
    carried = {
        t.split("::")[0] for p in project.series().patches for t in p.header.tests
    }
    result = Unregistered(str(path.relative_to(project.root)))
    for test in tests:
        rel = test.split("::")[0]
        if rel in carried:
            result.kept.append(rel)
            continue
        (project.root / rel).unlink(missing_ok=True)
        result.removed.append(rel)
    lines = text.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line == "---\n"), len(lines))
    head = [
        f"Tests-Removed: {line.split(':', 1)[1].strip()} ({reason.strip()})\n"
        if line.startswith("Tests:")
        else line
        for line in lines[:cut]
    ]
    path.write_text("".join(head + lines[cut:]), encoding="utf-8")
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("patch", metavar="PATCH", help="a retired patch, or its number")
    p.add_argument("--reason", default="", help="why its tests no longer hold")


def execute(ctx: Context) -> Output:
    project = ctx.project()
    done = run_unregister(project, ctx.args.patch, ctx.args.reason)
    out = Output(data=done.to_json())
    for rel in done.removed:
        out.out.append(f"removed {rel}")
    for rel in done.kept:
        out.out.append(f"kept {rel}: a carried patch names it too")
    out.out.append(f"recorded in {done.patch} as Tests-Removed, with the reason")
    return out
