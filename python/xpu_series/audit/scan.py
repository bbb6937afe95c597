"""One module's XPU hazards: what it uses, under which guard, what it imports, and
the class facts the tree-wide rules read."""

from __future__ import annotations

import ast
import dataclasses
import gc
from dataclasses import dataclass, field
from typing import Any

from xpu_series.audit.scan_classes import ClassScan
from xpu_series.audit.scan_collectives import CollectiveScan
from xpu_series.audit.scan_context import module_truths
from xpu_series.audit.scan_devices import DeviceScan
from xpu_series.audit.scan_downgrade import DowngradeScan
from xpu_series.audit.scan_imports import ImportScan
from xpu_series.audit.scan_ipc import IpcScan
from xpu_series.audit.scan_kernels import KernelScan
from xpu_series.audit.scan_names import NameScan, guarded_only_names
from xpu_series.audit.scan_records import (
    CUDA_PACKAGE,
    DEVICE_LITERAL,
    GUARDED_IMPORT,
    IS_CUDA,
    KINDS,
    TENSOR_CUDA,
    TORCH_CUDA,
    ClassFact,
    ClassUse,
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
    # Raw findings the tree-wide pass keeps or drops (audit/surface.py).
    pending: list[RawFinding] = field(default_factory=list)
    error: str = ""
    # The CUDA-only package the module imports unconditionally at its top (XPU
    # cannot import the module), or "".
    blocks: str = ""
    classes: list[ClassFact] = field(default_factory=list)
    uses: list[ClassUse] = field(default_factory=list)
    bindings: dict[str, str] = field(default_factory=dict)
    registrations: list[tuple[str, str, str]] = field(default_factory=list)
    # Other modules' private names this one uses: (module, name, guarded here).
    private_imports: list[tuple[str, str, bool]] = field(default_factory=list)
    # Functions found quiet because only guarded code here uses them: qualified
    # name -> the functions here that use it (the tree-wide pass asks the other
    # modules, and takes back what rested on one it took back).
    quiet: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies, and a cold audit writes
        # every module's scan.
        return {
            "module": self.module,
            "findings": [_compact(f) for f in self.findings],
            "imports": [_fields(i) for i in self.imports],
            "pending": [_compact(f) for f in self.pending],
            "error": self.error,
            "blocks": self.blocks,
            "classes": [_fields(c) for c in self.classes],
            "uses": [_fields(u) for u in self.uses],
            "bindings": self.bindings,
            "registrations": self.registrations,
            "private_imports": self.private_imports,
            "quiet": self.quiet,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileScan:
        return cls(
            module=data["module"],
            findings=[RawFinding(**f) for f in data["findings"]],
            imports=[
                ImportEdge(
                    tuple(i["targets"]),
                    i["guarded"],
                    i["lazy"],
                    i.get("tried", False),
                    i.get("certain", False),
                )
                for i in data["imports"]
            ],
            pending=[RawFinding(**f) for f in data.get("pending", [])],
            error=data["error"],
            blocks=data.get("blocks", ""),
            classes=[
                ClassFact(c["name"], c["line"], tuple(c["bases"]), c["methods"])
                for c in data.get("classes", [])
            ],
            uses=[
                ClassUse(**{**u, "names": tuple(u["names"])})
                for u in data.get("uses", [])
            ],
            bindings=data.get("bindings", {}),
            registrations=[(r[0], r[1], r[2]) for r in data.get("registrations", [])],
            private_imports=[
                (p[0], p[1], p[2]) for p in data.get("private_imports", [])
            ],
            quiet=data.get("quiet", {}),
        )


def _fields(record: Any) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _compact(finding: RawFinding) -> dict[str, Any]:
    """A finding without its empty optional fields (most have none)."""
    data = _fields(finding)
    if not finding.effect:
        del data["effect"]
    if not finding.evidence:
        del data["evidence"]
    return data


def module_name(path: str) -> str:
    """`python/sglang/srt/x.py` -> `sglang.srt.x`; a package's `__init__` is itself.

    >>> module_name("python/sglang/srt/__init__.py")
    'sglang.srt'
    """
    parts = path.removeprefix("python/").removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


class _Scanner(
    ScopeScan,
    ImportScan,
    NameScan,
    DeviceScan,
    DowngradeScan,
    CollectiveScan,
    IpcScan,
    KernelScan,
    ClassScan,
):
    """Every rule in one walk over the tree: each visits the nodes of its kind, or
    hooks into the walk where the file's text can hold its finding."""

    text: bytes = b""

    def visit_Module(self, node: ast.Module) -> None:
        self.env = module_truths(node)
        self.cuda_names = guarded_only_names(node, self.env)
        self.install_downgrade(self.text)
        self.install_collectives(self.text)
        self.install_ipc(self.text)
        self.install_kernels(self.text, node)
        self.install_classes(self.text)
        self.block(node.body)
        self.finish_classes()


def scan_source(
    source: bytes | str, path: str, cuda_packages: frozenset[str] = frozenset()
) -> FileScan:
    """Scan one file's text; a file that does not parse gives a scan with `error`."""
    module = module_name(path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    collecting = gc.isenabled()
    # A big module's AST is a million objects: the cycle collector would walk
    # them again and again while they are made, and again whenever the walk
    # allocates (half of a scan's time). The walk makes no cycles worth it.
    gc.disable()
    try:
        try:
            tree = ast.parse(source, filename=path)
        except (SyntaxError, ValueError) as exc:
            where = f"line {exc.lineno}: " if getattr(exc, "lineno", None) else ""
            msg = getattr(exc, "msg", str(exc))
            return FileScan(module, error=f"does not parse ({where}{msg})")
        scanner = _Scanner(module, package, cuda_packages)
        scanner.text = source if isinstance(source, bytes) else source.encode()
        scanner.visit(tree)
        del tree
    finally:
        if collecting:
            gc.enable()
    findings, quiet = _called_only_guarded(scanner)
    return FileScan(
        module,
        findings,
        scanner.imports,
        blocks=scanner.blocks,
        classes=scanner.classes,
        uses=scanner.uses,
        bindings={k: v for k, v in scanner.bindings.items() if k[:1].isupper()},
        pending=scanner.pending,
        registrations=scanner.registrations,
        private_imports=_private_uses(scanner),
        quiet=quiet,
    )


def _private_uses(scanner: _Scanner) -> list[tuple[str, str, bool]]:
    """Other modules' private names used here, each once: guarded only when every
    use is (the import itself, or each reference of the name it binds)."""
    unguarded_refs = {name for name, _user, guarded in scanner.refs if not guarded}
    seen: dict[tuple[str, str], bool] = {}
    for module, name, guarded in scanner.private_imports:
        quiet = guarded or name not in unguarded_refs
        key = (module, name)
        seen[key] = seen.get(key, True) and quiet
    return [(m, n, g) for (m, n), g in sorted(seen.items())]


def _called_only_guarded(
    scanner: _Scanner,
) -> tuple[list[RawFinding], dict[str, str]]:
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
            finding = dataclasses.replace(finding, guard=quiet[owner])
        out.append(finding)
    return out, {
        qual: sorted({u for u, _g in users[qual.rsplit(".", 1)[-1]] if u != qual})
        for qual in quiet
    }


def _within(function: str, quiet: dict[str, str]) -> str:
    """The quiet function `function` is, or is nested in, else ""."""
    parts = function.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in quiet:
            return candidate
    return ""
