"""Code that picks the CUDA device: `x.cuda()` and "cuda" as a device."""

from __future__ import annotations

import ast

from xpu_series.audit.guards import dotted
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_records import DEVICE_LITERAL, TENSOR_CUDA


def _tensor_cuda_call(node: ast.Call) -> bool:
    """`x.cuda()` as Tensor.cuda / Module.cuda takes it: at most a device and
    non_blocking / memory_format; `Requirement.cuda(min_sm=90)` is another API."""
    allowed = {"device", "non_blocking", "memory_format"}
    if any(kw.arg not in allowed for kw in node.keywords) or len(node.args) > 2:
        return False
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
    head = (dotted(receiver) or "").rsplit(".", 1)[-1] if receiver else ""
    return not head[:1].isupper()


def is_cuda_string(node: ast.AST) -> bool:
    """`"cuda"`, `"cuda:N"`, or an f-string that starts as one."""
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


class DeviceScan(ScanContext):
    """`tensor-cuda` and `device-literal` findings, from calls and assignments."""

    def visit_Call(self, node: ast.Call) -> None:
        for hook in self.on_call:
            hook(node)
        func = node.func
        tail = (
            func.attr
            if isinstance(func, ast.Attribute)
            else func.id
            if isinstance(func, ast.Name)
            else ""
        )
        # The full name matters for three callees only (most calls are none).
        fname = (
            dotted(func) or ""
            if tail in ("cuda", "device") or tail.endswith("set_default_device")
            else ""
        )
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
            literal = bool(node.args) and is_cuda_string(node.args[0])
        literal = literal or any(
            kw.arg in ("device", "device_type") and is_cuda_string(kw.value)
            for kw in node.keywords
        )
        if literal:
            self.add(node, "device:cuda", DEVICE_LITERAL)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for hook in self.on_assign:
            hook(node)
        if is_cuda_string(node.value) and any(
            "device" in (dotted(t) or "").lower() for t in node.targets
        ):
            self.add(node, "device:cuda", DEVICE_LITERAL)
        self.generic_visit(node)
