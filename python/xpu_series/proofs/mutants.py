"""Mutants of the lines a patch adds: cosmic-ray's operators (on its parso trees)
scoped to the patch's own diff, plus the operators our patches need that it lacks.

The enumeration and the mutation itself are cosmic-ray's (`Visitor`,
`mutation_positions`, `MutationVisitor.mutate_code`); this module only picks the
occurrences that start on an added line, adds line-level operators, and names
each mutant stably so a reviewed file can accept it.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpu_series.errors import SeriesError
from xpu_series.git import Git
from xpu_series.proofs import TEST_ENV

# cosmic-ray's operators we use: the ones that model real mistakes in gate and
# wiring code (flipped conditions, swapped boolean combinations, wrong constants).
# The full binary-operator cross product would mostly make equivalent noise.
COSMIC_RAY_OPERATORS = (
    "core/AddNot",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/NumberReplacer",
    "core/ZeroIterationForLoop",
    "core/RemoveDecorator",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/ReplaceComparisonOperator_Eq_NotEq",
    "core/ReplaceComparisonOperator_NotEq_Eq",
    "core/ReplaceComparisonOperator_Is_IsNot",
    "core/ReplaceComparisonOperator_IsNot_Is",
    "core/ReplaceComparisonOperator_Lt_GtE",
    "core/ReplaceComparisonOperator_GtE_Lt",
    "core/ReplaceComparisonOperator_Gt_LtE",
    "core/ReplaceComparisonOperator_LtE_Gt",
    "core/ReplaceBinaryOperator_Add_Sub",
    "core/ReplaceBinaryOperator_Sub_Add",
    "core/ReplaceUnaryOperator_Delete_Not",
)


@dataclass(frozen=True)
class Mutant:
    """One mutated version of one file of a patch."""

    path: str  # tree-relative
    operator: str
    line: int
    before: str
    after: str
    code: str  # the whole mutated file
    nth: int = 0  # tells apart identical changes on different lines

    @property
    def id(self) -> str:
        """Stable across line moves: what changed, not where."""
        h = hashlib.sha256(
            "\0".join(
                (
                    self.path,
                    self.operator,
                    self.before.strip(),
                    self.after.strip(),
                    str(self.nth),
                )
            ).encode()
        )
        return h.hexdigest()[:10]

    @property
    def diff(self) -> str:
        """The mutant as one line: path:line: -before +after."""
        return f"{self.path}:{self.line}: -{self.before.strip()} +{self.after.strip()}"


def added_lines(diff_text: str) -> dict[str, set[int]]:
    """Line numbers (new side) each file gains in a `git diff -U0`.

    >>> added_lines("+++ b/a.py\\n@@ -1,0 +2,2 @@\\n+x\\n+y\\n")
    {'a.py': {2, 3}}
    """
    hunk = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
    out: dict[str, set[int]] = {}
    current = ""
    for line in diff_text.splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else ""
        match = hunk.match(line)
        if match and current:
            start, length = int(match.group(1)), int(match.group(2) or 1)
            out.setdefault(current, set()).update(range(start, start + length))
    return {k: v for k, v in out.items() if v}


def _compiles(code: str, path: str) -> bool:
    try:
        compile(code, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _changed_line(original: str, mutated: str) -> tuple[int, str, str]:
    """The first line that differs: (1-based number, before, after)."""
    old, new = original.splitlines(), mutated.splitlines()
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        before = old[i1] if i1 < i2 else ""
        after = new[j1] if j1 < j2 else "(line removed)"
        return i1 + 1, before, after
    return 0, "", ""


def _cosmic_ray_mutants(source: str, path: str, lines: set[int]) -> Iterator[Mutant]:
    """cosmic-ray's operators on the nodes that start on an added line.

    cosmic-ray re-parses the whole module for every mutant; our patched files are
    large (server_args.py), so the module is parsed once and each mutation is
    made on a copy of the one node, swapped in for `get_code()` and back out.
    """
    import parso.tree
    from cosmic_ray.ast import get_ast
    from cosmic_ray.plugins import get_operator

    module = get_ast(source)
    operators = [(name, get_operator(name)()) for name in COSMIC_RAY_OPERATORS]

    def nodes(node: parso.tree.NodeOrLeaf) -> Iterator[parso.tree.NodeOrLeaf]:
        yield node
        for child in getattr(node, "children", ()):
            yield from nodes(child)

    for node in list(nodes(module)):
        parent = node.parent
        if parent is None:
            continue
        for name, operator in operators:
            for index, (start, _end) in enumerate(operator.mutation_positions(node)):
                if start[0] not in lines:
                    continue
                # A copy of just this subtree (not its parents) to mutate.
                node.parent = None
                clone = copy.deepcopy(node)
                node.parent = clone.parent = parent  # operators look at the parent
                new = operator.mutate(clone, index)
                children = parent.children
                at = children.index(node)
                parent.children = (
                    children[:at]
                    + ([new] if new is not None else [])
                    + children[at + 1 :]
                )
                try:
                    mutated = module.get_code()
                finally:
                    parent.children = children
                if mutated == source or not _compiles(mutated, path):
                    continue
                line, before, after = _changed_line(source, mutated)
                yield Mutant(path, name, line, before, after, mutated)


def _statement_lines(source: str) -> dict[int, ast.stmt]:
    """Simple statements that sit on exactly one line, by line number."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[int, ast.stmt] = {}
    compound = (
        ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef,
        ast.AsyncFunctionDef, ast.ClassDef, ast.AsyncFor, ast.AsyncWith,
    )  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, compound):
            if node.lineno == getattr(node, "end_lineno", node.lineno):
                out[node.lineno] = node
    return out


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _compare_ops(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [
        type(op).__name__
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for op in node.ops
    ]


def _line_mutants(source: str, path: str, lines: set[int]) -> Iterator[Mutant]:
    """Ours: drop one name from an added import, delete an added statement or
    collection element, swap two adjacent added statements, flip `in`."""
    text = source.splitlines(keepends=True)
    statements = _statement_lines(source)

    def make(operator: str, new_lines: list[str]) -> Iterator[Mutant]:
        mutated = "".join(new_lines)
        if mutated != source and _compiles(mutated, path):
            line, before, after = _changed_line(source, mutated)
            yield Mutant(path, operator, line, before, after, mutated)

    for number in sorted(lines):
        if number > len(text):
            continue
        raw = text[number - 1]
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = raw[: len(raw) - len(raw.lstrip())]
        node = statements.get(number)
        if isinstance(node, ast.ImportFrom | ast.Import) and len(node.names) > 1:
            for alias in node.names:
                kept = [a for a in node.names if a is not alias]
                names = ", ".join(
                    a.name + (f" as {a.asname}" if a.asname else "") for a in kept
                )
                head = (
                    f"from {'.' * node.level}{node.module or ''} import "
                    if isinstance(node, ast.ImportFrom)
                    else "import "
                )
                yield from make(
                    "xpu/DropImportedName",
                    [*text[: number - 1], f"{indent}{head}{names}\n", *text[number:]],
                )
        if node is not None and not isinstance(node, ast.Pass):
            if not (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            ):
                yield from make(
                    "xpu/DeleteStatement",
                    [*text[: number - 1], f"{indent}pass\n", *text[number:]],
                )
        elif node is None and stripped.endswith(",") and not stripped.endswith("(,"):
            # An element of a multi-line tuple, list, dict or call.
            yield from make("xpu/DeleteElement", [*text[: number - 1], *text[number:]])
        following = statements.get(number + 1)
        if (
            node is not None
            and following is not None
            and not _is_docstring(node)
            and not _is_docstring(following)
            and number + 1 in lines
            and following.col_offset == node.col_offset
            and text[number].strip() != stripped
        ):
            swapped = [*text[: number - 1], text[number], raw, *text[number + 1 :]]
            mutated = "".join(swapped)
            if _compiles(mutated, path):
                # A swap reads best as both lines, in both orders.
                second = text[number].strip()
                yield Mutant(
                    path, "xpu/SwapStatements", number,
                    f"{stripped} ; {second}", f"{second} ; {stripped}", mutated,
                )  # fmt: skip
        for match in re.finditer(r"(?<![\w.])(not in|in)(?= )", raw):
            flipped = "in" if match.group(1) == "not in" else "not in"
            new = raw[: match.start()] + flipped + raw[match.end() :]
            mutated = [*text[: number - 1], new, *text[number:]]
            # Only a real membership test counts (not the word in a string).
            if _compare_ops("".join(mutated)) != _compare_ops(source) and len(
                _compare_ops("".join(mutated))
            ) == len(_compare_ops(source)):
                yield from make("xpu/FlipMembership", mutated)


def mutants_of(source: str, path: str, lines: set[int]) -> list[Mutant]:
    """Every mutant of `source` that changes one of `lines`, without duplicates."""
    seen: set[str] = set()
    ids: set[str] = set()
    out: list[Mutant] = []
    for mutant in [
        *_cosmic_ray_mutants(source, path, lines),
        *_line_mutants(source, path, lines),
    ]:
        if mutant.code in seen or mutant.line not in lines and not mutant.before:
            continue
        seen.add(mutant.code)
        while mutant.id in ids:
            mutant = dataclasses.replace(mutant, nth=mutant.nth + 1)
        ids.add(mutant.id)
        out.append(mutant)
    return out


# -- running them ---------------------------------------------------------------

ACCEPTED = "test/accepted_mutants.toml"


@dataclass
class PatchMutants:
    """What the mutants of one patch came to: measured by this run, or (with
    `recorded`) the result of its last full proof, from patches/proofs.json."""

    name: str
    tests: tuple[str, ...]
    made: list[Mutant]
    outcomes: dict[str, str]  # mutant id -> killed | survived | timeout
    accepted: dict[str, str]  # mutant id -> the reviewed reason
    baseline: str = "survived"  # the unmutated tests: "survived" means they pass
    seconds: float = 0.0
    cached: bool = False  # outcomes of an unchanged tree, tests and mutants
    # The record this result stands on instead of a run (see record_result).
    recorded: dict[str, Any] | None = None
    # A sampled re-proof of an unchanged record runs these mutants only (a
    # seeded few, see record.spot_size); None: every mutant made.
    spot: frozenset[str] | None = None

    @property
    def ran(self) -> list[Mutant]:
        """The mutants this run puts to the tests."""
        if self.spot is None:
            return self.made
        return [m for m in self.made if m.id in self.spot]

    @property
    def survivors(self) -> list[Mutant]:
        return [m for m in self.made if self.outcomes.get(m.id) == "survived"]

    @property
    def unaccepted(self) -> list[Mutant]:
        return [m for m in self.survivors if m.id not in self.accepted]

    @property
    def made_count(self) -> int:
        if self.recorded is not None:
            return int(self.recorded["made"])
        return len(self.made)

    @property
    def killed(self) -> int:
        if self.recorded is not None:
            return int(self.recorded["killed"])
        return sum(self.outcomes.get(m.id) in ("killed", "timeout") for m in self.made)

    def survived_rows(self) -> list[dict[str, str]]:
        """Each survivor: its id, diff, operator and the reason it is accepted."""
        if self.recorded is not None:
            rows = self.recorded["survived"]
        else:
            rows = [
                {"id": m.id, "diff": m.diff, "operator": m.operator}
                for m in self.survivors
            ]
        return [{**row, "accepted": self.accepted.get(row["id"], "")} for row in rows]

    @property
    def accepted_count(self) -> int:
        return sum(bool(row["accepted"]) for row in self.survived_rows())

    @property
    def ok(self) -> bool:
        if self.recorded is not None:
            # Only a passing result is recorded, and the accepted survivors are
            # part of its key: an unchanged record still passes.
            return all(row["accepted"] for row in self.survived_rows())
        return (
            self.baseline == "survived"
            and not self.unaccepted
            and (len(self.outcomes) == len(self.ran))
        )

    def record_result(self) -> dict[str, Any]:
        """What patches/proofs.json keeps of a full run: enough to tell a
        re-proof that disagrees (the same mutants, the same survivors)."""
        timed_out = sorted(i for i, o in self.outcomes.items() if o == "timeout")
        return {
            "tests": list(self.tests),
            "made": self.made_count,
            "killed": self.killed,
            "timeouts": len(timed_out),
            "timed_out": timed_out,
            "survived": [
                {k: row[k] for k in ("id", "diff", "operator")}
                for row in self.survived_rows()
            ],
        }

    def disagreement(self, recorded: dict[str, Any]) -> str:
        """How this run differs from a recorded one ("" when it agrees): the
        number of mutants, or which survived. A mutant stopped by its time limit
        in either run is left out: a timeout counts as a kill, and whether a
        slow test reaches its limit depends on the machine's load; each run's
        own verdict already judged it. A spot check compares the mutants it ran."""
        if self.made_count != recorded["made"]:
            return f"{recorded['made']} mutants recorded, {self.made_count} made now"
        slow = set(recorded.get("timed_out", []))
        slow |= {i for i, o in self.outcomes.items() if o == "timeout"}
        now = {row["id"] for row in self.survived_rows()} - slow
        then = {row["id"] for row in recorded["survived"]} - slow
        if self.spot is not None:
            now, then = now & self.spot, then & self.spot
        parts = []
        if now - then:
            parts.append("survived now: " + ", ".join(sorted(now - then)))
        if then - now:
            parts.append("killed now: " + ", ".join(sorted(then - now)))
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "tests": list(self.tests),
            "made": self.made_count,
            "killed": self.killed,
            # Of the killed: the mutants whose tests hung and were stopped.
            "timeouts": (
                int(self.recorded["timeouts"])
                if self.recorded is not None
                else sum(self.outcomes.get(m.id) == "timeout" for m in self.made)
            ),
            "accepted": self.accepted_count,
            "survived": self.survived_rows(),
            "baseline_passes": self.baseline == "survived",
            "seconds": round(self.seconds, 1),
            "cached": self.cached,
            # A spot check: the ids of the mutants it ran (killed counts them).
            "spot_checked": None if self.spot is None else sorted(self.spot),
            "source": "record" if self.recorded is not None else "run",
            "ok": self.ok,
        }


def load_accepted(root: Path) -> dict[tuple[str, str], str]:
    """(patch, mutant id) -> reason, from the one reviewed file."""
    import tomllib

    path = root / ACCEPTED
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SeriesError(f"{path} is not valid TOML: {exc}") from None
    out: dict[tuple[str, str], str] = {}
    for entry in data.get("mutant", []):
        reason = str(entry.get("reason", "")).strip()
        if not reason:
            raise SeriesError(
                f"{path}: mutant {entry.get('id')} of {entry.get('patch')} has no "
                "reason; every accepted survivor says why it cannot be killed"
            )
        out[(str(entry.get("patch")), str(entry.get("id")))] = reason
    return out


def patch_mutants(git: Git, before: str, after: str) -> list[Mutant]:
    """The mutants of what commit `after` adds over `before` (Python files only)."""
    diff = git.out("diff", "-U0", before, after, "--", "*.py")
    out: list[Mutant] = []
    for path, lines in sorted(added_lines(diff).items()):
        source = git.run("show", f"{after}:{path}").stdout
        out += mutants_of(source, path, lines)
    return out


def run_worker(
    project_root: Path,
    worktree: Path,
    tests: tuple[str, ...],
    mutants: list[Mutant],
    timeout: float,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[str, dict[str, str], float]:
    """One interpreter for one patch: (baseline outcome, outcome per id, seconds).

    `on_result` hears each result line as the worker writes it (the baseline
    first), so a long patch shows progress while it runs."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="xpu-mutants-") as tmp:
        spec = Path(tmp) / "spec.json"
        results = Path(tmp) / "results.jsonl"
        spec.write_text(json.dumps({
            "root": str(project_root), "python": str(worktree / "python"),
            "tests": list(tests), "timeout": timeout,
            "mutants": [{"id": m.id, "path": m.path, "code": m.code} for m in mutants],
        }))  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(worktree / "python"), str(Path(__file__).parents[2])]
            ),
            **TEST_ENV,
        }
        rows: list[dict[str, Any]] = []
        with (Path(tmp) / "worker.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "xpu_series.proofs.mutant_worker", str(spec),
                 str(results)],
                cwd=project_root, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                while True:
                    done = proc.poll() is not None
                    rows += _new_rows(results, len(rows), on_result)
                    if done:
                        break
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    baseline = next((r["outcome"] for r in rows if r["id"] == "baseline"), "error")
    outcomes = {r["id"]: r["outcome"] for r in rows if r["id"] != "baseline"}
    return baseline, outcomes, time.monotonic() - start


def _new_rows(
    results: Path, seen: int, on_result: Callable[[dict[str, Any]], None] | None
) -> list[dict[str, Any]]:
    """The complete result lines after the first `seen` (a line being written is
    read on the next poll)."""
    try:
        text = results.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the last piece is empty or still being written
    rows = [json.loads(line) for line in lines[seen:]]
    for row in rows:
        if on_result is not None:
            on_result(row)
    return rows
