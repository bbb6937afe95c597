"""kernel-surface, and the selection chains of no-xpu-forward: what a module takes
from `sgl_kernel`, and the names a platform chain leaves None on XPU.

The scan records every `sgl_kernel` module and name a module imports or reads
(`import sgl_kernel.x`, `from sgl_kernel import y`, `sgl_kernel.y(...)`), unless a
`try: ... except ImportError` catches the import; the tree-wide pass
(`audit/surface.py`) keeps those the XPU package does not provide. A selection
chain is a module-level if-chain that imports a name in arms XPU never takes and
binds it to None in the arm it does (`else: tree_sampling = None`); the tree-wide
pass keeps it when the XPU package exports that very name.
"""

from __future__ import annotations

import ast
import re

from xpu_series.audit.guards import xpu_truth
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_records import KERNEL_SURFACE, NO_XPU_FORWARD, RawFinding

TRIGGER = re.compile(rb"sgl_kernel")
SELECT_TRIGGER = re.compile(rb"= None")
PACKAGE = "sgl_kernel"


def none_on_xpu(
    tree: ast.Module, env: dict[str, bool | None]
) -> dict[str, tuple[int, str]]:
    """Module-level names imported from sgl_kernel only in arms XPU never takes and
    bound to None in an arm it takes: name -> (line of the None, the modules the
    other arms import it from)."""
    dead: dict[str, list[str]] = {}  # name -> modules it is imported from there
    alive_none: dict[str, int] = {}
    alive_other: set[str] = set()

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
                source = stmt.module if isinstance(stmt, ast.ImportFrom) else ""
                for alias in stmt.names:
                    name = alias.asname or alias.name.split(".")[0]
                    if alive:
                        alive_other.add(name)
                    else:
                        dead.setdefault(name, []).append(source or alias.name)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if not isinstance(target, ast.Name):
                        continue
                    none = (
                        isinstance(stmt.value, ast.Constant)
                        and stmt.value.value is None
                    )
                    if alive and none:
                        alive_none.setdefault(target.id, stmt.lineno)
                    elif alive:
                        alive_other.add(target.id)

    walk(tree.body, True)
    # Only a name another device takes from the package XPU has too: whether
    # XPU's build exports it is the tree-wide pass's question.
    return {
        name: (line, ", ".join(dead[name]))
        for name, line in alive_none.items()
        if name not in alive_other
        and any(m == PACKAGE or m.startswith(PACKAGE + ".") for m in dead.get(name, []))
    }


class KernelScan(ScanContext):
    """Raw `kernel-surface` uses and selection-chain candidates (kept or dropped
    against the XPU package's surface by audit/surface.py)."""

    def install_kernels(self, text: bytes, tree: ast.Module) -> None:
        if TRIGGER.search(text):
            self.kernel_aliases: set[str] = set()
            self.on_import.append(self._kernel_import)
            self.on_attribute.append(self._kernel_attribute)
        if SELECT_TRIGGER.search(text):
            chains = none_on_xpu(tree, self.env)
            for name, (line, source) in sorted(chains.items()):
                # What the evidence needs later: where the other arms take it.
                self.pending.append(
                    RawFinding(
                        line,
                        "<module>",
                        f"select:{name}",
                        NO_XPU_FORWARD,
                        "",
                        "feature-off",
                        f"from {source}",
                    )
                )

    def _kernel_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if self.try_import:
            return  # a missing name is caught where it is imported
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    self.kernel_aliases.add(alias.asname or PACKAGE)
                    if alias.name != PACKAGE:
                        self.add(
                            node, alias.name, KERNEL_SURFACE, "raises", pending=True
                        )
            return
        if node.level or not node.module:
            return
        if node.module == PACKAGE:
            for alias in node.names:
                if alias.name != "*":
                    self.add(
                        node,
                        f"{PACKAGE}.{alias.name}",
                        KERNEL_SURFACE,
                        "raises",
                        pending=True,
                    )
        elif node.module.startswith(PACKAGE + "."):
            # Only the module can be checked: the surface lists the package's
            # own top-level names, not each submodule's.
            self.add(node, node.module, KERNEL_SURFACE, "raises", pending=True)

    def _kernel_attribute(self, node: ast.Attribute) -> None:
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in self.kernel_aliases
            and isinstance(node.ctx, ast.Load)
            and not self._shadowed(node.value.id)
        ):
            self.add(
                node, f"{PACKAGE}.{node.attr}", KERNEL_SURFACE, "raises", pending=True
            )
