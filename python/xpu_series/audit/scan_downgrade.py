"""xpu-downgrade: an explicit XPU predicate that silently overrides what a user asked.

Two shapes. At argument resolution, a branch XPU takes (`if get_platform().is_xpu:`,
`if cfg.device == "xpu":`) that writes a setting (`declare_resolution(..., x=v)`, a
returned override dict, `server_args.x = v`, `envs.X.set(v)`, `return False` from a
`supports_*` predicate) with no warning and no error. At run time, `... or is_xpu`
whose other operand reads a sampling or server setting: on XPU the setting no
longer decides. A write the user did not make (`if cfg.x is None:`, a `*_locked`
check, `is_set()`), a warning or raise beside it, or a warning that names it, is
not a downgrade.
"""

from __future__ import annotations

import ast
import re

from xpu_series.audit.guards import describe, dotted, xpu_truth
from xpu_series.audit.scan_context import ScanContext, mentions_xpu
from xpu_series.audit.scan_records import XPU_DOWNGRADE

TRIGGER = re.compile(rb"xpu")
_WARNS = frozenset(
    {
        "warning",
        "warn",
        "warning_once",
        "warn_once",
        "print_warning_once",
        "log_warning",
        "error",
        "critical",
        "exception",
    }
)
# A test that lets the write happen only when the user set nothing.
_UNSET = re.compile(r"\bis None\b|_locked|is_set\(\)|== ['\"]auto['\"]")
_PREDICATE = re.compile(r"^_*(supports?_|is_\w*supported|can_|should_|use_|enable)")
_ARGS = re.compile(r"(^|_)args$|^(cfg|view)$")
# What a run-time operand reads when it carries the user's choice.
_SAMPLING = re.compile(
    r"sampl|greedy|temperature|top_[pk]|min_p|rejection|accept_thresh", re.I
)
_SETTINGS = re.compile(r"server_args|get_spec\(|get_exec\(|get_global_server_args")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _explicit_xpu(node: ast.AST, env: dict[str, bool | None]) -> bool | None:
    """True/False when `node` is an explicit XPU test and its value on XPU."""
    truth = xpu_truth(node, env)
    if truth is None or not mentions_xpu(node):
        return None
    return truth


def _strings(node: ast.AST) -> str:
    """Every string constant inside `node`, joined (a warning's message)."""
    return " ".join(
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def _norm(text: str) -> str:
    return text.lower().replace("-", "_")


def _warns(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Raise):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        name = func.attr if isinstance(func, ast.Attribute) else dotted(func) or ""
        return name in _WARNS
    return False


def _walk_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement of `body` and its nested blocks, not of nested scopes."""
    out: list[ast.stmt] = []
    todo = list(body)
    while todo:
        stmt = todo.pop(0)
        out.append(stmt)
        if isinstance(stmt, _SCOPES):
            continue
        for part in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(stmt, part, []) or [])
    return out


class DowngradeScan(ScanContext):
    """`xpu-downgrade` findings: settings XPU overrides without a word."""

    def install_downgrade(self, text: bytes) -> None:
        if TRIGGER.search(text):
            self.on_if.append(self._downgrade_if)
            self.on_boolop.append(self._downgrade_or)

    # --- argument resolution ----------------------------------------------------
    def _downgrade_if(self, node: ast.If) -> None:
        truth = _explicit_xpu(node.test, self.env)
        if truth is None:
            return
        branch = node.body if truth else node.orelse
        if not branch:
            return
        cond = describe(node.test)
        messages = _norm(
            " ".join(_strings(s) for s in _walk_statements(branch) if _warns(s))
        )
        unset = bool(_UNSET.search(ast.unparse(node.test)))
        self._writes(branch, cond, messages, unset, [branch])

    def _writes(
        self,
        block: list[ast.stmt],
        cond: str,
        messages: str,
        unset: bool,
        path: list[list[ast.stmt]],
    ) -> None:
        warned = any(_warns(s) for b in path for s in b)
        for stmt in block:
            if isinstance(stmt, _SCOPES):
                continue
            if isinstance(stmt, ast.If):
                if _explicit_xpu(stmt.test, self.env) is not None:
                    continue  # an XPU test of its own: its hook reads it
                inner = unset or bool(_UNSET.search(ast.unparse(stmt.test)))
                self._writes(stmt.body, cond, messages, inner, [*path, stmt.body])
                self._writes(stmt.orelse, cond, messages, inner, [*path, stmt.orelse])
                continue
            for part in ("body", "orelse", "finalbody"):
                inner_block = getattr(stmt, part, None)
                if inner_block:
                    self._writes(
                        inner_block, cond, messages, unset, [*path, inner_block]
                    )
            for setting in self._settings(stmt):
                if unset or warned or _norm(setting) in messages:
                    continue
                self.add(
                    stmt,
                    f"is_xpu:{setting}",
                    XPU_DOWNGRADE,
                    "feature-off",
                    f"on XPU (`{cond}`) this sets {setting} with no warning or "
                    "error: the user asked for something else and silently gets "
                    "this",
                )

    def _settings(self, stmt: ast.stmt) -> list[str]:
        """The user-visible settings `stmt` writes."""
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            value = stmt.value
            if isinstance(value, ast.Dict) and self.functions:
                return [
                    k.value
                    for k in value.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
            name = self.scope[-1] if self.scope else ""
            if (
                isinstance(value, ast.Constant)
                and value.value is False
                and _PREDICATE.match(name)
            ):
                return [name]
            return []
        if isinstance(stmt, (ast.Assign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            out = []
            for target in targets:
                if isinstance(target, ast.Attribute):
                    owner = (dotted(target.value) or "").rsplit(".", 1)[-1]
                    if _ARGS.search(owner):
                        out.append(target.attr)
            return out
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            name = dotted(call.func) or ""
            final = name.rsplit(".", 1)[-1]
            if final == "declare_resolution":
                return [kw.arg for kw in call.keywords if kw.arg]
            if final == "set" and name.startswith("envs."):
                return [name.split(".")[1]]
            if final == "setattr" and len(call.args) >= 2:
                owner = (dotted(call.args[0]) or "").rsplit(".", 1)[-1]
                key = call.args[1]
                if (
                    _ARGS.search(owner)
                    and isinstance(key, ast.Constant)
                    and isinstance(key.value, str)
                ):
                    return [key.value]
        return []

    # --- run time -------------------------------------------------------------
    def _downgrade_or(self, node: ast.BoolOp) -> None:
        if not isinstance(node.op, ast.Or):
            return
        xpu = [v for v in node.values if _explicit_xpu(v, self.env) is True]
        if not xpu:
            return
        chosen = [
            v
            for v in node.values
            if xpu_truth(v, self.env) is None
            and (_SAMPLING.search(describe(v)) or _SETTINGS.search(describe(v)))
        ]
        if not chosen:
            return
        names = sorted(
            {
                n.id if isinstance(n, ast.Name) else n.attr
                for v in chosen
                for n in ast.walk(v)
                if isinstance(n, (ast.Name, ast.Attribute))
            }
        )
        sampling = any(_SAMPLING.search(describe(v)) for v in chosen)
        self.add(
            node,
            f"is_xpu:{','.join(names[:3])}",
            XPU_DOWNGRADE,
            "wrong-result" if sampling else "feature-off",
            f"`{describe(node)}` is True on XPU (`{describe(xpu[0])}`) whatever "
            f"{', '.join(describe(v) for v in chosen)} says: the user's choice "
            "is ignored without a warning",
        )
