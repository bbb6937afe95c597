"""What each CUDA-only API does on an XPU build of torch: the audit's effect table.

Every torch.cuda name that sglang 0.5.19 to 0.5.23 references has a row, measured by
scripts/measure_cuda_effects.py in two builds: `here` (this machine's torch, a CUDA
build with no driver) and `xpu` (the same torch with its CUDA bindings hidden, which is
what an XPU build lacks, and torch.xpu reporting one device). A row's basis is
- "measured" when both builds behave alike (same outcome, or both raise): the XPU
  build's outcome was seen here;
- "torch source (XPU build)" when they differ (for example `torch.cuda.Event()`
  constructs here but is a `_dummy_type` stub on an XPU build): torch's no-CUDA branch
  decides, and the simulation checks that reading.
`scripts/measure_cuda_effects.py --check` re-measures both and fails on any change.

effect_of() answers for any string the scanner emits; names without a row follow the
default rules documented on it. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Effect(StrEnum):
    """What a CUDA-only API does when an XPU server runs it."""

    RAISES = "raises"  # an exception (lazy init, a stub class, NameError, ImportError)
    SILENT_ZERO = "silent-zero"  # returns 0 / {} / [] / False whatever the XPU holds
    NO_OP = "no-op"  # returns and does nothing (empty_cache, seeding)
    WRONG_DEVICE = "wrong-device"  # names CUDA where the XPU device is meant
    SKIPS_XPU = "skips-xpu"  # a CUDA test that is False for an XPU tensor
    HARMLESS = "harmless"  # behaves on XPU too (is_available() -> False, a module)
    # The kinds beyond the CUDA calls (each finding carries its own evidence).
    WRONG_RESULT = "wrong-result"  # runs and answers wrongly (xccl's integer MIN)
    FEATURE_OFF = "feature-off"  # what the user asked for is silently not done


class Basis(StrEnum):
    """Where a row's effect comes from."""

    MEASURED = "measured"
    TORCH_SOURCE = "torch source (XPU build)"
    XPU_IMAGE = "XPU image"  # what the XPU image installs (pyproject_xpu.toml)
    DEFAULT = "default rule"  # no row: see effect_of


@dataclass(frozen=True)
class ApiEffect:
    """An API's effect on XPU, in one line, with the device-agnostic idiom."""

    api: str  # e.g. "torch.cuda.memory_reserved"
    effect: Effect
    what: str  # what happens on an XPU build, "measured: ..." or "torch source ..."
    replacement: str  # the device-agnostic idiom, or ""


@dataclass(frozen=True)
class Evidence:
    """A row's probe outcomes, as scripts/measure_cuda_effects.py signs them."""

    api: str
    basis: Basis
    here: str  # on this machine's torch, e.g. "raises RuntimeError"; "" if unprobed
    xpu: str  # on the simulated XPU build

    @property
    def probed(self) -> bool:
        return bool(self.here)


@dataclass(frozen=True)
class PackageNote:
    """Why a top-level package cannot be imported on an XPU image."""

    dist: str  # the distribution that provides it
    note: str


# --- probe signatures shared by many rows ---------------------------------------------

_NO_DRIVER = "raises RuntimeError"  # here: lazy init finds no NVIDIA driver
_NOT_COMPILED = "raises AssertionError"  # XPU: "Torch not compiled with CUDA enabled"
_NO_BINDING = "raises AttributeError"  # XPU: the torch._C._cuda_* binding is absent
_DRIVER_TOO_OLD = (
    "raises AcceleratorError"  # here: "CUDA driver version is insufficient"
)
_STUB = "raises RuntimeError"  # XPU: "Tried to instantiate dummy base class ..."
_LAZY = "torch.cuda._lazy_init: 'Torch not compiled with CUDA enabled'"
_MODULE = "returns 'module'"

_R, _Z, _N, _H = Effect.RAISES, Effect.SILENT_ZERO, Effect.NO_OP, Effect.HARMLESS
_X = "torch.xpu."
_DM = "torch.get_device_module(device)."

# api, effect, here, xpu, note, replacement. A replacement "torch.xpu.X" exists on
# torch.xpu; "sglang: f()" is a helper in sglang/srt (test_cuda_effects checks both).
# fmt: off
_ROWS: tuple[tuple[str, Effect, str, str, str, str], ...] = (
    # Functions that initialise CUDA first (torch.cuda._lazy_init).
    *((f"torch.cuda.{name}", _R, _NO_DRIVER, _NOT_COMPILED, _LAZY, repl)
      for name, repl in (
        ("_lazy_init", f"{_X}_lazy_init / {_X}init"),
        ("init", f"{_X}init"),
        ("can_device_access_peer", f"{_X}can_device_access_peer"),
        ("cudart", ""),
        ("current_blas_handle", ""),
        ("current_device", f"{_X}current_device / {_DM}current_device"
         " / torch.accelerator.current_device_index"),
        ("current_stream", f"{_X}current_stream / {_DM}current_stream"
         " / torch.accelerator.current_stream"
         " / sglang: get_current_device_stream_fast()"),
        ("default_stream", f"{_DM}current_stream (torch.xpu has no default_stream)"),
        ("get_device_capability", f"{_X}get_device_capability (a dict) / sglang:"
         " get_device_capability() or current_platform.get_device_capability()"),
        ("get_device_name", f"{_X}get_device_name / sglang: get_device_name()"
         " or current_platform.get_device_name()"),
        ("get_device_properties", f"{_X}get_device_properties / {_DM}"
         "get_device_properties (gpu_eu_count, not multi_processor_count)"),
        ("get_rng_state", f"{_X}get_rng_state / {_DM}get_rng_state"),
        ("initial_seed", f"{_X}initial_seed"),
        ("get_sync_debug_mode", ""),
        ("set_sync_debug_mode", ""),
        ("ipc_collect", ""),
        ("mem_get_info", f"{_X}mem_get_info / torch.accelerator.get_memory_info"
         " / sglang: get_available_gpu_memory(device, gpu_id)"),
        ("set_per_process_memory_fraction", f"{_X}set_per_process_memory_fraction"),
        ("get_per_process_memory_fraction", f"{_X}get_per_process_memory_fraction"),
        ("synchronize", f"{_X}synchronize / torch.accelerator.synchronize"
         " / sglang: current_platform.synchronize()"),
    )),
    # Functions that call a torch._C._cuda_* binding an XPU build does not have.
    *((f"torch.cuda.{name}", _R, here, _NO_BINDING, f"torch._C.{binding} is absent",
       repl) for name, here, binding, repl in (
        ("_sleep", _DRIVER_TOO_OLD, "_cuda_sleep", f"{_X}_sleep"),
        ("set_device", _NO_DRIVER, "_cuda_setDevice", f"{_X}set_device"
         " / torch.accelerator.set_device_index"
         " / sglang: current_platform.set_device()"),
        ("set_stream", _NO_DRIVER, "_cuda_setStream", f"{_X}set_stream"
         " / torch.accelerator.set_stream"),
        ("reset_peak_memory_stats", _NO_DRIVER, "_cuda_resetPeakMemoryStats",
         f"{_X}reset_peak_memory_stats / torch.accelerator.reset_peak_memory_stats"),
        ("reset_max_memory_allocated", _NO_DRIVER, "_cuda_resetPeakMemoryStats",
         f"{_X}reset_peak_memory_stats"),
        ("reset_accumulated_memory_stats", _NO_DRIVER,
         "_cuda_resetAccumulatedMemoryStats", f"{_X}reset_accumulated_memory_stats"
         " / torch.accelerator.reset_accumulated_memory_stats"),
        ("memory._record_memory_history", _NO_DRIVER, "_cuda_record_memory_history",
         f"{_X}memory._record_memory_history"),
    )),
    # Classes that are _dummy_type stubs on an XPU build, and what builds on them.
    ("torch.cuda.Stream", _R, _DRIVER_TOO_OLD, _STUB,
     "Stream.__new__: 'torch.cuda.Stream requires CUDA support'",
     f"{_X}Stream / {_DM}Stream / torch.Stream(device=...)"),
    ("torch.cuda.Stream.wait_stream", _R, _DRIVER_TOO_OLD, _STUB,
     "no torch.cuda.Stream can be built", f"{_X}Stream.wait_stream"),
    ("torch.cuda.Event", _R, "returns Event", _STUB,
     "_CudaEventBase is a _dummy_type stub; a CUDA build's Event fails on record()",
     f"{_X}Event / {_DM}Event / torch.Event(device=...)"),
    ("torch.cuda.Event.record", _R, _NO_DRIVER, _STUB,
     "no torch.cuda.Event can be built", f"{_X}Event.record"),
    ("torch.cuda.Event.wait", _R, _NO_DRIVER, _STUB,
     "no torch.cuda.Event can be built", f"{_X}Event.wait"),
    ("torch.cuda.CUDAGraph", _R, _DRIVER_TOO_OLD, _STUB,
     "_CUDAGraph is a _dummy_type stub", f"{_X}XPUGraph / torch.accelerator.Graph"),
    ("torch.cuda.CUDAGraph.capture_end", _R, _DRIVER_TOO_OLD, _STUB,
     "no CUDAGraph can be built", f"{_X}XPUGraph.capture_end"),
    ("torch.cuda.graph", _R, _DRIVER_TOO_OLD, _STUB,
     "graph() builds a torch.cuda.Stream for its capture stream",
     f"{_X}graph / {_DM}graph"),
    ("torch.cuda.make_graphed_callables", _R, _DRIVER_TOO_OLD, _STUB,
     "builds a CUDAGraph", f"{_X}make_graphed_callables"),
    ("torch.cuda.is_current_stream_capturing", _R, _DRIVER_TOO_OLD, _STUB,
     "_cuda_isCurrentStreamCapturing is a _dummy_type stub: calling it raises",
     f"{_X}is_current_stream_capturing / {_DM}is_current_stream_capturing"),
    ("torch.cuda.graph_pool_handle", _R, "returns tuple", _STUB,
     "_graph_pool_handle is a _dummy_type stub", f"{_X}graph_pool_handle"),
    ("torch.cuda.MemPool", _R, _NO_DRIVER, _STUB, "_MemPool is a _dummy_type stub",
     f"{_X}MemPool / {_DM}MemPool"),
    ("torch.cuda.use_mem_pool", _R, _NO_DRIVER, _STUB, "needs a torch.cuda.MemPool",
     f"{_X}use_mem_pool"),
    ("torch.cuda.ExternalStream", _R, _NO_DRIVER, "raises RuntimeError",
     "torch.cuda.device(): 'PyTorch was compiled without CUDA support'",
     f"{_X}get_stream_from_external"),
    ("torch.cuda.CUDAPluggableAllocator", _R, "returns CUDAPluggableAllocator",
     _NO_BINDING, "torch._C._cuda_customAllocator is absent",
     f"{_X}memory.XPUPluggableAllocator"),
    # Context managers: a no-op here (no device at all), a raise on an XPU machine.
    ("torch.cuda.device", _R, _NO_DRIVER, "raises RuntimeError",
     "_exchange_device: 'PyTorch was compiled without CUDA support' for any index >= 0",
     f"{_X}device / {_DM}device / sglang: device_context(device)"),
    ("torch.cuda.stream", _R, "completes", _NOT_COMPILED,
     "StreamContext takes the XPU's current index, then torch.cuda.current_stream()"
     " initialises CUDA; a no-op only where no accelerator exists",
     f"{_X}stream / {_DM}stream"),
    ("torch.cuda.StreamContext", _R, "completes", _NOT_COMPILED,
     "as torch.cuda.stream", f"{_X}StreamContext / {_DM}stream"),
    # Snapshots and NVTX: work here, absent bindings on an XPU build.
    ("torch.cuda.memory_snapshot", _R, "returns []", _NO_BINDING,
     "torch._C._cuda_memorySnapshot is absent", f"{_X}memory_snapshot"),
    ("torch.cuda.memory._dump_snapshot", _R, "completes", _NO_BINDING,
     "torch._C._cuda_memorySnapshot is absent", f"{_X}memory._dump_snapshot"),
    *((f"torch.cuda.nvtx.{name}", _R, here, "raises RuntimeError",
       "torch._C._nvtx is absent: 'NVTX functions not installed'",
       "torch.profiler.record_function") for name, here in (
        ("range", "completes"),
        ("range_push", "returns -2"),
        ("range_pop", "returns -2"),
    )),
    # Need NVML (pynvml), which the XPU image lacks.
    ("torch.cuda.device_memory_used", _R, "raises ModuleNotFoundError",
     "raises ModuleNotFoundError", "imports pynvml (nvidia-ml-py)",
     f"{_X}device_memory_used"),
    ("torch.cuda.utilization", _R, "raises ModuleNotFoundError",
     "raises ModuleNotFoundError", "imports pynvml (nvidia-ml-py)", f"{_X}utilization"),
    ("torch.cuda.memory_summary", _R, "raises KeyError", "raises KeyError",
     "memory_stats() is empty: KeyError 'allocated_bytes.all.current'",
     f"{_X}memory_stats"),
    # Allocator counters: torch.cuda's allocator never initialised, so they read zero.
    *((f"torch.cuda.{name}", _Z, value, value,
       "the CUDA allocator was never initialised, whatever the XPU holds", repl)
      for name, value, repl in (
        ("memory_reserved", "returns 0", f"{_X}memory_reserved"
         " / torch.get_device_module().memory_reserved"
         " / sglang: device_memory_reserved()"),
        ("memory_allocated", "returns 0", f"{_X}memory_allocated"
         " / torch.accelerator.memory_allocated"),
        ("max_memory_allocated", "returns 0", f"{_X}max_memory_allocated"
         " / torch.accelerator.max_memory_allocated"),
        ("max_memory_reserved", "returns 0", f"{_X}max_memory_reserved"
         " / torch.accelerator.max_memory_reserved"),
        ("memory_stats", "returns OrderedDict()", f"{_X}memory_stats"
         " / torch.accelerator.memory_stats"),
    )),
    ("torch.cuda.is_bf16_supported", _Z, "returns False", "returns False",
     "'CUDA is not available' answers False, so callers pick fp16 on a bf16 XPU",
     f"{_X}is_bf16_supported"),
    ("torch.cuda.get_arch_list", _Z, "returns list", "returns []",
     "no CUDA archs compiled in", f"{_X}get_arch_list"),
    ("torch.cuda.get_rng_state_all", _Z, "returns []", "returns []",
     "device_count() is 0, so no states", f"{_X}get_rng_state_all"),
    # Queued for a CUDA init that never comes, or a cache that holds nothing.
    ("torch.cuda.empty_cache", _N, "returns None", "returns None",
     "frees nothing: the CUDA allocator was never initialised; the XPU cache stays",
     f"{_X}empty_cache / {_DM}empty_cache / torch.accelerator.empty_cache"
     " / sglang: empty_device_cache() or current_platform.empty_cache()"),
    *((f"torch.cuda.{name}", _N, "returns None", "returns None",
       "queued by _lazy_call for a CUDA init that never comes: the XPU RNG stays",
       repl) for name, repl in (
        ("manual_seed", f"torch.manual_seed (seeds every device) / {_X}manual_seed"),
        ("manual_seed_all", f"torch.manual_seed / {_X}manual_seed_all"),
        ("seed", f"{_X}seed"),
        ("set_rng_state", f"{_X}set_rng_state / {_DM}set_rng_state"),
        ("set_rng_state_all", f"{_X}set_rng_state_all"),
    )),
    ("torch.cuda.amp.autocast", _N, "completes", "completes",
     "torch.autocast('cuda') with CUDA unavailable: a deprecation warning, and an XPU"
     " autocast region is left as it was",
     "torch.autocast(device_type=device.type, ...) / torch.amp.autocast(device.type)"),
    # Behave on XPU too.
    ("torch.cuda.is_available", _H, "returns False", "returns False",
     "truthful: no CUDA", f"{_X}is_available / torch.accelerator.is_available"),
    ("torch.cuda.device_count", _H, "returns 0", "returns 0",
     "truthful: no CUDA device", f"{_X}device_count / torch.accelerator.device_count"
     " / sglang: get_device_count()"),
    ("torch.cuda.is_initialized", _H, "returns False", "returns False",
     "truthful: CUDA is never initialised", f"{_X}is_initialized"),
    ("torch.cuda.OutOfMemoryError", _H, "returns True", "returns True",
     "the same class as torch.OutOfMemoryError, which the XPU allocator raises too",
     "torch.OutOfMemoryError"),
    ("torch.cuda._get_nvml_device_index", _H, "returns 0", "returns 0",
     "parses CUDA_VISIBLE_DEVICES only; its one use feeds NVML, which fails apart", ""),
    ("torch.cuda.sparse", _H, "returns 'FloatTensor'", "returns 'FloatTensor'",
     "legacy tensor type names: naming them touches no device", ""),
    *((f"torch.cuda.{name}", _H, _MODULE, _MODULE,
       "a module: each function in it has its own row", repl) for name, repl in (
        ("amp", "torch.amp"), ("memory", f"{_X}memory"), ("nvtx", "torch.profiler"),
        ("graphs", f"{_X}graphs"), ("streams", f"{_X}streams"),
        ("random", f"{_X}random"),
    )),
    # The other kinds of finding.
    ("Tensor.cuda", _R, _NO_DRIVER, _NOT_COMPILED, f"x.cuda() -> {_LAZY}",
     "tensor.to(device) with the server's device (sglang: get_device())"),
    ("device:cuda", Effect.WRONG_DEVICE, _NO_DRIVER, _NOT_COMPILED,
     "names CUDA where the XPU is meant: torch.zeros(1, device='cuda') raises"
     f" ({_LAZY}), and a comparison with it is False on XPU",
     "the server's device: self.device / server_args.device / sglang: get_device()"),
    ("Tensor.is_cuda", Effect.SKIPS_XPU, "returns False", "returns False",
     "False for an XPU tensor (checked on a CPU tensor), so an XPU tensor takes the"
     " CPU branch", "not tensor.is_cpu / tensor.device.type == device.type"),
    ("guarded-import:*", _R, "raises NameError", "raises NameError",
     "the name is bound only when the CUDA/ROCm guard holds; its first use on XPU"
     " raises NameError",
     "import under a guard that covers every use, or the XPU twin (sgl-kernel-xpu)"),
)
# fmt: on

# Packages the CUDA wheel requires (its Requires-Dist) that the XPU image does not
# install: python/pyproject_xpu.toml lists sglang-kernel-xpu (module `sgl_kernel`) and
# none of these. So `sgl_kernel` is not here: the XPU image has one.
PACKAGE_NOTES: Mapping[str, PackageNote] = {
    "flashinfer": PackageNote(
        "flashinfer-python", "CUDA JIT kernels; XPU CI uninstalls flashinfer-python"
    ),
    "deep_gemm": PackageNote("sgl-deep-gemm", "NVIDIA FP8 GEMM kernels"),
    "deep_ep": PackageNote("sgl-deep-ep", "NVSHMEM expert-parallel all-to-all"),
    "flash_mla": PackageNote(
        "sgl-flash-mla", "NVIDIA MLA kernels (XPU has sgl_kernel.flash_mla_* instead)"
    ),
    "pynvml": PackageNote("nvidia-ml-py", "NVIDIA's management library bindings"),
    "cuda": PackageNote(
        "cuda-python", "CUDA driver/runtime bindings (here only as CUDA torch's dep)"
    ),
    "nvshmem": PackageNote("nvshmem4py-cu13", "NVSHMEM bindings, CUDA 13 build"),
    "cutlass": PackageNote("nvidia-cutlass-dsl", "NVIDIA's CuTe DSL"),
    "flash_attn": PackageNote("flash-attn-4", "FlashAttention 4, a CuTe DSL package"),
    "quack": PackageNote("quack-kernels", "CuTe DSL kernels"),
    "humming": PackageNote("humming-kernels", "its CUDA 13 build ([cu13])"),
    "tilelang": PackageNote("tilelang", "the PyPI wheel targets CUDA"),
    "tvm_ffi": PackageNote(
        "apache-tvm-ffi",
        "the JIT kernels' FFI; not in pyproject_xpu.toml, and srt/layers/"
        "dp_attention.py:43 says it is absent on XPU",
    ),
}
CUDA_ONLY_PACKAGES: frozenset[str] = frozenset(PACKAGE_NOTES)

# Import names of torch.cuda submodules whose functions torch.cuda re-exports: the
# scanner sees `from torch.cuda.graphs import CUDAGraph` as torch.cuda.graphs.CUDAGraph.
SUBMODULES = ("memory", "streams", "graphs", "random")
# Classes: a member (torch.cuda.Event.query) shares the class's effect.
_CLASSES = frozenset(
    f"torch.cuda.{name}"
    for name in (
        "Stream", "Event", "CUDAGraph", "MemPool", "ExternalStream",
        "CUDAPluggableAllocator", "StreamContext", "OutOfMemoryError",
    )
)  # fmt: skip


def _basis(here: str, xpu: str) -> Basis:
    both_raise = here.startswith("raises") and xpu.startswith("raises")
    return Basis.MEASURED if here == xpu or both_raise else Basis.TORCH_SOURCE


def _what(basis: Basis, here: str, xpu: str, note: str) -> str:
    if basis is Basis.TORCH_SOURCE:
        return f"{basis}: {xpu} (here it {here}); {note}"
    if here == xpu:
        return f"{basis}: {xpu}; {note}"
    return f"{basis}: {xpu} on an XPU build (here {here.split()[-1]}); {note}"


def _table() -> tuple[dict[str, ApiEffect], dict[str, Evidence]]:
    effects: dict[str, ApiEffect] = {}
    evidence: dict[str, Evidence] = {}
    for api, effect, here, xpu, note, replacement in _ROWS:
        if api in effects:
            raise ValueError(f"{api}: two rows in the effect table")
        basis = _basis(here, xpu)
        effects[api] = ApiEffect(
            api, effect, _what(basis, here, xpu, note), replacement
        )
        evidence[api] = Evidence(api, basis, here, xpu)
    return effects, evidence


EFFECTS, EVIDENCE = _table()


def _package_effect(api: str, package: str) -> ApiEffect:
    top = package.split(".")[0]
    note = PACKAGE_NOTES.get(top)
    if note is None:
        return ApiEffect(
            api, Effect.HARMLESS, f"{top} is not in CUDA_ONLY_PACKAGES", ""
        )
    return ApiEffect(
        api,
        Effect.RAISES,
        f"{Basis.XPU_IMAGE}: {note.dist} is not installed ({note.note}); "
        "importing it raises ModuleNotFoundError",
        "import it lazily inside the CUDA branch, or under is_cuda() "
        "(sglang: get_platform().is_cuda)",
    )


def _default(api: str) -> ApiEffect:
    return ApiEffect(
        api,
        Effect.RAISES,
        f"{Basis.DEFAULT} (not measured): most of torch.cuda initialises CUDA, which "
        "an XPU build lacks; measure it in scripts/measure_cuda_effects.py",
        "",
    )


def explicit_row(api: str) -> ApiEffect | None:
    """The table's row for a torch.cuda name, through submodule re-exports; or None."""
    if api in EFFECTS:
        return EFFECTS[api]
    parts = api.split(".")
    if len(parts) > 3 and parts[:2] == ["torch", "cuda"] and parts[2] in SUBMODULES:
        exported = ".".join(["torch", "cuda", *parts[3:]])
        if exported in EFFECTS:
            return EFFECTS[exported]
    return None


def effect_of(api: str) -> ApiEffect:
    """The effect on XPU of any API string the audit scanner emits.

    Kinds: "torch.cuda.<dotted>", "Tensor.cuda", "Tensor.is_cuda", "device:cuda[:N]",
    "guarded-import:<name>", "import:<package>[.sub]". For a torch.cuda name without a
    row, in order: a submodule path re-exported by torch.cuda takes that row
    (torch.cuda.graphs.CUDAGraph); a member of a class row takes the class's effect
    (torch.cuda.Event.query); a bare "torch.cuda" is harmless; anything else raises by
    the default rule, since most of torch.cuda initialises CUDA first. A package not
    in CUDA_ONLY_PACKAGES is harmless. Any other string is a scanner bug: ValueError.
    """
    if api.startswith("import:"):
        return _package_effect(api, api.removeprefix("import:"))
    if api.startswith("guarded-import:"):
        row = EFFECTS["guarded-import:*"]
        name = api.removeprefix("guarded-import:")
        return ApiEffect(api, row.effect, f"{name}: {row.what}", row.replacement)
    if api == "device:cuda" or api.startswith("device:cuda:"):
        return _renamed(EFFECTS["device:cuda"], api)
    if api in ("Tensor.cuda", "Tensor.is_cuda"):
        return EFFECTS[api]
    if api == "torch.cuda":
        return ApiEffect(api, Effect.HARMLESS, "the torch.cuda module itself", "")
    if not api.startswith("torch.cuda."):
        raise ValueError(
            f"effect_of: {api!r} is not an API kind the audit knows; hint: the scanner "
            "emits torch.cuda.*, Tensor.cuda, Tensor.is_cuda, device:cuda, "
            "guarded-import:<name> or import:<package>"
        )
    row = explicit_row(api)
    if row is not None:
        return _renamed(row, api)
    parts = api.split(".")
    for end in range(len(parts) - 1, 2, -1):
        owner = ".".join(parts[:end])
        if owner in _CLASSES:
            row = EFFECTS[owner]
            return ApiEffect(
                api, row.effect, f"as {owner}: {row.what}", row.replacement
            )
    return _default(api)


def _renamed(row: ApiEffect, api: str) -> ApiEffect:
    if row.api == api:
        return row
    return ApiEffect(api, row.effect, row.what, row.replacement)
