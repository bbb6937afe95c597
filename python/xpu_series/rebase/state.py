"""The rebase's state: the operation it starts, the bookkeeping of the patches it
retires or drops, and the result it returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpu_series.project import Project
from xpu_series.rebase.plan import DROPPED, UPSTREAMED, DriftRow
from xpu_series.stack.header import parse_header
from xpu_series.stack.operation import Operation
from xpu_series.stack.pin import Pin
from xpu_series.stack.plan import Decision
from xpu_series.stack.sequencer import Outcome


def new_operation(
    pin: Pin, tree: Path, onto: str, wheel: Path | None, decisions: list[Decision]
) -> Operation:
    """The state of a rebase from `pin` onto sglang `onto` (from the local `wheel`
    if one is named), with the plan's decisions."""
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
    return Operation(
        kind="rebase",
        tree=str(tree),
        target=target,
        plan=[d.to_json() for d in decisions],
    )


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


def retired_header(text: str, done: dict[str, Any], new_version: str) -> str:
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


def retired_entries(project: Project, op: Operation) -> list[dict[str, Any]]:
    """Every patch the rebase did not carry: where it went, why, and its tests."""
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


def run_retired_tests(
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
