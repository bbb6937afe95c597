"""Which sglang modules an XPU server imports: the import graph from its entry points.

Rules (each has a test in test/unit/test_audit_reach.py):
- the roots are the server's entry points (ROOTS) and every module of the packages
  a server loads by name at run time (ROOT_PACKAGES: the model registry imports the
  module of whichever architecture a user serves);
- an import is an edge whether it is at module level or inside a function (a
  function's import runs when the function does, and we do not know that it
  doesn't), unless a condition that is False on XPU guards it;
- importing `a.b.c` imports the packages `a` and `a.b` too;
- a string naming an sglang module (a lazy registry, `importlib.import_module`)
  is an edge to it.
- a module that imports a CUDA-only package at its top (`unimportable`) cannot
  be imported on XPU: that import is its one finding, the rest are `unreached`,
  and XPU does not follow its imports; nor can a module that imports such a
  module at its top, unguarded and untried, or whose package is one
  (`blocked_modules`; the model registry skips a model that fails to import);
- a module of another device (a path component names it: `npu`, `hip`, `rocm`,
  `amd`, `musa`, `mps`, `mindspore`, or is exactly `cuda`/`nvidia`) is only used
  when that device is: XPU does not follow its imports, and its findings are
  `guarded` (`device_module`).
A module no edge reaches is never imported by an XPU server: its findings are
`unreached`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import cache

from xpu_series.audit.scan import FileScan

ROOTS = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
)
ROOT_PACKAGES = ("sglang.srt.models",)
_DEVICES = (
    "npu", "hip", "rocm", "amd", "musa", "mps", "mindspore", "ascend", "hpu", "habana"
)  # fmt: skip
_EXACT = ("cuda", "nvidia")
_GFX = re.compile(r"(^|_)gfx\d+")


@cache
def device_module(module: str) -> str:
    """The other device a module's path names, or "".

    >>> device_module("sglang.srt.hardware_backend.npu.utils")
    'npu'
    >>> device_module("sglang.srt.model_executor.cuda_graph_runner")
    ''
    """
    for part in module.split(".")[1:]:
        if part in _EXACT:
            return part
        if part == "hipcc" or _GFX.search(part):
            return "hip"  # AMD's compiler and its GPU generations (gfx950, ...)
        for device in _DEVICES:
            if part == device or part.startswith(f"{device}_"):
                return device
            if part.endswith(f"_{device}"):
                return device
    return ""


def unimportable(scan: FileScan) -> str:
    """The CUDA-only package a module imports at its top, unconditionally, or "":
    on XPU importing the module fails there, so nothing after it runs."""
    return scan.blocks


def blocked_modules(scans: Mapping[str, FileScan]) -> dict[str, str]:
    """Modules XPU cannot import, by name, with why: their own top-level import of
    a CUDA-only package, or a top-level, unguarded, untried import of (or a parent
    package that is) such a module. sglang's model registry skips a model module
    whose import fails, so its code never runs on XPU."""
    modules = {scan.module: scan for scan in scans.values()}
    blocked = {
        m: f"imports {pkg}" for m, s in modules.items() if (pkg := unimportable(s))
    }
    changed = True
    while changed:
        changed = False
        for module, scan in modules.items():
            if module in blocked:
                continue
            why = next(
                (
                    f"its package {p} {blocked[p]}"
                    for p in _parents(module)
                    if p in blocked
                ),
                "",
            )
            for edge in scan.imports:
                if why or not edge.certain:
                    continue
                hit = next((t for t in edge.targets if t in blocked), None)
                if hit:
                    root = blocked[hit].rsplit("imports ", 1)[-1]
                    why = f"imports {hit}, which imports {root}"
            if why:
                blocked[module] = why
                changed = True
    return blocked


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def reached_modules(
    scans: Mapping[str, FileScan],
    roots: Iterable[str] = ROOTS,
    root_packages: Iterable[str] = ROOT_PACKAGES,
    blocked: Mapping[str, str] | None = None,
) -> set[str]:
    """The modules (by name) an XPU server can import, from `scans` by path
    (`blocked`: blocked_modules(scans), when the caller has it already)."""
    modules = {scan.module: scan for scan in scans.values()}
    if blocked is None:
        blocked = blocked_modules(scans)
    packages = tuple(f"{p}." for p in root_packages)
    todo = [m for m in roots if m in modules]
    todo += [m for m in modules if m.startswith(packages)]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(p for p in _parents(module) if p in modules)
        if device_module(module) or module in blocked:
            # Another device's module: its imports are that device's. A module
            # that imports a CUDA-only package stops there on XPU.
            continue
        for edge in modules[module].imports:
            if edge.guarded:
                continue
            todo.extend(t for t in edge.targets if t in modules and t not in seen)
    return seen
