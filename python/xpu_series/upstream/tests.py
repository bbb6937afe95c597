"""Make a patch's test file self-contained for upstream: inline project helpers, drop
the classes upstream's unit/ cannot carry, and what only they used."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from xpu_series.errors import XpuSeriesError

# Files a test may read beside it, shipped in the export at the same place.
_DATA_SUFFIXES = (".json", ".txt", ".toml", ".yaml", ".yml", ".jsonl")


@dataclass
class ExportedTest:
    """One test file as upstream would carry it."""

    path: str  # repository-relative, the same as in this project
    text: str
    # Helpers moved into the file: (module, names).
    inlined: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    # Test classes left out, and why (upstream's unit/ starts no server).
    dropped: list[str] = field(default_factory=list)
    # Data files the test reads, shipped beside it: (path, bytes).
    data: list[tuple[str, bytes]] = field(default_factory=list)
    # Every top-level name the inlining brought in (helpers and what they need).
    inlined_names: set[str] = field(default_factory=set)


class ExportError(XpuSeriesError):
    """A patch or its tests cannot be exported as upstream would take them."""


@dataclass
class _Stmt:
    node: ast.stmt
    first: int  # 1-based, with the comments directly above it
    last: int

    def names(self) -> set[str]:
        """What the statement binds at module level."""
        node = self.node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return {node.name}
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            return {t.id for t in targets if isinstance(t, ast.Name)}
        return set()


def _statements(source: str, tree: ast.Module) -> list[_Stmt]:
    lines = source.splitlines()
    out: list[_Stmt] = []
    for node in tree.body:
        first = min(
            [node.lineno]
            + [d.lineno for d in getattr(node, "decorator_list", [])]  # decorators
        )
        while first > 1 and lines[first - 2].lstrip().startswith("#"):
            first -= 1
        out.append(_Stmt(node, first, node.end_lineno or node.lineno))
    return out


def _used(node: ast.AST) -> set[str]:
    """Every name a node reads (attribute chains count their root)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _stdlib_or_installed(module: str, root: Path) -> bool:
    """Whether `module` is the standard library, sglang, or an installed
    package (not one of the project's own, such as xpu_series)."""
    import importlib.util

    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "sglang":
        return True
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None:
        return spec is not None
    venv = Path(sys.prefix).resolve()
    inside = root.resolve() in origin.parents and venv not in origin.parents
    return not inside


def find_helper(root: Path, module: str) -> Path | None:
    """The project's own helper module `module` (test/**/<module>.py), if any."""
    hits = sorted(
        p for p in (root / "test").rglob(f"{module}.py") if "__pycache__" not in p.parts
    )
    return hits[0] if hits else None


def _is_path_hack(node: ast.stmt) -> bool:
    """`sys.path.insert(...)` / `sys.path.append(...)` at module level."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in ("insert", "append")
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "path"
        and isinstance(func.value.value, ast.Name)
        and func.value.value.id == "sys"
    )


def _is_test_class(node: ast.stmt) -> bool:
    return isinstance(node, ast.ClassDef) and node.name.startswith("Test")


def _import_names(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(bound name, the alias's text) of an import statement."""
    out = []
    for alias in node.names:
        bound = alias.asname or alias.name.split(".")[0]
        text = alias.name + (f" as {alias.asname}" if alias.asname else "")
        out.append((bound, text))
    return out


def _render_import(node: ast.Import | ast.ImportFrom, keep: list[str]) -> str:
    if isinstance(node, ast.Import):
        return "import " + ", ".join(keep)
    return f"from {'.' * node.level}{node.module or ''} import {', '.join(keep)}"


@dataclass
class _Helper:
    """A project helper module and the top-level definitions it offers."""

    path: Path
    source: str
    stmts: list[_Stmt]

    @classmethod
    def read(cls, path: Path) -> _Helper:
        source = path.read_text(encoding="utf-8")
        return cls(path, source, _statements(source, ast.parse(source)))

    def closure(self, names: set[str]) -> tuple[list[_Stmt], list[str]]:
        """The definitions `names` need (in file order) and the import lines they
        need (not `from __future__`: upstream's Python reads the annotations)."""
        defs = {n: s for s in self.stmts for n in s.names()}
        imports: dict[str, tuple[ast.Import | ast.ImportFrom, str]] = {}
        for s in self.stmts:
            if isinstance(s.node, ast.ImportFrom) and s.node.module == "__future__":
                continue
            if isinstance(s.node, ast.Import | ast.ImportFrom):
                for bound, text in _import_names(s.node):
                    imports[bound] = (s.node, text)
        missing = sorted(n for n in names if n not in defs)
        if missing:
            raise ExportError(
                f"{self.path.name} has no top-level {missing[0]!r} to inline",
                hint="import it from where the helper module gets it",
            )
        wanted: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name in wanted or (name not in defs and name not in imports):
                continue  # a local or a builtin
            wanted.add(name)
            if name in defs:
                todo += sorted(_used(defs[name].node) - wanted)
        chosen = [s for s in self.stmts if s.names() & wanted]
        lines: dict[int, list[str]] = {}
        nodes: dict[int, ast.Import | ast.ImportFrom] = {}
        for bound in sorted(wanted & set(imports)):
            node, text = imports[bound]
            lines.setdefault(id(node), []).append(text)
            nodes[id(node)] = node
        rendered = [_render_import(nodes[k], v) for k, v in lines.items()]
        return chosen, rendered

    def text_of(self, stmt: _Stmt) -> str:
        lines = self.source.splitlines()
        return "\n".join(lines[stmt.first - 1 : stmt.last])


def _test_classes(spec: list[str], rel: str) -> set[str] | None:
    """The classes of `rel` that Fast-Tests names, or None (keep them all)."""
    classes = {t.split("::")[1] for t in spec if t.split("::")[0] == rel and "::" in t}
    return classes or None


def export_test(
    root: Path, rel: str, keep: set[str] | None = None, reason: str = ""
) -> ExportedTest:
    """`rel` made self-contained: project helpers inlined (and the helpers they
    import, in turn), test classes outside `keep` dropped (with `reason`), and
    what only the removed code used."""
    result = ExportedTest(rel, "")
    text = (root / rel).read_text(encoding="utf-8")
    for _depth in range(_MAX_HELPER_DEPTH):
        text, inlined = _one_pass(root, rel, text, keep, reason, result)
        keep = None  # classes are dropped once, from the test itself
        if not inlined:
            break
    else:
        raise ExportError(
            f"{rel}'s helpers import helpers more than {_MAX_HELPER_DEPTH} deep",
            hint="import what the test needs from the helper that defines it",
        )
    result.text = re.sub(r"\n{4,}", "\n\n\n", text)
    result.data = _data_files(root, rel, result.text)
    return result


# How many times a helper may import another helper.
_MAX_HELPER_DEPTH = 5


def _one_pass(
    root: Path,
    rel: str,
    source: str,
    keep: set[str] | None,
    reason: str,
    result: ExportedTest,
) -> tuple[str, bool]:
    """One round: the helper imports of `source` inlined; whether there were any."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ExportError(
            f"{rel} does not parse: {exc}", hint="fix the test, then export again"
        ) from exc
    removed: list[_Stmt] = []
    helper_modules: list[str] = []
    inline: dict[Path, set[str]] = {}
    kept: list[_Stmt] = []
    for s in _statements(source, tree):
        node = s.node
        if _is_path_hack(node):
            removed.append(s)
        elif isinstance(node, ast.ImportFrom) and _helper_of(root, node):
            if any(a.asname for a in node.names):
                raise ExportError(
                    f"{rel} imports from {node.module} under another name",
                    hint="import the helper's names as they are",
                )
            helper = _helper_of(root, node)
            assert helper is not None
            inline.setdefault(helper, set()).update(a.name for a in node.names)
            removed.append(s)
        elif isinstance(node, ast.Import) and any(
            not _stdlib_or_installed(a.name, root) and find_helper(root, a.name)
            for a in node.names
        ):
            helper_modules += [a.asname or a.name for a in node.names]
            removed.append(s)
        elif keep is not None and _is_test_class(node) and node.name not in keep:
            result.dropped.append(f"{node.name} ({reason})" if reason else node.name)
            removed.append(s)
        else:
            kept.append(s)
    # What only the removed code used goes too (helpers, constants, imports).
    kept, edits = _prune(kept, removed)
    leftover = _used(ast.Module(body=[s.node for s in kept], type_ignores=[]))
    still = sorted(set(helper_modules) & leftover)
    if still:
        raise ExportError(
            f"{rel} uses the project helper module {still[0]} in code upstream "
            "would carry",
            hint="use `from MODULE import NAME` in the test so the export can "
            "inline NAME, or name the classes that need no helper in Fast-Tests",
        )
    for s in removed:
        edits[s.first] = (s.last, None)
    lines = source.splitlines()
    body: list[str] = []
    n = 1
    while n <= len(lines):
        if n in edits:
            last, replacement = edits[n]
            if replacement is not None:
                body.append(replacement)
            n = last + 1
            continue
        body.append(lines[n - 1])
        n += 1
    text = "\n".join(body) + "\n"
    if inline:
        text = _insert_helpers(text, inline, result, rel)
    return text, bool(inline)


def _helper_of(root: Path, node: ast.ImportFrom) -> Path | None:
    if node.level or not node.module or _stdlib_or_installed(node.module, root):
        return None
    return find_helper(root, node.module)


Edits = dict[int, tuple[int, str | None]]


def _prune(kept: list[_Stmt], removed: list[_Stmt]) -> tuple[list[_Stmt], Edits]:
    """Drop definitions and imported names that only removed code read; the
    edits (first line -> last line, replacement or None) that do it."""
    edits: Edits = {}
    candidates: set[str] = set()
    for s in removed:
        candidates |= _used(s.node)
    changed = True
    while changed:
        changed = False
        for s in list(kept):
            others = [o.node for o in kept if o is not s]
            used = _used(ast.Module(body=others, type_ignores=[]))
            bound = s.names()
            if bound and bound <= candidates and not bound & used:
                kept.remove(s)
                edits[s.first] = (s.last, None)
                candidates |= _used(s.node)
                changed = True
    used = _used(ast.Module(body=[s.node for s in kept], type_ignores=[]))
    final: list[_Stmt] = []
    for s in kept:
        node = s.node
        if (
            isinstance(node, ast.Import | ast.ImportFrom)
            and getattr(node, "module", None) != "__future__"
        ):
            names = _import_names(node)
            keep = [t for b, t in names if b in used or b not in candidates]
            if len(keep) != len(names):
                # isort rewraps the shortened line.
                edits[s.first] = (s.last, _render_import(node, keep) if keep else None)
                if not keep:
                    continue
        final.append(s)
    return final, edits


def _insert_helpers(
    text: str,
    inline: dict[Path, set[str]],
    result: ExportedTest,
    rel: str,
) -> str:
    """Put the helpers' definitions after the imports and registrations, and
    their imports with the file's own (isort orders them afterwards)."""
    tree = ast.parse(text)
    defined = {n for s in _statements(text, tree) for n in s.names()}
    defs: list[str] = []
    imports: list[str] = []
    for path, names in sorted(inline.items()):
        helper = _Helper.read(path)
        names = names - defined  # inlined already, from another import of it
        if not names:
            continue
        chosen, needed = helper.closure(names)
        # A definition an earlier round inlined is there already.
        chosen = [c for c in chosen if not c.names() <= result.inlined_names]
        clash = sorted(defined & {n for s in chosen for n in s.names()})
        if clash:
            raise ExportError(
                f"{rel} defines {', '.join(clash)}, which the inlined helper "
                f"{path.name} defines too",
                hint="rename the test's own definition",
            )
        result.inlined.append((path.stem, tuple(sorted(names))))
        result.inlined_names |= {n for c in chosen for n in c.names()}
        defs += [helper.text_of(s) for s in chosen]
        imports += needed
    lines = text.splitlines()
    # After the last top-level import or registration call before any definition.
    at = 0
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call | ast.Constant)
        ):
            at = node.end_lineno or node.lineno
        else:
            break
    head = lines[:at]
    first_import = next(
        (
            n.lineno - 1
            for n in tree.body
            if isinstance(n, ast.Import | ast.ImportFrom)
            and getattr(n, "module", None) != "__future__"
        ),
        at,
    )
    head[first_import:first_import] = imports
    block = ["", ""] + "\n\n\n".join(defs).splitlines()
    return "\n".join(head + block + lines[at:]) + "\n"


def _data_files(root: Path, rel: str, text: str) -> list[tuple[str, bytes]]:
    """Data files the test names by a string literal, found beside it or in a
    folder above it (inside test/): shipped at the same place."""
    out: list[tuple[str, bytes]] = []
    test = root / rel
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        name = node.value
        if "/" in name or not name.endswith(_DATA_SUFFIXES):
            continue
        for folder in test.parents:
            if folder == root or root not in folder.parents:
                break
            if (folder / name).is_file():
                found = (folder / name).relative_to(root).as_posix()
                if found not in [p for p, _ in out]:
                    out.append((found, (folder / name).read_bytes()))
                break
    return out


def imports_of(text: str) -> set[str]:
    """The top-level modules a file imports (anywhere in it)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out
