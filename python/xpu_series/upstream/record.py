"""The committed record of `upstream --all --check` (patches/upstream-checks.json):
each export's last full check, keyed by everything the check reads, and trusted as
proofs are (proofs/record.py).

The key of an export's check: its exported patch files, the tree they apply to,
the pin, the check code (this package, with upstream's conventions), the tool,
the Python and the pinned environment. `--all --check` checks an export in full
when it has no record or its key changed, re-checks a seeded sample of the
unchanged ones (a re-check that disagrees with the record, step by step or test
by test, fails the run), and takes the rest from the record; under CI a missing
or stale record fails the run once the check is done. A patch or bundle named on
the command line is always checked. `XPU_SERIES_PROVE_ALL=1` checks every one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xpu_series
from xpu_series.errors import SeriesError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.proofs.record import (
    SEED_ENV,
    PatchInputs,
    Recorded,
    environment_digest,
    plan_proofs,
    prove_all_asked,
    sample_size,
)
from xpu_series.upstream.check import CheckResult
from xpu_series.upstream.export import Export

RECORD = "upstream-checks.json"  # in patches/
FORMAT = 1
RECORD_HINT = (
    f"run 'xpu-series upstream --all --check --record', then commit patches/{RECORD}"
)
_PACKAGE = Path(__file__).resolve().parent


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def check_code_digest() -> str:
    """This package's code and data (upstream's conventions), by content."""
    files = sorted(
        p for p in _PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    return _digest([b for p in files for b in (p.name.encode(), p.read_bytes())])


def check_inputs(project: Project, export: Export, git: Git) -> PatchInputs:
    """One digest per kind of input the check of `export` reads."""
    base_tree = git.out("rev-parse", f"{export.base}^{{tree}}")
    return PatchInputs(
        {
            "export": _digest(
                [
                    b
                    for p in export.patch_files
                    for b in (p.name.encode(), p.read_bytes())
                ]
            ),
            "base": _digest([base_tree.encode()]),
            "pin": _digest([(project.patches_dir / "upstream.toml").read_bytes()]),
            "check-code": check_code_digest(),
            "tool": _digest([xpu_series.__version__.encode()]),
            "python": _digest([sys.version.encode()]),
            "environment": environment_digest(project.root),
        }
    )


def result_from_json(data: Mapping[str, Any]) -> CheckResult:
    """A recorded check, as run_check returned it."""
    from xpu_series.upstream.check import StepResult

    return CheckResult(
        steps=[
            StepResult(s["step"], bool(s["ok"]), s["summary"], s.get("detail", ""))
            for s in data.get("steps", [])
        ],
        without=dict(data.get("without", {})),
        with_export=dict(data.get("with", {})),
        seconds=float(data.get("seconds", 0.0)),
    )


def disagreement(measured: CheckResult, kept: CheckResult) -> str:
    """How a re-check differs from its record ('' if it agrees): a step's
    verdict, or a test's outcome without or with the export."""
    steps = [(s.name, s.ok) for s in measured.steps]
    recorded = [(s.name, s.ok) for s in kept.steps]
    if steps != recorded:
        return f"steps {steps}, recorded {recorded}"
    for part, now, then in (
        ("without", measured.without, kept.without),
        ("with", measured.with_export, kept.with_export),
    ):
        if now != then:
            tests = sorted(t for t in set(now) | set(then) if now.get(t) != then.get(t))
            first = tests[0]
            return (
                f"{part} the export, {first} was {now.get(first, 'not run')}, "
                f"recorded {then.get(first, 'not run')}"
                + (f" (and {len(tests) - 1} more)" if len(tests) > 1 else "")
            )
    return ""


def record_path(patches_dir: Path) -> Path:
    return patches_dir / RECORD


def load_checks(patches_dir: Path) -> dict[str, Recorded] | None:
    """Export name -> its recorded check; None when the series keeps no record
    (every export is then checked, every run)."""
    path = record_path(patches_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SeriesError(
            f"{path} is not valid JSON: {exc}", hint=RECORD_HINT
        ) from None
    if data.get("format") != FORMAT:
        return {}
    return {
        name: Recorded(kept["inputs"], kept["result"])
        for name, kept in (data.get("checks") or {}).items()
        if isinstance(kept, dict) and "inputs" in kept and "result" in kept
    }


def save_checks(
    patches_dir: Path, checked: Mapping[str, Recorded], keep: list[str]
) -> Path:
    """Write `checked`, keep the other records of exports in `keep` (the run's
    whole list under --all: the others left the series), one rename."""
    path = record_path(patches_dir)
    old = load_checks(patches_dir) or {}
    entries = {n: old[n] for n in keep if n in old and n not in checked}
    entries.update(checked)
    text = json.dumps(
        {
            "format": FORMAT,
            "about": "each upstream export's last full check; 'xpu-series upstream "
            "--all --check --record' writes it",
            "checks": {
                n: {"inputs": dict(sorted(r.inputs.items())), "result": r.result}
                for n, r in sorted(entries.items())
            },
        },
        indent=1,
        sort_keys=True,
    )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


@dataclass
class CheckPlan:
    """Per export name: checked in full (and why), re-checked (the sample), or
    taken from the record; and the line that says so."""

    check: dict[str, str] = field(default_factory=dict)
    recheck: dict[str, CheckResult] = field(default_factory=dict)
    trusted: dict[str, CheckResult] = field(default_factory=dict)
    keeping: bool = False
    line: str = ""

    @property
    def stale(self) -> list[str]:
        """What a run under CI fails on: exports checked for want of a record."""
        return [f"{n} ({why})" for n, why in self.check.items() if self.keeping]


def plan_checks(
    names: list[str],
    keys: Mapping[str, PatchInputs],
    recorded: Mapping[str, Recorded] | None,
    named: bool,
) -> CheckPlan:
    """Split exports into checked, re-checked and trusted, as verify splits
    patches (a named export is always checked)."""
    index = {k: name for k, name in enumerate(names, start=1)}
    proof = plan_proofs(
        names,
        list(index),
        named,
        {k: keys[n] for k, n in index.items()},
        recorded,
        prove_all_asked(),
        None,
        sample_size(),
    )
    plan = CheckPlan(keeping=recorded is not None and not named)
    if recorded is None:
        plan.check = {n: "no record" for n in names}
        return plan
    for k, why in proof.prove.items():
        plan.check[index[k]] = why
    for k in proof.reprove:
        plan.recheck[index[k]] = result_from_json(recorded[index[k]].result)
    for k in proof.trusted:
        plan.trusted[index[k]] = result_from_json(recorded[index[k]].result)
    if named:
        return plan
    again = ", ".join(index[k] for k in proof.reprove) or "none"
    plan.line = (
        f"check record: {len(proof.trusted)} of {len(names)} exports from "
        f"patches/{RECORD}; re-checking {again}"
    )
    if proof.seed is not None:
        plan.line += f" (seed {proof.seed}; {SEED_ENV}={proof.seed} repeats the choice)"
    if proof.prove:
        plan.line += f"; checking {len(proof.prove)} with no record or a changed key"
    return plan
