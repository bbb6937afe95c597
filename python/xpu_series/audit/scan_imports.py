"""Imports: edges to sglang modules, CUDA-only packages, torch.cuda aliases."""

from __future__ import annotations

import ast

from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_records import CUDA_PACKAGE, ImportEdge


class ImportScan(ScanContext):
    """Import edges and `cuda-package` findings; the aliases other rules read."""

    def _edge(self, targets: list[str]) -> None:
        self.imports.append(
            ImportEdge(
                tuple(targets),
                bool(self.guards),
                self.functions > 0,
                self.try_import > 0,
                self.certain and not self.guards,
            )
        )

    @property
    def certain(self) -> bool:
        """At module level with nothing around that may skip or catch it."""
        return not (self.functions or self.try_import or self.conditional)

    def _package_import(self, node: ast.AST, top: str) -> None:
        if top in self.cuda_packages and not self.functions and not self.try_import:
            self.add(node, f"import:{top}", CUDA_PACKAGE)
            if self.certain and not self.guards and not self.blocks:
                self.blocks = top

    def visit_Import(self, node: ast.Import) -> None:
        for hook in self.on_import:
            hook(node)
        for alias in node.names:
            if alias.name == "torch" and alias.asname:
                self.torch_aliases.add(alias.asname)
            if alias.name.startswith("torch.cuda") and alias.asname:
                # `import torch.cuda.nvtx as nvtx`: nvtx.x is torch.cuda.nvtx.x
                self.cuda_aliases[alias.asname] = alias.name
            self._package_import(node, alias.name.split(".")[0])
            if alias.name.startswith("sglang"):
                self._edge([alias.name])
                if alias.asname:
                    self.bindings[alias.asname] = alias.name

    def absolute(self, node: ast.ImportFrom) -> str:
        """The module a `from ... import` names, relative ones resolved."""
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            parts = parts[: len(parts) - node.level + 1] if node.level > 1 else parts
            base = ".".join(p for p in (*parts, base) if p)
        return base

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for hook in self.on_import:
            hook(node)
        base = self.absolute(node)
        if base == "torch":
            for alias in node.names:
                if alias.name == "cuda":
                    self.cuda_aliases[alias.asname or "cuda"] = "torch.cuda"
        elif base.startswith("torch.cuda"):
            for alias in node.names:
                self.cuda_aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        self._package_import(node, base.split(".")[0])
        if base.startswith("sglang"):
            self._edge([base, *(f"{base}.{a.name}" for a in node.names)])
            for alias in node.names:
                self.bindings[alias.asname or alias.name] = f"{base}.{alias.name}"
                if alias.name[:1] == "_" and alias.name[:2] != "__":
                    # Another module's private helper used here: its "only
                    # guarded code uses it" must count this module too.
                    self.private_imports.append((base, alias.name, bool(self.guards)))

    def visit_Constant(self, node: ast.Constant) -> None:
        # A string naming an sglang module (lazy registries, importlib) is a
        # lazy import of it.
        value = node.value
        if (
            isinstance(value, str)
            and value.startswith("sglang.")
            and len(value) < 200
            and " " not in value
        ):
            name = value.split(":")[0]
            parts = name.split(".")
            self.imports.append(
                ImportEdge(
                    tuple(".".join(parts[:i]) for i in range(2, len(parts) + 1)),
                    bool(self.guards),
                    True,
                )
            )
