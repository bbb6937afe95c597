"""One module's CUDA-only code: what it uses, under which guard, and what it imports."""

from __future__ import annotations

import ast
import gc
from dataclasses import asdict, dataclass, field
from typing import Any

from xpu_series.audit.scan_context import module_truths
from xpu_series.audit.scan_devices import DeviceScan
from xpu_series.audit.scan_imports import ImportScan
from xpu_series.audit.scan_names import NameScan, guarded_only_names
from xpu_series.audit.scan_records import (
    CUDA_PACKAGE,
    DEVICE_LITERAL,
    GUARDED_IMPORT,
    IS_CUDA,
    KINDS,
    TENSOR_CUDA,
    TORCH_CUDA,
    ImportEdge,
    RawFinding,
)
from xpu_series.audit.scan_scopes import ScopeScan

__all__ = [
    "CUDA_PACKAGE",
    "DEVICE_LITERAL",
    "GUARDED_IMPORT",
    "IS_CUDA",
    "KINDS",
    "TENSOR_CUDA",
    "TORCH_CUDA",
    "FileScan",
    "ImportEdge",
    "RawFinding",
    "module_name",
    "scan_source",
]


@dataclass
class FileScan:
    """What one file holds for the audit (JSON-able, cached by blob)."""

    module: str
    findings: list[RawFinding] = field(default_factory=list)
    imports: list[ImportEdge] = field(default_factory=list)
    error: str = ""
    # The CUDA-only package the module imports unconditionally at its top (XPU
    # cannot import the module), or "".
    blocks: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "findings": [asdict(f) for f in self.findings],
            "imports": [asdict(i) for i in self.imports],
            "error": self.error,
            "blocks": self.blocks,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileScan:
        return cls(
            data["module"],
            [RawFinding(**f) for f in data["findings"]],
            [
                ImportEdge(
                    tuple(i["targets"]),
                    i["guarded"],
                    i["lazy"],
                    i.get("tried", False),
                    i.get("certain", False),
                )
                for i in data["imports"]
            ],
            data["error"],
            data.get("blocks", ""),
        )


def module_name(path: str) -> str:
    """`python/sglang/srt/x.py` -> `sglang.srt.x`; a package's `__init__` is itself.

    >>> module_name("python/sglang/srt/__init__.py")
    'sglang.srt'
    """
    parts = path.removeprefix("python/").removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


class _Scanner(ScopeScan, ImportScan, NameScan, DeviceScan):
    """Every rule in one walk over the tree: each visits the nodes of its kind."""

    def visit_Module(self, node: ast.Module) -> None:
        self.env = module_truths(node)
        self.cuda_names = guarded_only_names(node, self.env)
        self.block(node.body)


def scan_source(
    source: bytes | str, path: str, cuda_packages: frozenset[str] = frozenset()
) -> FileScan:
    """Scan one file's text; a file that does not parse gives a scan with `error`."""
    module = module_name(path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    collecting = gc.isenabled()
    # A big module's AST is a million objects: the cycle collector would walk
    # them again and again while they are made (a third of the scan's time).
    gc.disable()
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as exc:
        where = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
        msg = getattr(exc, "msg", str(exc))
        return FileScan(module, error=f"does not parse ({where}{msg})")
    finally:
        if collecting:
            gc.enable()
    scanner = _Scanner(module, package, cuda_packages)
    scanner.visit(tree)
    return FileScan(
        module, _called_only_guarded(scanner), scanner.imports, blocks=scanner.blocks
    )


def _called_only_guarded(scanner: _Scanner) -> list[RawFinding]:
    """Findings of private helpers that only guarded code uses are guarded too.

    A private function or method (`_name`) is private to its module: when every
    use of it there (a call, or any other reference) is guarded, or sits in a
    helper that is, XPU never runs it. Repeated until nothing changes.
    """
    users: dict[str, list[tuple[str, bool]]] = {}
    for name, user, guarded in scanner.refs:
        users.setdefault(name, []).append((user, guarded))
    quiet: dict[str, str] = {}  # qualified name -> why
    changed = True
    while changed:
        changed = False
        for name, uses in users.items():
            for qual in scanner.defined.get(name, []):
                if qual in quiet or not uses:
                    continue
                if all(g or _within(u, quiet) for u, g in uses if u != qual):
                    if any(u != qual for u, _ in uses):
                        quiet[qual] = (
                            f"{name} is used only by guarded code in this module"
                        )
                        changed = True
    out = []
    for finding in scanner.findings:
        owner = _within(finding.function, quiet)
        if owner and not finding.guard:
            finding = RawFinding(
                finding.line, finding.function, finding.api, finding.kind, quiet[owner]
            )
        out.append(finding)
    return out


def _within(function: str, quiet: dict[str, str]) -> str:
    """The quiet function `function` is, or is nested in, else ""."""
    parts = function.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in quiet:
            return candidate
    return ""
