"""The committed record of the registered tests' last full run on the series' tree
(patches/registered.json): each test file's outcomes, keyed by the content of
everything that run read, and which unchanged files a run re-checks.

A file whose key changed, or that has no record, runs. So does every file whose
recorded run was cheap (CHEAP_S): re-running it is the check. Of the costly
unchanged ones a seeded sample runs, weighted by cost as verify's is; a re-run
whose outcomes differ from the record fails the run. `XPU_SERIES_PROVE_ALL=1`
(the weekly workflow) runs every file.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xpu_series
from xpu_series.errors import SeriesError
from xpu_series.proofs.record import (
    SEED_ENV,
    _digest,
    _files_digest,
    budget_s,
    environment_digest,
    files_tests_read,
    run_seed,
    sample,
)

RECORD = "registered.json"  # in patches/
FORMAT = 1
# A file whose recorded run took at most this many seconds always runs.
CHEAP_S = 2.0
# How many costly unchanged files a run re-checks.
SAMPLE_ENV = "XPU_SERIES_REGISTERED_SAMPLE"
SAMPLE = 1
HINT = (
    "run '.venv/bin/python -m pytest -q -p no:cacheprovider -p "
    "xpu_series.registered.plugin --registered-record=patches/registered.json "
    "--registered-write test/registered/unit', then commit patches/registered.json"
)

_HERE = Path(__file__).resolve()


def code_digest() -> str:
    """What decides a verdict: this package, and the proofs' record whose key
    parts and sample it borrows."""
    files = [
        *sorted(_HERE.parent.glob("*.py")),
        _HERE.parents[1] / "proofs" / "record.py",
    ]
    return _digest(p.read_bytes() for p in files)


def tree_state(tree: Path | None) -> str:
    """The git tree id the tests import sglang from, or why there is none to
    key by: a tree with changes git does not hold is never trusted."""
    if tree is None:
        return "no tree: sglang is not importable"

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=False
        )

    top = git("rev-parse", "--show-toplevel")
    if top.returncode:
        return f"no tree: {tree} is not in a git repository"
    state = git("status", "--porcelain", "--untracked-files=all")
    if state.returncode or state.stdout.strip():
        return f"changed: {top.stdout.strip()} has changes git does not hold"
    head = git("rev-parse", "HEAD^{tree}")
    if head.returncode:
        return f"no tree: {top.stdout.strip()} has no commit"
    return "tree " + head.stdout.strip()


def shared_inputs(root: Path, tree: str) -> dict[str, str]:
    """The digests of what every test file's run depends on alike."""
    pin = root / "patches" / "upstream.toml"
    return {
        "tree": _digest([tree.encode()]),
        "pin": _digest([pin.read_bytes() if pin.is_file() else b""]),
        "environment": environment_digest(root),
        "code": code_digest(),
        "tool": _digest([xpu_series.__version__.encode()]),
    }


def file_inputs(
    root: Path, test: str, tree: str, shared: Mapping[str, str] | None = None
) -> dict[str, str]:
    """One digest per kind of input a test file's run depends on (`shared`:
    shared_inputs, when the caller has it already)."""
    return {
        **(shared_inputs(root, tree) if shared is None else shared),
        "tests": _files_digest(root, files_tests_read(root, [test])),
    }


@dataclass(frozen=True)
class FileRecord:
    """One test file's last full run: its inputs, each test's outcome, seconds."""

    inputs: Mapping[str, str]
    outcomes: Mapping[str, str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": dict(sorted(self.inputs.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "seconds": round(self.seconds, 1),
        }


def load(path: Path) -> dict[str, FileRecord]:
    """Test file -> its record; empty when there is none (every file runs)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SeriesError(f"{path} is not valid JSON: {exc}", hint=HINT) from None
    if data.get("format") != FORMAT:
        return {}
    out: dict[str, FileRecord] = {}
    for name, entry in data.get("files", {}).items():
        try:
            out[name] = FileRecord(
                dict(entry["inputs"]), dict(entry["outcomes"]), float(entry["seconds"])
            )
        except (KeyError, TypeError, ValueError):
            continue  # a damaged entry: that file runs
    return out


def save(path: Path, records: Mapping[str, FileRecord]) -> None:
    """Write every file's record, replacing the file whole."""
    text = json.dumps(
        {
            "format": FORMAT,
            "about": "the registered tests' last full run on the series' tree; "
            "the registered step's --registered-write writes it",
            "files": {n: records[n].to_json() for n in sorted(records)},
        },
        indent=1,
        sort_keys=True,
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class Plan:
    """Which test files run and why, and which the record stands for."""

    run: dict[str, str] = field(default_factory=dict)  # file -> why
    sampled: list[str] = field(default_factory=list)
    trusted: list[str] = field(default_factory=list)
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    seed: int | None = None

    @property
    def stale(self) -> dict[str, str]:
        """Files that run because their record is missing or changed."""
        return {f: why for f, why in self.run.items() if why not in ("cheap", "all")}

    def stale_files(self) -> list[str]:
        """The stale files by reason: named when a reason has three or fewer."""
        by_why: dict[str, list[str]] = {}
        for name, why in sorted(self.stale.items()):
            by_why.setdefault(why, []).append(name)
        return [
            f"{', '.join(names)} ({why})"
            if len(names) <= 3
            else f"{len(names)} files ({why})"
            for why, names in by_why.items()
        ]

    def describe(self) -> str:
        """One line for the log: what runs, why, and what the record stands for."""
        ran = len(self.run) + len(self.sampled)
        parts = self.stale_files()
        cheap = sum(1 for why in self.run.values() if why == "cheap")
        every = sum(1 for why in self.run.values() if why == "all")
        if every:
            parts.append(f"{every} unchanged (every file asked)")
        if cheap:
            parts.append(f"{cheap} cheap")
        if self.sampled:
            parts.append(f"re-checking {', '.join(self.sampled)}")
        line = f"registered record: {ran} of {ran + len(self.trusted)} files run"
        line += f": {'; '.join(parts)}" if parts else ""
        if self.seed is not None:
            line += f"; seed {self.seed} ({SEED_ENV}={self.seed} repeats the choice)"
        return line + f"; the record stands for {len(self.trusted)}"


def sample_size() -> int:
    text = os.environ.get(SAMPLE_ENV, "").strip()
    try:
        return max(0, int(text)) if text else SAMPLE
    except ValueError:
        raise SeriesError(f"{SAMPLE_ENV}={text!r} is not a whole number") from None


def plan(
    root: Path,
    files: list[str],
    tree: str,
    records: Mapping[str, FileRecord],
    *,
    everything: bool = False,
    seed: int | None = None,
) -> Plan:
    """Split `files` (relative to `root`) into those that run and those the
    record stands for (see the module's docstring)."""
    out = Plan()
    costly: list[str] = []
    shared = shared_inputs(root, tree)
    for name in files:
        inputs = file_inputs(root, name, tree, shared)
        out.inputs[name] = inputs
        kept = records.get(name)
        if not tree.startswith("tree "):
            out.run[name] = tree
        elif kept is None:
            out.run[name] = "no record"
        elif dict(kept.inputs) != inputs:
            changed = sorted(k for k in inputs if inputs[k] != kept.inputs.get(k))
            out.run[name] = "changed: " + ", ".join(changed)
        elif everything or kept.seconds <= CHEAP_S:
            out.run[name] = "all" if everything else "cheap"
        else:
            costly.append(name)
    if costly:
        out.seed = run_seed() if seed is None else seed
        costs = {name: records[name].seconds for name in costly}
        out.sampled = sample(out.seed, costly, sample_size(), costs, budget_s())
        out.trusted = [n for n in costly if n not in out.sampled]
    return out


def disagreement(kept: FileRecord, outcomes: Mapping[str, str]) -> str:
    """How a re-run's outcomes differ from the record ('' when they agree)."""
    if dict(outcomes) == dict(kept.outcomes):
        return ""
    notes = []
    for nodeid in sorted(set(outcomes) | set(kept.outcomes)):
        was, now = kept.outcomes.get(nodeid, "absent"), outcomes.get(nodeid, "absent")
        if was != now:
            notes.append(f"{nodeid.split('::', 1)[-1]}: {was} on record, {now} now")
    return "; ".join(notes)
