"""What each finding kind is, and the fix each of the kinds beyond the CUDA calls
asks for (their effect and evidence come with each finding)."""

from __future__ import annotations

from xpu_series.audit.scan_records import (
    BACKEND_CLASS,
    COLLECTIVE_OP,
    IPC,
    KERNEL_SURFACE,
    NO_XPU_FORWARD,
    XPU_DOWNGRADE,
)

# One line per kind: SARIF's rule descriptions and the report's legend.
RULES = {
    "torch-cuda": "torch.cuda API used where an XPU server runs",
    "tensor-cuda": ".cuda() moves a tensor or module to a CUDA device",
    "device-literal": "a 'cuda' device literal on an XPU path",
    "is-cuda": "an is_cuda test that sends XPU tensors down another branch",
    "guarded-import": "a name imported only under a CUDA/ROCm guard, used outside it",
    "cuda-package": "a CUDA-only package imported at module level",
    XPU_DOWNGRADE: "an XPU predicate silently overrides a user-visible setting",
    BACKEND_CLASS: "behaviour keyed to a backend class that XPU's backend is not",
    COLLECTIVE_OP: "a non-SUM reduction on a group an XPU server runs with xccl",
    IPC: "tensor IPC or serialization that only knows CUDA tensors",
    KERNEL_SURFACE: "an sgl_kernel module or name the XPU kernel package lacks",
    NO_XPU_FORWARD: "platform dispatch or a selection chain with no XPU arm",
}
# The device-agnostic fix, per kind.
FIXES = {
    XPU_DOWNGRADE: "refuse or warn when arguments are resolved, naming the flag and "
    "what XPU does instead",
    BACKEND_CLASS: "give XPU's backend (intel_xpu) the same arm, or test for the "
    "capability instead of the class",
    COLLECTIVE_OP: "all_gather the values and reduce them locally (amin/amax), or "
    "reduce a CPU copy on the gloo group",
    IPC: "pickle tensors of a device without torch IPC by value (a host copy)",
    KERNEL_SURFACE: "import it under try/except ImportError with a fallback, or "
    "require a newer sgl-kernel-xpu",
    NO_XPU_FORWARD: "define forward_xpu or forward_native, or give the chain an XPU "
    "arm (or refuse the feature on XPU where it is chosen)",
}
