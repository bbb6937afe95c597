"""ipc: tensor IPC or serialization that only knows CUDA tensors.

torch's tensor reducer (`torch.multiprocessing.reductions.reduce_tensor`) has a CUDA
arm (a CUDA IPC handle) and a meta arm; every other device goes through the
storage's file-descriptor path, which only a CPU storage has. So pickling an XPU
tensor with `ForkingPickler` raises, code that reads the CUDA arm's fields out of
`reduce_tensor`'s result raises, and CUDA IPC handles (`_share_cuda_`,
`_new_shared_cuda`, `cudaIpc*`) do not exist for XPU memory. A branch under
`x.is_cuda` or `is_cuda()` is guarded as usual.
"""

from __future__ import annotations

import ast
import re

from xpu_series.audit.guards import dotted
from xpu_series.audit.scan_context import ScanContext
from xpu_series.audit.scan_records import IPC

TRIGGER = re.compile(
    rb"ForkingPickler|reductions|_share_cuda_|_new_shared_cuda|cudaIpc"
)
_TORCH_ISSUES = (
    "https://github.com/sgl-project/sglang/pull/40720, "
    "https://github.com/intel/torch-xpu-ops/issues/5406"
)
EVIDENCE = {
    "pickle": (
        "torch's reduce_tensor has CUDA and meta arms only "
        "(torch/multiprocessing/reductions.py): an XPU tensor in the object goes "
        "to reduce_storage -> storage._share_fd_cpu_() -> RuntimeError "
        f"'_share_fd_: only available on CPU' ({_TORCH_ISSUES})"
    ),
    "reduce": (
        "reduce_tensor returns the CUDA rebuild's 15 arguments only for a CUDA "
        "tensor; for an XPU tensor it takes the storage path, which raises, and "
        "code that reads the CUDA arm's fields (slot 6, the device) raises "
        f"IndexError on any other result ({_TORCH_ISSUES})"
    ),
    "handle": (
        "a CUDA IPC handle: an XPU storage has none (torch raises), and XPU's "
        "own IPC is not in torch 2.14 (https://github.com/intel/torch-xpu-ops/"
        "issues/1678)"
    ),
    "cudart": "libcudart's IPC calls: an XPU image has no CUDA runtime to load",
}


class IpcScan(ScanContext):
    """`ipc` findings: ForkingPickler, reduce_tensor, CUDA IPC handles."""

    def install_ipc(self, text: bytes) -> None:
        if TRIGGER.search(text):
            self.reducers: set[str] = set()
            self.on_import.append(self._ipc_import)
            self.on_call.append(self._ipc_call)

    def _ipc_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.module == (
            "torch.multiprocessing.reductions"
        ):
            for alias in node.names:
                if "reduce_tensor" in alias.name:
                    self.reducers.add(alias.asname or alias.name)

    def _ipc_call(self, node: ast.Call) -> None:
        func = node.func
        name = dotted(func) or ""
        final = func.attr if isinstance(func, ast.Attribute) else name
        if isinstance(func, ast.Attribute) and final in ("dump", "dumps"):
            owner = func.value
            inner = owner.func if isinstance(owner, ast.Call) else owner
            if (dotted(inner) or "").rsplit(".", 1)[-1] == "ForkingPickler":
                self.add(
                    node, f"ForkingPickler.{final}", IPC, "raises", EVIDENCE["pickle"]
                )
            return
        if "reduce_tensor" in final and (
            "reductions." in name or final in self.reducers
        ):
            self.add(
                node, "reductions.reduce_tensor", IPC, "raises", EVIDENCE["reduce"]
            )
        elif final in ("_share_cuda_", "_new_shared_cuda"):
            self.add(node, f"Storage.{final}", IPC, "raises", EVIDENCE["handle"])
        elif final in ("cudaIpcGetMemHandle", "cudaIpcOpenMemHandle"):
            self.add(node, f"cudart.{final}", IPC, "raises", EVIDENCE["cudart"])
