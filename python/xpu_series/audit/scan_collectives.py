"""collective-op: a reduction whose op is not SUM, on a group an XPU server runs
with xccl (oneCCL).

What oneCCL does with each op, and where that is written down, is ONECCL below: the
report cites it with every finding. A reduction of a tensor built on the CPU, or
on a group named for the CPU (`cpu_group`, `gloo_group`), runs on gloo, not
xccl, and is guarded. The tensor's dtype decides the effect: read from how the
function built it (`dtype=torch.int64`, `.to(torch.int32)`, `.long()`), else
from its name (`*_ids`, `*count*`, `*flag*` hold integers).
"""

from __future__ import annotations

import ast
import re

from xpu_series.audit.guards import describe, dotted, xpu_truth
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_devices import is_cuda_string
from xpu_series.audit.scan_records import COLLECTIVE_OP

TRIGGER = re.compile(rb"ReduceOp")
ONECCL = {
    "table": (
        "ProcessGroupXCCL maps ReduceOp SUM, MIN, MAX and PRODUCT to oneCCL's "
        "ccl::reduction sum/min/max/prod (xcclOps in torch's "
        "torch/csrc/distributed/c10d/ProcessGroupXCCL.cpp and intel/torch-xpu-ops "
        "src/xccl/ProcessGroupXCCL.cpp); any other op raises ValueError 'Cannot "
        "use ReduceOp.<op> with XCCL' (https://github.com/intel/torch-xpu-ops/"
        "pull/1579)"
    ),
    "int-minmax": (
        "oneCCL returns the SUM for an integer MIN or MAX: every rank holding v "
        "gets v * world_size (https://github.com/sgl-project/sglang/issues/31011, "
        "int64 token ids; https://github.com/intel/torch-xpu-ops/issues/3059, "
        "int MAX)"
    ),
    "avg": (
        "AVG maps to ccl::reduction::avg only with oneCCL >= 2021.15 "
        "(XCCL_HAS_AVG in ProcessGroupXCCL.cpp); older builds raise ValueError"
    ),
    "premul": (
        "PREMUL_SUM was unsupported on XCCL "
        "(https://github.com/intel/torch-xpu-ops/issues/1571) until "
        "https://github.com/intel/torch-xpu-ops/pull/3173 (2026-03); older "
        "builds raise"
    ),
}
_OPS = ("MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM")
_BUILDERS = frozenset(
    {"tensor", "zeros", "ones", "full", "empty", "arange", "as_tensor", "randint"}
)
_INTS = re.compile(r"^(u?int\d*|long|short|int)$")
_FLOATS = re.compile(r"^(float\d*|half|double|bfloat16|float8\w*)$")
# Names that hold integers in sglang's reductions (ids, counts, flags, sizes).
_INT_NAMES = re.compile(
    r"(ids|_id|count|counts|len|lens|size|sizes|flag|flags|num|index|indices"
    r"|status|statuses|rank|ready|hit|hits|failed|ok|mask)$"
)
_TENSOR_KEYWORDS = ("tensor", "flags", "data", "input_", "input")


def _dtype_of(node: ast.AST | None) -> str:
    """ "int", "bool", "float" or "" for a `torch.<dtype>` expression."""
    name = (dotted(node) or "").rsplit(".", 1)[-1] if node is not None else ""
    if name == "bool":
        return "bool"
    if _INTS.match(name):
        return "int"
    if _FLOATS.match(name):
        return "float"
    return ""


Facts = dict[str, tuple[str, str]]


def built(node: ast.AST, known: Facts | None = None) -> tuple[str, str]:
    """(device, dtype) of the tensor an expression builds, as far as it says:
    device "cpu" (built on the host), "device" (elsewhere) or ""; dtype as
    `_dtype_of`. `known` holds what earlier assignments built, by name."""
    if isinstance(node, ast.Name):
        return (known or {}).get(node.id, ("", ""))
    if not isinstance(node, ast.Call):
        return "", ""
    func = node.func
    keywords = {kw.arg: kw.value for kw in node.keywords if kw.arg}
    if isinstance(func, ast.Attribute) and func.attr in _BUILDERS:
        if (dotted(func.value) or "") == "torch":
            device = _on_xpu(keywords.get("device"))
            if device is None:
                where = "cpu"  # torch's default device is the CPU
            elif isinstance(device, ast.Constant) and device.value == "cpu":
                where = "cpu"
            else:
                where = "device"
            return where, _dtype_of(keywords.get("dtype"))
    if isinstance(func, ast.Attribute):
        inner_device, inner_dtype = built(func.value, known)
        method = func.attr
        if method in ("clone", "contiguous", "detach", "new_tensor"):
            # The same device (and for a clone, the same dtype) as its source.
            return inner_device, inner_dtype if method != "new_tensor" else ""
        if method == "cpu":
            return "cpu", inner_dtype
        if method in ("long", "int", "short"):
            return inner_device, "int"
        if method == "bool":
            return inner_device, "bool"
        if method in ("float", "half", "double", "bfloat16"):
            return inner_device, "float"
        if method == "to":
            device, dtype = inner_device, inner_dtype
            for arg in (*node.args, *keywords.values()):
                arg = _on_xpu(arg)
                if isinstance(arg, ast.Constant) and arg.value == "cpu":
                    device = "cpu"
                elif is_cuda_string(arg) or (dotted(arg) or "").endswith("device"):
                    device = "device"
                elif _dtype_of(arg):
                    dtype = _dtype_of(arg)
            return device, dtype
        if method in ("mean", "std", "var", "norm"):
            return inner_device, "float"
        if method in ("tolist", "item", "numpy", "size", "dim", "numel"):
            return "", ""  # not a tensor any more
        # Other tensor methods (abs, amax, clamp, view, ...) keep where it
        # lives and its dtype.
        return inner_device, inner_dtype
    return "", ""


def _on_xpu(node: ast.AST | None) -> ast.AST | None:
    """The branch of `a if cond else b` XPU takes, when `cond` is known there."""
    while isinstance(node, ast.IfExp):
        truth = xpu_truth(node.test)
        if truth is None:
            return node
        node = node.body if truth else node.orelse
    return node


class CollectiveScan(ScanContext):
    """`collective-op` findings: MIN, MAX, bitwise, AVG reductions on xccl."""

    def install_collectives(self, text: bytes) -> None:
        if TRIGGER.search(text):
            self.on_assign.append(self._remember_tensor)
            self.on_call.append(self._reduction)

    def _known(self) -> Facts:
        known: Facts = {}
        for scope in self.values:
            known.update(scope)
        return known

    def _remember_tensor(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            facts = built(node.value, self._known())
            if facts != ("", ""):
                self.values[-1][node.targets[0].id] = facts

    def _tensor(self, node: ast.Call) -> tuple[ast.AST | None, str, str]:
        keywords = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        arg = next((keywords[k] for k in _TENSOR_KEYWORDS if k in keywords), None)
        if arg is None and node.args:
            arg = node.args[0]
        if arg is None:
            return None, "", ""
        return arg, *built(arg, self._known())

    def _reduction(self, node: ast.Call) -> None:
        op = next(
            (
                v
                for v in (*node.args, *(kw.value for kw in node.keywords))
                if (dotted(v) or "").rsplit(".", 2)[-2:-1] == ["ReduceOp"]
            ),
            None,
        )
        name = (dotted(op) or "").rsplit(".", 1)[-1] if op is not None else ""
        if name not in _OPS:
            return
        tensor, device, dtype = self._tensor(node)
        if tensor is op:
            tensor, device, dtype = None, "", ""
        group = next((kw.value for kw in node.keywords if kw.arg == "group"), None)
        if group is None:
            rest = [a for a in node.args[1:] if a is not op]
            group = rest[0] if rest else None
        group_text = describe(group) if group is not None else ""
        func = node.func
        callee = (
            func.attr if isinstance(func, ast.Attribute) else dotted(func) or "call"
        )
        api = f"{callee}:ReduceOp.{name}"
        what = describe(tensor) if tensor is not None else "the tensor"
        if not dtype and isinstance(tensor, ast.Name) and _INT_NAMES.search(tensor.id):
            dtype = "int (by its name)"
        effect, evidence = _effect(name, dtype)
        if not effect:
            return
        guard = ""
        if device == "cpu":
            guard = f"{what} is built on the CPU: gloo reduces it, not xccl"
        elif re.search(r"cpu|gloo", group_text, re.I):
            guard = f"`{group_text}` is a CPU (gloo) group, not xccl"
        evidence = f"{what} ({dtype or 'dtype unknown'}): {evidence}"
        if guard and not self.guards:
            self.guards.append(guard)
            try:
                self.add(node, api, COLLECTIVE_OP, effect, evidence)
            finally:
                self.guards.pop()
            return
        self.add(node, api, COLLECTIVE_OP, effect, evidence)


def _effect(op: str, dtype: str) -> tuple[str, str]:
    """The effect on xccl of `op` on a tensor of `dtype`, with its source; ("", "")
    where nothing is known to go wrong (a float MIN or MAX)."""
    if op in ("BAND", "BOR", "BXOR"):
        return "raises", ONECCL["table"]
    if op == "AVG":
        return "raises", ONECCL["avg"]
    if op == "PREMUL_SUM":
        return "raises", ONECCL["premul"]
    if dtype == "float":
        # oneCCL has min/max for floats and no report says they are wrong.
        return "", ""
    if dtype == "bool":
        if op == "MAX":
            # The SUM of 0/1 flags is non-zero exactly when one is set: an OR,
            # which is what MAX of bools means.
            return "harmless", (
                f"a bool MAX read as OR stays right although {ONECCL['int-minmax']}"
            )
        return "wrong-result", (
            f"a bool MIN meant as AND becomes an OR: {ONECCL['int-minmax']}"
        )
    known = "" if dtype else "if it holds integers (the reported case): "
    return "wrong-result", known + ONECCL["int-minmax"]
