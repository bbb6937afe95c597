"""What the audit scanner records: the finding kinds, a finding, an import edge, and
the facts about classes the tree-wide rules read."""

from __future__ import annotations

from dataclasses import dataclass

# Finding kinds (one rule each; the SARIF rule ids are these).
TORCH_CUDA = "torch-cuda"  # torch.cuda.X referenced or called
TENSOR_CUDA = "tensor-cuda"  # x.cuda()
DEVICE_LITERAL = "device-literal"  # "cuda" passed as a device
IS_CUDA = "is-cuda"  # x.is_cuda tested
GUARDED_IMPORT = "guarded-import"  # a name bound only under a CUDA/ROCm guard
CUDA_PACKAGE = "cuda-package"  # a CUDA-only package imported at module level
XPU_DOWNGRADE = "xpu-downgrade"  # an XPU predicate silently overrides a setting
BACKEND_CLASS = "backend-class"  # behaviour keyed to a backend class XPU's is not
COLLECTIVE_OP = "collective-op"  # a non-SUM reduction on a group XPU runs with xccl
IPC = "ipc"  # tensor IPC or serialization that only knows CUDA
KERNEL_SURFACE = "kernel-surface"  # an sgl_kernel name the XPU package lacks
NO_XPU_FORWARD = "no-xpu-forward"  # platform dispatch with no XPU or native arm
CUDA_KINDS = (
    TORCH_CUDA,
    TENSOR_CUDA,
    DEVICE_LITERAL,
    IS_CUDA,
    GUARDED_IMPORT,
    CUDA_PACKAGE,
)
XPU_KINDS = (
    XPU_DOWNGRADE,
    BACKEND_CLASS,
    COLLECTIVE_OP,
    IPC,
    KERNEL_SURFACE,
    NO_XPU_FORWARD,
)
KINDS = CUDA_KINDS + XPU_KINDS


@dataclass(frozen=True)
class RawFinding:
    """A use of a CUDA-only API at one place, before reach, triage and effect."""

    line: int
    function: str
    api: str
    kind: str
    guard: str  # why XPU cannot get here ("" when nothing keeps it out)
    # The kinds beyond the CUDA calls say what happens on XPU themselves (their
    # effect depends on the place, not on the API alone); "" takes the API's row.
    effect: str = ""
    evidence: str = ""


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


@dataclass(frozen=True)
class ClassFact:
    """A class as the tree-wide rules need it: its bases and what its methods do.

    `methods` maps a method's name to "raises" (its body only raises
    NotImplementedError), "abstract", "to:<name>" (it returns `self.<name>(...)`)
    or "body" (anything else)."""

    name: str  # qualified inside its module (`Outer.Inner`)
    line: int
    bases: tuple[str, ...]  # as written, resolved through the module's imports
    methods: dict[str, str]


@dataclass(frozen=True)
class ClassUse:
    """A place that builds a class or tests for one: `C(...)`, `isinstance(x, C)`,
    `type(x).__name__ in {...}`, or a backend name compared with a backend value."""

    line: int
    function: str
    how: str  # "build", "isinstance", "classname" or "backend-name"
    names: tuple[str, ...]  # dotted class names (resolved), or the names compared
    guard: str
    # For a test: an arm of the same if-chain that XPU takes (`elif is_xpu():`),
    # or "" when none does.
    sibling: str = ""
    # "raises" when the if-chain's last `else` (what a value no arm matches
    # gets) only raises.
    otherwise: str = ""
