"""The audit scanner's one walk: the scope it is in, and what keeps XPU out."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from xpu_series.audit.guards import describe, dotted, xpu_truth
from xpu_series.audit.scan_records import ClassFact, ClassUse, ImportEdge, RawFinding

Hook = Callable[[Any], None]

_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
# Nodes no rule reads and that hold nothing: a Name's Load, an operator.
_LEAF = frozenset(
    kind
    for base in (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)
    for kind in base.__subclasses__()
)
# Fields that never hold a node (names, numbers, a constant's value).
_SCALARS = frozenset(
    {"id", "attr", "name", "module", "level", "arg", "asname", "type_comment"}
    | {"kind", "conversion", "is_async", "ctx", "op", "ops", "tag", "rest"}
)
_CHILDREN: dict[type, tuple[str, ...]] = {}


def _child_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node class that may hold nodes."""
    fields: tuple[str, ...] = getattr(kind, "_fields", ())
    if kind in (ast.Constant, ast.MatchSingleton):
        return ()
    if kind in (ast.Global, ast.Nonlocal):
        return ()
    return tuple(f for f in fields if f not in _SCALARS)


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def mentions_xpu(node: ast.AST) -> bool:
    """Whether an expression names XPU (`is_xpu()`, `_is_xpu`, `"xpu"`)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            text = sub.id
        elif isinstance(sub, ast.Attribute):
            text = sub.attr
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            text = sub.value
        else:
            continue
        if "xpu" in text.lower():
            return True
    return False


def module_truths(tree: ast.Module) -> dict[str, bool | None]:
    """Module-level names bound to a value known on XPU (`_is_cuda = is_cuda()`)."""
    env: dict[str, bool | None] = {}

    def walk(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    value = xpu_truth(stmt.value, env)
                    if target.id in env and env[target.id] != value:
                        value = None  # bound twice, differently: not known
                    env[target.id] = value
            elif isinstance(stmt, (ast.If, ast.Try)):
                for part in ("body", "orelse", "finalbody"):
                    walk(getattr(stmt, part, []))

    walk(tree.body)
    return env


def _local_names(func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Names a function binds itself (its parameters, assignments, imports)."""
    args = func.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {a.arg for a in every if a is not None}
    body = func.body if isinstance(func.body, list) else [func.body]
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # a nested scope binds its own names
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return names


class ScanContext(ast.NodeVisitor):
    """The walk every rule shares: guards, scopes and what the rules found."""

    def __init__(self, module: str, package: str, cuda_packages: frozenset[str]):
        self._methods: dict[type, Callable[[Any], Any]] = {}
        self.module = module
        self.package = package
        self.cuda_packages = cuda_packages
        self.env: dict[str, bool | None] = {}
        self.cuda_names: set[str] = set()
        self.guards: list[str] = []
        self.scope: list[str] = []
        # Per enclosing function: its node, or the names it binds once asked.
        self.locals: list[Any] = []
        self.try_import = 0  # enclosing `try: ... except ImportError`
        self.conditional = 0  # enclosing if, loop, with or match
        self.blocks = ""
        self.functions = 0
        self.torch_aliases = {"torch"}
        self.cuda_aliases: dict[str, str] = {}  # `from torch import cuda` and kin
        self.findings: list[RawFinding] = []
        # Findings only the whole tree can judge (kept or dropped by the
        # tree-wide pass: an sgl_kernel name against the XPU package's surface).
        self.pending: list[RawFinding] = []
        self.imports: list[ImportEdge] = []
        # (private name, the function using it, guarded there) and each
        # function's qualified name by its own name.
        self.refs: list[tuple[str, str, bool]] = []
        self.defined: dict[str, list[str]] = {}
        # `assert <False on XPU>` being visited: it raises there (its text).
        self.asserting = ""
        # Per function (module level first): local name -> what built it, for
        # the rules that ask where a tensor lives ("cpu", "device", "") and its
        # dtype ("int", "bool", "float", "").
        self.values: list[dict[str, tuple[str, str]]] = [{}]
        # The XPU arm of the if-chain whose test is being visited, or "".
        self.sibling = ""
        self.otherwise = ""  # "raises" when that chain's last `else` raises
        # Local name -> the sglang name it is bound to (`from a.b import C`:
        # C -> a.b.C; `import a.b as m`: m -> a.b), and the tree-wide facts.
        self.bindings: dict[str, str] = {}
        self.classes: list[ClassFact] = []
        self.uses: list[ClassUse] = []
        self.class_uses: list[ClassUse] = []  # as written, resolved at the end
        # (decorator, backend name, factory function) of each registration.
        self.registrations: list[tuple[str, str, str]] = []
        # Private names other modules take from here: (module, name, guarded).
        self.private_imports: list[tuple[str, str, bool]] = []
        # The rules of the kinds beyond the CUDA calls hook into the one walk
        # here; a rule installs its hooks only when the file's text can hold
        # its finding (most files hold none), so a file pays only for its own.
        self.on_call: list[Hook] = []
        self.on_if: list[Hook] = []
        self.on_compare: list[Hook] = []
        self.on_boolop: list[Hook] = []
        self.on_assign: list[Hook] = []
        self.on_attribute: list[Hook] = []
        self.on_import: list[Hook] = []
        self.on_classdef: list[Hook] = []

    # --- bookkeeping -------------------------------------------------------
    def add(
        self,
        node: ast.AST,
        api: str,
        kind: str,
        effect: str = "",
        evidence: str = "",
        pending: bool = False,
    ) -> None:
        if self.asserting and not effect:
            # The check sits in an assert that fails on XPU: whatever the API
            # does, the assert raises first.
            effect = "raises"
            evidence = f"`assert {self.asserting}` fails on XPU: AssertionError"
        (self.pending if pending else self.findings).append(
            RawFinding(
                line=getattr(node, "lineno", 0),
                function=".".join(self.scope) or "<module>",
                api=api,
                kind=kind,
                guard=self.guards[-1] if self.guards else "",
                effect=effect,
                evidence=evidence,
            )
        )

    @property
    def function(self) -> str:
        return ".".join(self.scope) or "<module>"

    @property
    def guard(self) -> str:
        return self.guards[-1] if self.guards else ""

    def under(self, reason: str, nodes: list[ast.AST] | ast.AST) -> None:
        self.guards.append(reason)
        try:
            if isinstance(nodes, list):
                self.block(nodes)
            else:
                self.visit(nodes)
        finally:
            self.guards.pop()

    def block(self, stmts: list[Any]) -> None:
        pushed = 0
        for stmt in stmts:
            self.visit(stmt)
            if (
                isinstance(stmt, ast.If)
                and not stmt.orelse
                and stmt.body
                and isinstance(stmt.body[-1], _EXITS)
                and xpu_truth(stmt.test, self.env) is True
            ):
                # `if not _is_cuda: return` leaves XPU out of what follows.
                self.guards.append(
                    f"after `if {describe(stmt.test)}:` (line {stmt.lineno}) "
                    "exits on XPU"
                )
                pushed += 1
        if pushed:
            del self.guards[-pushed:]

    def visit(self, node: ast.AST) -> Any:
        # NodeVisitor.visit builds a method name per node; a big module has a
        # million nodes, so each class's method is looked up once.
        kind = node.__class__
        method = self._methods.get(kind)
        if method is None:
            method = getattr(self, f"visit_{kind.__name__}", self.generic_visit)
            self._methods[kind] = method
        return method(node)

    def generic_visit(self, node: ast.AST) -> None:
        kind = node.__class__
        names = _CHILDREN.get(kind)
        if names is None:
            names = _CHILDREN[kind] = _child_fields(kind)
        for name in names:
            value = getattr(node, name, None)
            if value is None:
                continue
            if value.__class__ is list:
                if value and isinstance(value[0], ast.stmt):
                    self.block(value)
                else:
                    for item in value:
                        if isinstance(item, ast.AST) and item.__class__ not in _LEAF:
                            self.visit(item)
            elif value.__class__ not in _LEAF:
                self.visit(value)

    # --- scopes ------------------------------------------------------------
    def _shadowed(self, name: str) -> bool:
        for index, scope in enumerate(self.locals):
            if not isinstance(scope, set):
                # Computed on first need: most functions never ask.
                scope = self.locals[index] = _local_names(scope)
            if name in scope:
                return True
        return False

    def _refer(self, name: str) -> None:
        """A use of a private function or method: who uses it, and guarded?"""
        self.refs.append((name, ".".join(self.scope), bool(self.guards)))

    # --- guards ------------------------------------------------------------
    @contextlib.contextmanager
    def _conditionally(self) -> Iterator[None]:
        """Inside a compound statement that may skip or catch what it holds."""
        self.conditional += 1
        try:
            yield
        finally:
            self.conditional -= 1

    def visit_If(self, node: ast.If) -> None:
        for hook in self.on_if:
            hook(node)
        with self._conditionally():
            self._visit_if(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        if xpu_truth(node.test, self.env) is not False:
            self.generic_visit(node)
            return
        # `assert x.is_cuda and ...` is no guard: on XPU it raises. Its `and`
        # chain protects nothing, and what it tests is a finding that raises.
        outer, self.asserting = self.asserting, describe(node.test)
        try:
            self.generic_visit(node)
        finally:
            self.asserting = outer

    def visit_Compare(self, node: ast.Compare) -> None:
        for hook in self.on_compare:
            hook(node)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        with self._conditionally():
            self.generic_visit(node)

    visit_AsyncFor = visit_For
    visit_With = visit_For
    visit_AsyncWith = visit_For
    visit_Match = visit_For

    def _visit_if(self, node: ast.If) -> None:
        if self.on_compare or self.on_call:
            outer = self.sibling, self.otherwise
            self.sibling, self.otherwise = self._xpu_arm(node)
            try:
                self.visit(node.test)
            finally:
                self.sibling, self.otherwise = outer
        else:
            self.visit(node.test)
        truth = xpu_truth(node.test, self.env)
        # Described only when it guards something (unparsing costs).
        cond = describe(node.test) if truth is not None else ""
        if truth is False:
            self.under(f"`if {cond}` (line {node.lineno}) is False on XPU", node.body)
        else:
            self.block(node.body)
        if truth is True:
            self.under(
                f"else of `if {cond}` (line {node.lineno}), True on XPU", node.orelse
            )
        else:
            self.block(node.orelse)

    def _xpu_arm(self, node: ast.If) -> tuple[str, str]:
        """The first later arm of this if-chain that XPU takes, or names XPU
        (or ""); and "raises" when the chain's last `else` only raises."""
        arm = node.orelse
        while len(arm) == 1 and isinstance(arm[0], ast.If):
            test = arm[0].test
            if xpu_truth(test, self.env) is True or mentions_xpu(test):
                return f"`elif {describe(test)}` (line {arm[0].lineno})", ""
            arm = arm[0].orelse
        return "", "raises" if len(arm) == 1 and isinstance(arm[0], ast.Raise) else ""

    def visit_While(self, node: ast.While) -> None:
        with self._conditionally():
            self._visit_while(node)

    def _visit_while(self, node: ast.While) -> None:
        self.visit(node.test)
        if xpu_truth(node.test, self.env) is False:
            self.under(f"`while {describe(node.test)}` is False on XPU", node.body)
        else:
            self.block(node.body)
        self.block(node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        truth = xpu_truth(node.test, self.env)
        cond = describe(node.test) if truth is not None else ""
        if truth is False:
            self.under(f"`... if {cond}` is False on XPU", node.body)
        else:
            self.visit(node.body)
        if truth is True:
            self.under(f"`... else` of `{cond}`, True on XPU", node.orelse)
        else:
            self.visit(node.orelse)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        for hook in self.on_boolop:
            hook(node)
        if isinstance(node.op, ast.Or):
            admits = [v for v in node.values if xpu_truth(v, self.env) is True]
            if admits:
                # `x.is_cuda or x.is_xpu`: the test lets XPU through itself.
                self.under(f"`... or {describe(admits[0])}` admits XPU", node.values)
                return
        pushed = 0
        for value in node.values:
            self.visit(value)
            truth = xpu_truth(value, self.env)
            stops = truth is False if isinstance(node.op, ast.And) else truth is True
            if stops and not self.asserting:
                # `_is_cuda and torch.cuda.x()`: XPU never evaluates the rest.
                self.guards.append(f"`{describe(value)}` short-circuits on XPU")
                pushed += 1
        if pushed:
            del self.guards[-pushed:]

    def visit_Try(self, node: ast.Try) -> None:
        catches = any(
            h.type is None
            or any(
                dotted(t) in _IMPORT_ERRORS
                for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])
            )
            for h in node.handlers
        )
        self.try_import += catches
        try:
            self.block(node.body)
        finally:
            self.try_import -= catches
        for handler in node.handlers:
            self.visit(handler)
        self.block(node.orelse)
        self.block(node.finalbody)

    visit_TryStar = visit_Try
