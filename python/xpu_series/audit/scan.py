"""One module's CUDA-only code: what it uses, under which guard, and what it imports."""

from __future__ import annotations

import ast
import contextlib
import gc
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from xpu_series.audit.guards import OTHER_BACKENDS, describe, dotted, xpu_truth

# Finding kinds (one rule each; the SARIF rule ids are these).
TORCH_CUDA = "torch-cuda"  # torch.cuda.X referenced or called
TENSOR_CUDA = "tensor-cuda"  # x.cuda()
DEVICE_LITERAL = "device-literal"  # "cuda" passed as a device
IS_CUDA = "is-cuda"  # x.is_cuda tested
GUARDED_IMPORT = "guarded-import"  # a name bound only under a CUDA/ROCm guard
CUDA_PACKAGE = "cuda-package"  # a CUDA-only package imported at module level
KINDS = (TORCH_CUDA, TENSOR_CUDA, DEVICE_LITERAL, IS_CUDA, GUARDED_IMPORT, CUDA_PACKAGE)

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
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class RawFinding:
    """A use of a CUDA-only API at one place, before reach, triage and effect."""

    line: int
    function: str
    api: str
    kind: str
    guard: str  # why XPU cannot get here ("" when nothing keeps it out)


@dataclass(frozen=True)
class ImportEdge:
    """An import of another module: the names it may mean, and its guard."""

    targets: tuple[str, ...]  # candidate module names, most specific last
    guarded: bool  # under a condition that is False on XPU
    lazy: bool  # inside a function (or a string naming a module)
    tried: bool = False  # inside `try: ... except ImportError` (or broader)
    # At module level and unconditional (no if, loop, with or try around it):
    # the module cannot be imported without it.
    certain: bool = False


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


def _module_truths(tree: ast.Module) -> dict[str, bool | None]:
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


def _bound_names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _guarded_only_names(tree: ast.Module, env: dict[str, bool | None]) -> set[str]:
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


def _platform_like(node: ast.AST) -> bool:
    """`get_platform()`, `current_platform`, `platform`: a platform object, whose
    `is_cuda` is a platform check (a guard), not a tensor's device."""
    text = (dotted(node.func) if isinstance(node, ast.Call) else dotted(node)) or ""
    return "platform" in text.lower()


def _tensor_cuda_call(node: ast.Call) -> bool:
    """`x.cuda()` as Tensor.cuda / Module.cuda takes it: at most a device and
    non_blocking / memory_format; `Requirement.cuda(min_sm=90)` is another API."""
    allowed = {"device", "non_blocking", "memory_format"}
    if any(kw.arg not in allowed for kw in node.keywords) or len(node.args) > 2:
        return False
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    head = (dotted(receiver) or "").rsplit(".", 1)[-1] if receiver else ""
    return not head[:1].isupper()


def _registered_backend(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """`name` of a `@register_..._backend("name")` decorator, else ""."""
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
            return first.value
    return ""


def _is_cuda_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value == "cuda" or node.value.startswith("cuda:")
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        return (
            isinstance(head, ast.Constant)
            and isinstance(head.value, str)
            and (head.value == "cuda" or head.value.startswith("cuda:"))
        )
    return False


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: str, package: str, cuda_packages: frozenset[str]):
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
        self.imports: list[ImportEdge] = []
        # (private name, the function using it, guarded there) and each
        # function's qualified name by its own name.
        self.refs: list[tuple[str, str, bool]] = []
        self.defined: dict[str, list[str]] = {}

    # --- bookkeeping -------------------------------------------------------
    def add(self, node: ast.AST, api: str, kind: str) -> None:
        self.findings.append(
            RawFinding(
                line=getattr(node, "lineno", 0),
                function=".".join(self.scope) or "<module>",
                api=api,
                kind=kind,
                guard=self.guards[-1] if self.guards else "",
            )
        )

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

    def generic_visit(self, node: ast.AST) -> None:
        for _name, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.block(value)
                else:
                    for item in value:
                        if isinstance(item, ast.AST):
                            self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    # --- scopes ------------------------------------------------------------
    def visit_Module(self, node: ast.Module) -> None:
        self.env = _module_truths(node)
        self.cuda_names = _guarded_only_names(node, self.env)
        self.block(node.body)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        backend = _registered_backend(node)
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
            if default is not None and not _is_cuda_string(default):
                self.visit(default)
        self.scope.append(node.name)
        self.defined.setdefault(node.name, []).append(".".join(self.scope))
        self.locals.append(node)
        self.functions += 1
        try:
            self.block(node.body)
        finally:
            self.scope.pop()
            self.locals.pop()
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
        with self._conditionally():
            self._visit_if(node)

    def visit_For(self, node: ast.For) -> None:
        with self._conditionally():
            self.generic_visit(node)

    visit_AsyncFor = visit_For
    visit_With = visit_For
    visit_AsyncWith = visit_For
    visit_Match = visit_For

    def _visit_if(self, node: ast.If) -> None:
        self.visit(node.test)
        truth = xpu_truth(node.test, self.env)
        cond = describe(node.test)
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
        cond = describe(node.test)
        if truth is False:
            self.under(f"`... if {cond}` is False on XPU", node.body)
        else:
            self.visit(node.body)
        if truth is True:
            self.under(f"`... else` of `{cond}`, True on XPU", node.orelse)
        else:
            self.visit(node.orelse)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
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
            if stops:
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

    # --- imports -----------------------------------------------------------
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
        for alias in node.names:
            if alias.name == "torch" and alias.asname:
                self.torch_aliases.add(alias.asname)
            if alias.name.startswith("torch.cuda") and alias.asname:
                # `import torch.cuda.nvtx as nvtx`: nvtx.x is torch.cuda.nvtx.x
                self.cuda_aliases[alias.asname] = alias.name
            self._package_import(node, alias.name.split(".")[0])
            if alias.name.startswith("sglang"):
                self._edge([alias.name])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            parts = parts[: len(parts) - node.level + 1] if node.level > 1 else parts
            base = ".".join(p for p in (*parts, base) if p)
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

    # --- uses --------------------------------------------------------------
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
        if (
            node.attr[:1] == "_"
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            self._refer(node.attr)
        name = dotted(node)
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

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        fname = dotted(func) or ""
        if isinstance(func, ast.Attribute) and func.attr == "is_cuda":
            # `platform.is_cuda()` is a platform check (a guard), not a tensor's.
            self.visit(func.value)
            for arg in (*node.args, *node.keywords):
                self.visit(arg)
            return
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "cuda"
            and fname.split(".")[0] not in self.torch_aliases
            and _tensor_cuda_call(node)
        ):
            self.add(node, "Tensor.cuda", TENSOR_CUDA)
            self.visit(func.value)
            for arg in (*node.args, *node.keywords):
                self.visit(arg)
            return
        literal = False
        if fname.endswith(("torch.device", "set_default_device")) or (
            isinstance(func, ast.Attribute) and func.attr == "to"
        ):
            literal = bool(node.args) and _is_cuda_string(node.args[0])
        literal = literal or any(
            kw.arg in ("device", "device_type") and _is_cuda_string(kw.value)
            for kw in node.keywords
        )
        if literal:
            self.add(node, "device:cuda", DEVICE_LITERAL)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if _is_cuda_string(node.value) and any(
            "device" in (dotted(t) or "").lower() for t in node.targets
        ):
            self.add(node, "device:cuda", DEVICE_LITERAL)
        self.generic_visit(node)

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
