"""What a condition evaluates to on an XPU server: True, False, or unknown (None)."""

from __future__ import annotations

import ast
import re

# Predicates that are False on an Intel GPU server, by their name (a module flag
# `_is_cuda = is_cuda()`, a helper call `is_hip()`, a platform method
# `current_platform.is_npu()`, an instance flag `self.is_cuda`). Names, not
# imports: sglang spells the same check in all three ways.
_FALSE_NAMES = re.compile(
    r"^_*(?:is_(?:cuda|cuda_alike|hip|hip_runtime|rocm|npu|npu_arch\d*|cpu|musa|mps"
    r"|hpu|fp8_fnuz|flashinfer_available|blackwell\w*|hopper\w*|gfx\w+"
    r"|sm\d+\w*|nvidia\w*)(?:_static)?|use_aiter\w*|use_rocm\w*|is_cuda_and_\w+)$"
)
_TRUE_NAMES = re.compile(r"^_*is_xpu$")
# Device names other than XPU's: a device or platform string equal to one of
# these is False on XPU.
OTHER_DEVICES = frozenset({"cuda", "hip", "rocm", "npu", "musa", "mps", "cpu", "hpu"})
# Backends a user names with a flag (--attention-backend, --moe-runner-backend,
# --lora-backend, ...) that run only on CUDA, ROCm, NPU or the CPU: an XPU
# server never has them unless a user asks for a CUDA backend on an Intel GPU.
# XPU's own are intel_xpu, triton, torch_native, flex_attention and pytorch.
OTHER_BACKENDS = re.compile(
    r"^(flashinfer\w*|trtllm\w*|fa3|fa4|flashmla|cutlass\w*|cutedsl\w*|deep_?gemm"
    r"|deepep\w*|marlin|experimental_sgl_\w+|aiter\w*|wave|ascend\w*|hpc_ops"
    r"|\w*megamoe|mori\w*|nsa|dsa|qsa|dsv4|minicpm_\w+|intel_amx|lora_cutedsl"
    r"|lora_marlin|flashkda|nvidia_kda|ptx_kda|humming|cudnn\w*|csgmv"
    r"|llada2_cfg_flashinfer)$"
)
# Attributes of torch that read False on a torch without CUDA compiled in.
_FALSE_ATTRS = {
    "torch.version.cuda",
    "torch.version.hip",
    "torch.cuda.is_available",
    "torch.cuda.is_initialized",
}
# Read None on a torch without CUDA or ROCm compiled in.
_NONE_ATTRS = {"torch.version.cuda", "torch.version.hip"}
_TRUE_ATTRS = {"torch.xpu.is_available"}


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None.

    >>> dotted(ast.parse("torch.cuda.Stream", mode="eval").body)
    'torch.cuda.Stream'
    """
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _final_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _device_like(node: ast.AST) -> bool:
    """A value that names a device or platform (`device`, `x.device.type`, ...)."""
    text = (dotted(node.func) if isinstance(node, ast.Call) else dotted(node)) or ""
    text = text.lower()
    return any(w in text for w in ("device", "platform", "backend_type", ".type"))


def backend_like(node: ast.AST) -> bool:
    """A value that holds a backend a user chose (`server_args.lora_backend`)."""
    text = (dotted(node.func) if isinstance(node, ast.Call) else dotted(node)) or ""
    return "backend" in text.lower()


def _strings(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out = []
        for elt in node.elts:
            if not (isinstance(elt, ast.Constant) and isinstance(elt.value, str)):
                return None
            out.append(elt.value)
        return out
    return None


def _compare(node: ast.Compare, env: dict[str, bool | None]) -> bool | None:
    if len(node.ops) != 1:
        return None
    op, left, right = node.ops[0], node.left, node.comparators[0]
    if isinstance(op, (ast.In, ast.NotIn)):
        names = _strings(right)
        if names and backend_like(left) and all(OTHER_BACKENDS.match(n) for n in names):
            return isinstance(op, ast.NotIn)
        if names is None or not _device_like(left):
            return None
        if "xpu" in names:
            hit: bool | None = True
        elif set(names) <= OTHER_DEVICES:
            hit = False
        else:
            return None
        return hit if isinstance(op, ast.In) else (not hit)
    if not isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
        return None
    if isinstance(right, ast.Constant) and right.value is None:
        if dotted(left) in _NONE_ATTRS:  # `torch.version.cuda is not None`
            return isinstance(op, (ast.Is, ast.Eq))
    for value, other in ((right, left), (left, right)):
        names = _strings(value)
        if not names or len(names) != 1 or isinstance(value, ast.Tuple):
            continue
        if backend_like(other) and OTHER_BACKENDS.match(names[0]):
            chosen = False  # only when a user names a CUDA backend on XPU
            return chosen if isinstance(op, (ast.Eq, ast.Is)) else (not chosen)
        name = names[0].split(":")[0]
        if name == "cuda" or (name in OTHER_DEVICES and _device_like(other)):
            equal: bool | None = False
        elif name == "xpu" and _device_like(other):
            equal = True
        else:
            continue
        return equal if isinstance(op, (ast.Eq, ast.Is)) else (not equal)
    if dotted(left) == "__name__":
        return False  # `if __name__ == "__main__":` is not a server's path
    return None


def xpu_truth(node: ast.AST, env: dict[str, bool | None] | None = None) -> bool | None:
    """True or False when `node` has that value on every XPU server, else None.

    `env` maps module-level names to their value on XPU (`_is_cuda = is_cuda()`).

    >>> xpu_truth(ast.parse("_is_cuda or _is_hip", mode="eval").body)
    False
    >>> xpu_truth(ast.parse("device.type != 'cpu'", mode="eval").body)
    True
    >>> print(xpu_truth(ast.parse("use_fast and _is_xpu", mode="eval").body))
    None
    """
    env = env or {}
    if isinstance(node, ast.BoolOp):
        values = [xpu_truth(v, env) for v in node.values]
        if isinstance(node.op, ast.And):
            if False in values:
                return False
            return True if all(v is True for v in values) else None
        if True in values:
            return True
        return False if all(v is False for v in values) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = xpu_truth(node.operand, env)
        return None if inner is None else not inner
    if isinstance(node, ast.Compare):
        return _compare(node, env)
    if isinstance(node, ast.Constant):
        return bool(node.value) if node.value in (True, False, None) else None
    name = dotted(node.func) if isinstance(node, ast.Call) else dotted(node)
    if name in _FALSE_ATTRS:
        return False
    if name in _TRUE_ATTRS:
        return True
    if name in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
        return False  # only a type checker runs it
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.Attribute) and node.attr == "is_cuda":
        return False  # an XPU tensor is not a CUDA tensor
    final = _final_name(node)
    if final is None or isinstance(node, ast.Subscript):
        return None
    if _FALSE_NAMES.match(final):
        return False
    if (
        final.startswith("is_")
        and OTHER_BACKENDS.match(final[3:])
        and backend_like(
            node.func.value
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            else node
        )
    ):
        return False  # `get_moe_runner_backend().is_flashinfer_mxfp4()`
    if _TRUE_NAMES.match(final):
        return True
    return None


def describe(node: ast.AST) -> str:
    """The condition's source, one line, shortened for a report."""
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 60 else text[:57] + "..."
