"""Functions, classes and lambdas: the scopes XPU's dispatch may never enter."""

from __future__ import annotations

import ast

from xpu_series.audit.guards import OTHER_BACKENDS, dotted
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_devices import is_cuda_string

# sglang's op dispatch (kernels/fused_op.py, `_PLATFORM_METHODS`) calls
# forward_xpu on XPU when a class defines it, else forward_native.
OTHER_FORWARDS = frozenset(
    {
        "forward_cuda",
        "forward_hip",
        "forward_npu",
        "forward_musa",
        "forward_hpu",
        "forward_cpu",
    }
)
XPU_FORWARDS = ("forward_xpu", "forward_native")


def registration(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, str]:
    """(decorator, name) of a `@register_..._backend("name")` decorator, else
    ("", "")."""
    for deco in node.decorator_list:
        if not (isinstance(deco, ast.Call) and deco.args):
            continue
        fname = (dotted(deco.func) or "").rsplit(".", 1)[-1]
        first = deco.args[0]
        if (
            fname.startswith("register")
            and "backend" in fname
            and isinstance(first, ast.Constant)
            and isinstance(first.value, str)
        ):
            return fname, first.value
    return "", ""


class ScopeScan(ScanContext):
    """Scopes: backend factories and platform forwards XPU never takes are guarded."""

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        family, backend = registration(node)
        if backend:
            # Which factory a backend name runs: the tree-wide rules read the
            # classes it builds (the backend XPU runs, computed, not listed).
            self.registrations.append(
                (family, backend, ".".join((*self.scope, node.name)))
            )
        if backend and OTHER_BACKENDS.match(backend):
            # A factory registered under a backend's name runs only when a
            # user names that backend, and this one is not XPU's.
            self.guards.append(f"the factory of the {backend!r} backend, not XPU's")
            try:
                self._function_body(node)
            finally:
                self.guards.pop()
            return
        self._function_body(node)

    def _function_body(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        for default in (*args.defaults, *args.kw_defaults):
            # A default is not a use: `device="cuda"` only matters if a caller
            # leaves it (and such calls are findings where they pass nothing).
            if default is not None and not is_cuda_string(default):
                self.visit(default)
        self.scope.append(node.name)
        self.defined.setdefault(node.name, []).append(".".join(self.scope))
        self.locals.append(node)
        self.values.append({})
        self.functions += 1
        try:
            self.block(node.body)
        finally:
            self.scope.pop()
            self.locals.pop()
            self.values.pop()
            self.functions -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.locals.append(node)
        try:
            self.visit(node.body)
        finally:
            self.locals.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for hook in self.on_classdef:
            hook(node)
        for item in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(item)
        self.scope.append(node.name)
        # Platform forwards XPU's dispatch never takes, unless the class's own
        # forward_xpu or forward_native calls them.
        methods = {
            s.name: s
            for s in node.body
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        called = {
            dotted(n.func)
            for name in XPU_FORWARDS
            if name in methods
            for n in ast.walk(methods[name])
            if isinstance(n, ast.Call)
        }
        try:
            for stmt in node.body:
                name = getattr(stmt, "name", "")
                if name in OTHER_FORWARDS and f"self.{name}" not in called:
                    self.under(
                        f"{name} is a platform forward XPU's dispatch does not "
                        "take (it calls forward_xpu, else forward_native)",
                        [stmt],
                    )
                else:
                    self.block([stmt])
        finally:
            self.scope.pop()

    # Annotations are not run (and often not even evaluated).
    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_arg(self, node: ast.arg) -> None:
        return
