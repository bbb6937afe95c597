"""Names meaning CUDA: torch.cuda.X and its aliases, guarded-only imports, is_cuda."""

from __future__ import annotations

import ast

from xpu_series.audit.guards import dotted, xpu_truth
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_records import GUARDED_IMPORT, IS_CUDA, TORCH_CUDA


def _bound_names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def guarded_only_names(tree: ast.Module, env: dict[str, bool | None]) -> set[str]:
    """Names imported at module level only in branches XPU never takes."""
    live: dict[str, bool] = {}
    imported: set[str] = set()

    def bind(name: str, alive: bool) -> None:
        live[name] = live.get(name, False) or alive

    def walk(body: list[ast.stmt], alive: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If):
                truth = xpu_truth(stmt.test, env)
                walk(stmt.body, alive and truth is not False)
                walk(stmt.orelse, alive and truth is not True)
            elif isinstance(stmt, ast.Try):
                for part in (stmt.body, stmt.orelse, stmt.finalbody):
                    walk(part, alive)
                for handler in stmt.handlers:
                    walk(handler.body, alive)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    name = alias.asname or alias.name.split(".")[0]
                    if name != "*":
                        imported.add(name)
                        bind(name, alive)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bind(stmt.name, alive)
            elif isinstance(stmt, ast.ClassDef):
                bind(stmt.name, alive)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = (
                    stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                )
                for target in targets:
                    for name in _bound_names(target):
                        bind(name, alive)
            elif isinstance(stmt, (ast.For, ast.With, ast.While)):
                if isinstance(stmt, ast.For):
                    for name in _bound_names(stmt.target):
                        bind(name, alive)
                walk(stmt.body, alive)

    walk(tree.body, True)
    return {name for name in imported if not live.get(name, True)}


def _platform_like(node: ast.AST) -> bool:
    """`get_platform()`, `current_platform`, `platform`: a platform object, whose
    `is_cuda` is a platform check (a guard), not a tensor's device."""
    text = (dotted(node.func) if isinstance(node, ast.Call) else dotted(node)) or ""
    return "platform" in text.lower()


class NameScan(ScanContext):
    """Names and attributes: `torch-cuda`, `guarded-import` and `is-cuda` findings."""

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name[:1] == "_" and isinstance(node.ctx, ast.Load):
            self._refer(name)
        if name not in self.cuda_aliases and name not in self.cuda_names:
            return
        if not isinstance(node.ctx, ast.Load) or self._shadowed(name):
            return
        if node.id in self.cuda_aliases:
            self.add(node, self.cuda_aliases[node.id], TORCH_CUDA)
        elif node.id in self.cuda_names:
            self.add(node, f"guarded-import:{node.id}", GUARDED_IMPORT)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        for hook in self.on_attribute:
            hook(node)
        if node.attr[:1] == "_" and isinstance(node.value, ast.Name):
            owner = node.value.id
            if owner in ("self", "cls"):
                self._refer(node.attr)
            elif owner in self.bindings and node.attr[:2] != "__":
                # `module._helper(...)`: another module's private name.
                self.private_imports.append(
                    (self.bindings[owner], node.attr, bool(self.guards))
                )
        base = node.value
        while isinstance(base, ast.Attribute):
            base = base.value
        # Only a chain on torch or a torch.cuda alias can be a finding: the
        # dotted name is built for those alone (most attributes are neither).
        name = (
            dotted(node)
            if isinstance(base, ast.Name)
            and (base.id in self.torch_aliases or base.id in self.cuda_aliases)
            else None
        )
        if name is not None and isinstance(node.ctx, ast.Load):
            head, _, rest = name.partition(".")
            if head in self.torch_aliases and (
                rest == "cuda" or rest.startswith("cuda.")
            ):
                if not self._shadowed(head):
                    self.add(node, "torch." + rest, TORCH_CUDA)
                    return
            if head in self.cuda_aliases and not self._shadowed(head):
                self.add(node, f"{self.cuda_aliases[head]}.{rest}", TORCH_CUDA)
                return
        if (
            node.attr == "is_cuda"
            and isinstance(node.ctx, ast.Load)
            and dotted(node.value) not in ("self", "cls")
            and not _platform_like(node.value)
        ):
            # A tensor's flag; `self.is_cuda` is an object's own platform flag.
            self.add(node, "Tensor.is_cuda", IS_CUDA)
        self.visit(node.value)
