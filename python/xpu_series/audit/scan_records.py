"""What the audit scanner records: the finding kinds, a finding, an import edge."""

from __future__ import annotations

from dataclasses import dataclass

# Finding kinds (one rule each; the SARIF rule ids are these).
TORCH_CUDA = "torch-cuda"  # torch.cuda.X referenced or called
TENSOR_CUDA = "tensor-cuda"  # x.cuda()
DEVICE_LITERAL = "device-literal"  # "cuda" passed as a device
IS_CUDA = "is-cuda"  # x.is_cuda tested
GUARDED_IMPORT = "guarded-import"  # a name bound only under a CUDA/ROCm guard
CUDA_PACKAGE = "cuda-package"  # a CUDA-only package imported at module level
KINDS = (TORCH_CUDA, TENSOR_CUDA, DEVICE_LITERAL, IS_CUDA, GUARDED_IMPORT, CUDA_PACKAGE)


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
