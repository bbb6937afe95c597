"""The class facts backend-class and no-xpu-forward read across the tree.

Per module: each class with its bases and what its `forward_*` methods do, each
place that builds a class of sglang's (`C(...)`), and each test of a value's
class (`isinstance(x, C)`, `type(x) is C`, `type(x).__name__ in {...}`) or of a
backend's name (`attention_backend == "triton"`). Names are resolved through the
module's imports; what is not an sglang class (a builtin, torch's) is dropped.
The decisions are tree-wide (`audit/classes.py`): which class a backend name
builds, a class's ancestors, and which forward XPU's dispatch reaches.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re

from xpu_series.audit.guards import backend_like, describe, dotted
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_records import ClassFact, ClassUse

_BUILTINS = frozenset(dir(builtins))
_TEST_TRIGGER = re.compile(rb"isinstance|type\(|__class__|backend")
_FORWARD = re.compile(r"^forward_\w+$")
# A backend value whose names the backend-class rule compares: attention's (the
# family whose registered factories give the backend XPU runs).
_BACKEND_VALUE = re.compile(r"attention_backend|attn_backend|prefill_backend"
                            r"|decode_backend")  # fmt: skip
# Backends of other families whose names overlap attention's (a linear-attention
# or MoE "triton" is not the attention backend).
_OTHER_VALUE = re.compile(r"linear_attn|mamba|moe|lora|grammar|sampling")


def method_kind(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """What a method does, as far as dispatch cares (see ClassFact)."""
    for deco in node.decorator_list:
        if (dotted(deco) or "").rsplit(".", 1)[-1] == "abstractmethod":
            return "abstract"
    body = [
        s
        for s in node.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) == 1:
        stmt = body[0]
        if isinstance(stmt, ast.Raise) and "NotImplementedError" in describe(
            stmt.exc if stmt.exc is not None else stmt
        ):
            return "raises"
        if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                return f"to:{func.attr}"
    return "body"


def _class_names(node: ast.AST) -> list[str]:
    """The dotted names in a class argument (`C`, `m.C`, `(A, B)`)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [name for item in items if (name := dotted(item))]


def _is_type_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "type"
        and len(node.args) == 1
    )


def _chosen_classes(node: ast.AST) -> list[str]:
    """`A`, or each class of `A if c else B`, when they look like classes."""
    if isinstance(node, ast.IfExp):
        return _chosen_classes(node.body) + _chosen_classes(node.orelse)
    name = dotted(node) or ""
    return [name] if name.rsplit(".", 1)[-1][:1].isupper() else []


def _strings(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        i.value
        for i in items
        if isinstance(i, ast.Constant) and isinstance(i.value, str)
    ]


class ClassScan(ScanContext):
    """Class facts, builds and class tests (resolved when the module is done)."""

    def install_classes(self, text: bytes) -> None:
        # Names a function binds to a class chosen at run time
        # (`cls = A if c else B`, then `cls(...)` builds one of them), by
        # (function, name): a classmethod's own `cls` is another name.
        self.class_vars: dict[tuple[str, str], list[str]] = {}
        if b"class " in text:
            self.on_classdef.append(self._class_fact)
        self.on_call.append(self._build_or_isinstance)
        self.on_assign.append(self._class_var)
        if _TEST_TRIGGER.search(text):
            self.on_compare.append(self._class_compare)

    def _class_fact(self, node: ast.ClassDef) -> None:
        methods = {
            s.name: method_kind(s)
            for s in node.body
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _FORWARD.match(s.name)
        }
        self.classes.append(
            ClassFact(
                ".".join((*self.scope, node.name)),
                node.lineno,
                tuple(n for b in node.bases if (n := dotted(b))),
                methods,
            )
        )

    def _use(self, node: ast.AST, how: str, names: list[str]) -> None:
        if names:
            self.class_uses.append(
                ClassUse(
                    getattr(node, "lineno", 0),
                    self.function,
                    how,
                    tuple(names),
                    self.guard,
                    self.sibling,
                    self.otherwise,
                )
            )

    def _class_var(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names = _chosen_classes(node.value)
            if names:
                self.class_vars[(self.function, node.targets[0].id)] = names

    def _build_or_isinstance(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            name = func.id
            if name == "isinstance" and len(node.args) == 2:
                self._use(node, "isinstance", _class_names(node.args[1]))
            elif name[:1].isupper() and name not in _BUILTINS:
                self._use(node, "build", [name])
            elif (self.function, name) in self.class_vars:
                self._use(node, "build", self.class_vars[(self.function, name)])
        elif isinstance(func, ast.IfExp):
            self._use(node, "build", _chosen_classes(func))
        elif (
            isinstance(func, ast.Attribute)
            and func.attr[:1].isupper()
            and isinstance(func.value, ast.Name)
            and func.value.id in self.bindings
        ):
            self._use(node, "build", [f"{func.value.id}.{func.attr}"])

    def _class_compare(self, node: ast.Compare) -> None:
        if len(node.ops) != 1:
            return
        left, right, op = node.left, node.comparators[0], node.ops[0]
        if _is_type_call(left):
            if isinstance(op, (ast.Is, ast.Eq)):
                self._use(node, "isinstance", _class_names(right))
        elif isinstance(left, ast.Attribute) and left.attr == "__name__":
            owner = left.value
            if _is_type_call(owner) or (
                isinstance(owner, ast.Attribute) and owner.attr == "__class__"
            ):
                self._use(node, "classname", _strings(right))
        elif backend_like(left):
            text = (
                dotted(left.func) if isinstance(left, ast.Call) else dotted(left)
            ) or ""
            if _BACKEND_VALUE.search(text) and not _OTHER_VALUE.search(text):
                self._use(node, "backend-name", _strings(right))

    def resolve(self, name: str, local: set[str]) -> str:
        """The sglang name a dotted name in this module means, or ""."""
        head, _, rest = name.partition(".")
        if head in self.bindings:
            target = self.bindings[head]
            return f"{target}.{rest}" if rest else target
        if not rest and head in local:
            return f"{self.module}.{head}"
        return ""

    def finish_classes(self) -> None:
        """Resolve what the walk collected, now that every local class is known."""
        local = {c.name for c in self.classes}
        facts = []
        for fact in self.classes:
            bases = tuple(self.resolve(b, local) or b for b in fact.bases)
            facts.append(ClassFact(fact.name, fact.line, bases, fact.methods))
        self.classes = facts
        for use in self.class_uses:
            if use.how in ("classname", "backend-name"):
                self.uses.append(use)
                continue
            names = tuple(n for b in use.names if (n := self.resolve(b, local)))
            if names:
                self.uses.append(dataclasses.replace(use, names=names))
