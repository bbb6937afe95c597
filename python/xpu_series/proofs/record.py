"""The committed record of each patch's last full proof (patches/proofs.json): what
verify and --mutants found, keyed by the content of everything the proof read,
and which unchanged patches a run re-proves (a seeded sample) instead of trusting.

A patch whose key changed, or that has no record, is proven in full. An unchanged
one is trusted unless the run's sample picks it; a sampled re-proof that
disagrees with the record fails the run. `XPU_SERIES_PROVE_ALL=1` (or `--all`)
re-proves every patch.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import math
import os
import random
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xpu_series
from xpu_series.errors import SeriesError
from xpu_series.proofs.mutants import ACCEPTED

RECORD = "proofs.json"  # in patches/
FORMAT = 1
# The run's seed (printed, so a run's choice can be repeated); CI's step runner
# sets one per run.
SEED_ENV = "XPU_SERIES_PROOF_SEED"
# Set to 1, every patch is re-proven (the weekly workflow).
ALL_ENV = "XPU_SERIES_PROVE_ALL"
# How many unchanged patches a run re-proves (default SAMPLE).
SAMPLE_ENV = "XPU_SERIES_PROOF_SAMPLE"
SAMPLE = 2
# How many of a sampled patch's mutants its re-proof runs (default SPOT): a
# seeded few, so a patch of 146 mutants, or of servers that hang until their
# time limit, costs a run what a small one does. Its full proof, --all, the
# weekly workflow and --record run every mutant.
SPOT_ENV = "XPU_SERIES_PROOF_MUTANTS"
SPOT = 8
# What a sampled re-proof may cost, in the seconds its test runs took when
# recorded (each record's "seconds"). The sample is weighted: a patch within the
# budget weighs 1, a costlier one budget/cost, and its chance to be drawn is in
# proportion, so no patch adds more than the budget to what a run costs on
# average. A patch whose tests start servers (79-142 s) weighs 0.2 to 0.4 against
# a light one's 1 (2-16 s), so it still comes up in some runs, and the weekly
# workflow re-proves them all. Once a first pick is drawn, later picks are taken only
# while they fit the budget together: a run re-proves one heavy patch at most.
# 0: no bound, no weights.
BUDGET_ENV = "XPU_SERIES_PROOF_BUDGET"
BUDGET_S = 30
# The parts of a patch's record: its proof (verify) and its mutants.
PARTS = ("verify", "mutants")

_PACKAGE = Path(xpu_series.__file__).resolve().parent


def proof_code() -> list[Path]:
    """The code a proof's verdict depends on: the proof machinery and the verb.

    >>> [p.name for p in proof_code()][-2:]
    ['series_proof.py', 'verify.py']
    """
    files = sorted((_PACKAGE / "proofs").glob("*.py"))
    return [*files, _PACKAGE / "commands" / "verify.py"]


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _files_digest(root: Path, files: Iterable[Path]) -> str:
    """Names (relative to `root` where they lie below it) and contents."""
    parts: list[bytes] = []
    for path in files:
        try:
            name = str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            name = path.name
        parts.append(name.encode())
        parts.append(path.read_bytes() if path.is_file() else b"\0(missing)")
    return _digest(parts)


def code_digest() -> str:
    """The proof code, by content."""
    return _files_digest(_PACKAGE, proof_code())


def environment_digest(root: Path) -> str:
    """What the test environment is: the Python version and what pyproject.toml
    says of the project (its pinned test dependencies), of the tool and of pytest.
    Lint settings do not change a proof and are left out."""
    parts = [f"python {sys.version_info[0]}.{sys.version_info[1]}".encode()]
    path = root / "pyproject.toml"
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise SeriesError(f"{path} is not valid TOML: {exc}") from None
        tool = data.get("tool", {})
        wanted = {
            "project": data.get("project", {}),
            "tool.xpu-series": tool.get("xpu-series", {}),
            "tool.pytest": tool.get("pytest", {}),
        }
        parts.append(json.dumps(wanted, sort_keys=True).encode())
    return _digest(parts)


# -- what a patch's tests read from the checkout ------------------------------


def _imported(path: Path) -> set[str]:
    """Top-level module names a Python file imports (anywhere in it)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _module_index(tests: Path) -> dict[str, list[Path]]:
    """Top-level module name -> the files under test/ an import of it can load
    (the tests put their own folders on sys.path): a module's file, or every
    file of a package."""
    index: dict[str, list[Path]] = {}
    if not tests.is_dir():
        return index
    for path in sorted(tests.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        if path.name == "__init__.py":
            package = path.parent
            index.setdefault(package.name, []).extend(
                p for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts
            )
        else:
            index.setdefault(path.stem, []).append(path)
    return index


def _beside(path: Path, root: Path) -> list[Path]:
    """What a run of `path` reads around it: every other file of its folder but
    the other tests (configs, data, helpers), and the conftest.py files, helper
    modules and JSON files of the folders above it, up to the checkout."""
    out: list[Path] = []
    folder = path.parent
    if folder.is_dir():
        out += [
            p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith("test_") and p.suffix != ".pyc"
        ]
    for parent in folder.parents:
        if parent == root or root not in parent.parents:
            break
        out += [
            p
            for p in parent.iterdir()
            if p.is_file()
            and p.suffix in (".py", ".json")
            and not p.name.startswith("test_")
        ]
    return out


def files_tests_read(root: Path, tests: Iterable[str]) -> list[Path]:
    """Every file of the checkout a run of `tests` reads: the test files, what
    lies beside and above them (see _beside), and, transitively, every module
    they import that lives under test/ with what lies beside it."""
    root = root.resolve()
    index = _module_index(root / "test")
    # An input of its own (each patch's entries), not of the tests beside it.
    accepted = root / ACCEPTED
    seen: set[Path] = set()
    todo = [root / t.split("::")[0] for t in tests]
    while todo:
        path = todo.pop().resolve()
        if path in seen or not path.is_file() or path == accepted:
            continue
        seen.add(path)
        todo += _beside(path, root)
        if path.suffix == ".py":
            for name in sorted(_imported(path)):
                todo += index.get(name, [])
    return sorted(seen)


# -- a patch's inputs and key --------------------------------------------------


@dataclass(frozen=True)
class PatchInputs:
    """One digest per kind of input a patch's proof depends on."""

    digests: Mapping[str, str]

    @property
    def key(self) -> str:
        text = json.dumps(dict(self.digests), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def changed(self, recorded: Mapping[str, str]) -> list[str]:
        """The kinds of input that differ from a recorded set."""
        kinds = sorted(set(self.digests) | set(recorded))
        return [k for k in kinds if self.digests.get(k) != recorded.get(k)]


@dataclass(frozen=True)
class SeriesFacts:
    """What the key of every patch of a series is computed from."""

    root: Path
    names: list[str]
    files: list[Path]  # the patch files, in series order
    tests: list[tuple[str, ...]]  # Tests: and Fast-Tests: of each patch
    trees: list[str]  # tree id of prefix 0..n (upstream, then each patch)
    accepted: Mapping[str, Mapping[str, str]]  # patch -> mutant id -> reason
    pin: Path


def patch_inputs(facts: SeriesFacts, k: int) -> PatchInputs:
    """The inputs of patch k (1-based): the patch, the patches below it, what its
    tests read, its accepted mutants, the pin (which names the wheel's sha256),
    the trees it is tested on, the proof code, the tool and the environment."""
    name = facts.names[k - 1]
    below = [
        part
        for n, f in zip(facts.names[: k - 1], facts.files[: k - 1], strict=True)
        for part in (n.encode(), f.read_bytes())
    ]
    accepted = json.dumps(dict(facts.accepted.get(name, {})), sort_keys=True)
    return PatchInputs(
        {
            "patch": _digest([name.encode(), facts.files[k - 1].read_bytes()]),
            "below": _digest(below),
            "tests": _files_digest(
                facts.root, files_tests_read(facts.root, facts.tests[k - 1])
            ),
            "accepted-mutants": _digest([accepted.encode()]),
            "pin": _digest([facts.pin.read_bytes()]),
            "trees": _digest([facts.trees[k - 1].encode(), facts.trees[k].encode()]),
            "proof-code": code_digest(),
            "tool": _digest([xpu_series.__version__.encode()]),
            "environment": environment_digest(facts.root),
        }
    )


# -- the record file -----------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """One part (verify or mutants) of one patch's last full proof."""

    inputs: Mapping[str, str]
    result: Mapping[str, Any]

    @property
    def key(self) -> str:
        return PatchInputs(self.inputs).key


def record_path(patches_dir: Path) -> Path:
    return patches_dir / RECORD


def load_record(patches_dir: Path, part: str) -> dict[str, Recorded] | None:
    """Patch name -> its recorded `part`; None when the series keeps no record
    (every patch is then proven in full, every run)."""
    path = record_path(patches_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SeriesError(
            f"{path} is not valid JSON: {exc}",
            hint="run 'xpu-series verify --all --record' and "
            "'xpu-series verify --mutants --all --record' to write it again",
        ) from None
    if data.get("format") != FORMAT:
        return {}  # another format: nothing in it is trusted
    out: dict[str, Recorded] = {}
    for name, entry in data.get("patches", {}).items():
        kept = entry.get(part)
        if isinstance(kept, dict) and "inputs" in kept and "result" in kept:
            out[name] = Recorded(kept["inputs"], kept["result"])
    return out


def save_record(
    patches_dir: Path, part: str, names: list[str], proven: Mapping[str, Recorded]
) -> None:
    """Write `proven` into the record's `part`, keep the other part, and drop
    patches that left the series. verify and --mutants may record side by side:
    one writer at a time, and the file is replaced whole."""
    path = record_path(patches_dir)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if data.get("format") != FORMAT:
            data = {}
        old = data.get("patches", {})
        patches: dict[str, dict[str, Any]] = {}
        for name in names:
            entry = dict(old.get(name, {}))
            if name in proven:
                entry[part] = {
                    "inputs": dict(sorted(proven[name].inputs.items())),
                    "result": proven[name].result,
                }
            if entry:
                patches[name] = entry
        text = json.dumps(
            {
                "format": FORMAT,
                "about": "each patch's last full proof; 'xpu-series verify "
                "--record' and 'verify --mutants --record' write it",
                "patches": patches,
            },
            indent=1,
            sort_keys=True,
        )
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    path.with_suffix(".lock").unlink(missing_ok=True)


# -- which patches a run proves -----------------------------------------------


@dataclass
class ProofPlan:
    """Per patch (1-based index): proven in full (no record, or its key
    changed, or named), re-proven as part of the sample (or under --all), or
    trusted from the record."""

    prove: dict[int, str] = field(default_factory=dict)  # k -> why
    reprove: list[int] = field(default_factory=list)
    trusted: list[int] = field(default_factory=list)
    seed: int | None = None
    everything: bool = False
    keeping: bool = True  # False: the series keeps no record

    def describe(self, names: list[str]) -> str:
        """One line for the log: what this run proves and what it trusts."""
        if not self.keeping:
            return ""
        short = [n[:4] for n in names]
        parts = []
        if self.prove:
            parts.append(
                "proving "
                + ", ".join(f"{short[k - 1]} ({why})" for k, why in self.prove.items())
            )
        if self.seed is None:  # --all, or patches named: no sample
            if self.reprove:
                chosen = ", ".join(short[k - 1] for k in self.reprove)
                parts.append(f"re-proving {chosen} (unchanged)")
        elif self.reprove or self.trusted:
            chosen = ", ".join(short[k - 1] for k in self.reprove) or "none"
            parts.append(
                f"re-proving {chosen} of {len(self.reprove) + len(self.trusted)} "
                f"unchanged (seed {self.seed}; {SEED_ENV}={self.seed} repeats the "
                f"choice); the record stands for the other {len(self.trusted)}"
            )
        return "proofs: " + "; ".join(parts)


def run_seed() -> int:
    """The run's seed: from the environment, else a fresh random one."""
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        try:
            return int(text)
        except ValueError:
            raise SeriesError(f"{SEED_ENV}={text!r} is not a whole number") from None
    return random.SystemRandom().randrange(1, 10**9)


def _count(name: str, default: int) -> int:
    """A count from the environment variable `name` (`default` when unset)."""
    text = os.environ.get(name, "").strip()
    try:
        return max(0, int(text)) if text else default
    except ValueError:
        raise SeriesError(f"{name}={text!r} is not a whole number") from None


def sample_size() -> int:
    """How many unchanged patches a run re-proves."""
    return _count(SAMPLE_ENV, SAMPLE)


def spot_size() -> int:
    """How many mutants a sampled re-proof runs (0: every one)."""
    return _count(SPOT_ENV, SPOT)


def budget_s() -> int | None:
    """The sample's budget in recorded seconds: what weighs a costly patch down
    and bounds the later picks together (None: neither, as
    XPU_SERIES_PROOF_BUDGET=0 asks)."""
    return _count(BUDGET_ENV, BUDGET_S) or None


def as_seconds(value: object) -> float | None:
    """A time a record, a cache entry or a worker gave; None if not a number."""
    return float(value) if isinstance(value, int | float) else None


def total_seconds(parts: Iterable[float | None]) -> float | None:
    """How long some runs took together; None when one of them is not known."""
    known = list(parts)
    return None if None in known else sum(known)  # type: ignore[arg-type]


def recorded_seconds(recorded: Mapping[str, Recorded] | None) -> dict[str, float]:
    """Each patch's recorded seconds, where its record has them."""
    out: dict[str, float] = {}
    for name, entry in (recorded or {}).items():
        seconds = as_seconds(entry.result.get("seconds"))
        if seconds is not None:
            out[name] = seconds
    return out


def prove_all_asked() -> bool:
    return os.environ.get(ALL_ENV, "").strip() not in ("", "0")


def plan_proofs(
    names: list[str],
    chosen: list[int],
    named: bool,
    keys: Mapping[int, PatchInputs],
    recorded: Mapping[str, Recorded] | None,
    everything: bool,
    seed: int | None = None,
    size: int = SAMPLE,
    *,
    costs: Mapping[str, float] | None = None,
    budget: float | None = None,
) -> ProofPlan:
    """Split `chosen` patches into proven, re-proven and trusted. Patches named
    on the command line are all run; the sample is drawn from the unchanged
    ones by `seed`, within `budget` by `costs` (see sample)."""
    plan = ProofPlan(everything=everything, keeping=recorded is not None)
    unchanged: list[int] = []
    for k in chosen:
        entry = None if recorded is None else recorded.get(names[k - 1])
        if entry is None:
            plan.prove[k] = "no record" if recorded is not None else "proven"
        elif entry.key != keys[k].key:
            plan.prove[k] = "changed: " + ", ".join(keys[k].changed(entry.inputs))
        else:
            unchanged.append(k)
    if everything or named:
        plan.reprove = unchanged
        return plan
    plan.seed = run_seed() if seed is None else seed
    unchanged_names = [names[k - 1] for k in unchanged]
    picked = set(sample(plan.seed, unchanged_names, size, costs, budget))
    plan.reprove = [k for k in unchanged if names[k - 1] in picked]
    plan.trusted = [k for k in unchanged if names[k - 1] not in picked]
    return plan


def sample(
    seed: int,
    names: list[str],
    size: int,
    costs: Mapping[str, float] | None = None,
    budget: float | None = None,
) -> list[str]:
    """The `size` names first in the seed's order: a seed always picks the same
    ones, and a patch added to the series changes the pick only by taking a
    place itself (so a run with one patch more costs what that patch costs, not
    a different sample).

    Without a `budget` each name's chance is the same. With one, a name whose
    `costs` (0 where unknown) exceed it weighs budget/cost, and is first in the
    order that much less often; after the first pick, a name is taken only
    while the later picks' costs stay within the budget, and one that does not
    fit is passed over for the next.

    >>> sample(7, ["a", "b", "c", "d"], 2) == sample(7, ["d", "c", "b", "a"], 2)
    True
    >>> set(sample(7, ["a", "b", "c"], 2)) <= set(sample(7, ["a", "b", "c", "e"], 3))
    True
    >>> sample(7, ["a", "b", "c", "d"], 2)
    ['a', 'c']
    >>> sample(7, ["a", "b", "c", "d"], 2, {"a": 50, "c": 5}, 30)
    ['c', 'd']
    >>> sample(8, ["a", "b", "c", "d"], 2, {"a": 31, "c": 50}, 30)
    ['a', 'd']
    """
    cost = {name: (costs or {}).get(name, 0.0) for name in names}

    def weight(name: str) -> float:
        return budget / cost[name] if budget and cost[name] > budget else 1.0

    ranked = sorted(names, key=lambda name: _draw(seed, name) / weight(name))
    if budget is None:
        return sorted(ranked[:size])
    picked: list[str] = []
    spent = 0.0
    for name in ranked:
        if len(picked) >= size:
            break
        if picked and spent + cost[name] > budget:
            continue
        if picked:
            spent += cost[name]
        picked.append(name)
    return sorted(picked)


def _draw(seed: int, name: str) -> float:
    """An exponential draw (rate 1) from the hash of `seed` and `name`: sorting
    by draw/weight puts each name first with a chance of weight/sum of weights
    (the draws are independent, so one name's draw never moves another's), and
    with equal weights it is the order of the hashes."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    uniform = (int.from_bytes(digest, "big") + 0.5) / 2**256
    return -math.log1p(-uniform)


def in_ci() -> bool:
    """CI sets CI=true: there, a stale record fails the run."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


RECORD_HINT = (
    "run 'xpu-series verify --record' and 'xpu-series verify --mutants --record', "
    "then commit patches/proofs.json"
)
