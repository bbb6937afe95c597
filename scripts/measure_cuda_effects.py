"""Measure what each torch.cuda API does on a torch without CUDA: the effect table.

Every probe in PROBES runs twice, each in a fork of a worker that imported torch once:
- `here`: this machine's torch as installed (a CUDA build with no driver);
- `xpu`: the same torch made to look like an XPU build. Before torch imports, the
  bindings only a CUDA build compiles (torch/csrc/cuda: `torch._C._cuda*`, `_Cuda*`,
  `_CUDA*`, `_nccl*`, `_gds_*`, `_MemPool`, `_graph_pool_handle`, the comm helpers and
  the `_cudart`, `_nvtx`, `_cudnn`, `_cusparselt` submodules) are removed from torch._C,
  `torch._C._has_cuda` is False and `torch.version.cuda` is None, so torch's own Python
  takes its no-CUDA branches (`_dummy_type` stubs, `_lazy_init`'s "not compiled" error).
  torch.xpu then reports one device (is_available, device_count, current_device): code
  that asks for "the available accelerator" sees an XPU machine, not a bare host.

    .venv/bin/python scripts/measure_cuda_effects.py          # the table, measured
    .venv/bin/python scripts/measure_cuda_effects.py --check  # exit 1 if it disagrees
    .venv/bin/python scripts/measure_cuda_effects.py --json

`--check` compares both outcomes of every probed entry with the committed table in
xpu_series.audit.effects (its `here` and `xpu` signatures); an entry classified from
torch's source is thereby checked against the simulated XPU build.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from xpu_series.audit.effects import EVIDENCE, effect_of  # noqa: E402

PROBE_TIMEOUT = 20.0  # seconds one probe may take in its fork
MODES = ("here", "xpu")

# api -> code run after `import torch`. An expression's value is the outcome; a
# statement block's outcome is "completes". Arguments are the ones sglang passes.
PROBES: dict[str, str] = {
    "torch.cuda.CUDAGraph": "torch.cuda.CUDAGraph()",
    "torch.cuda.CUDAGraph.capture_end": "torch.cuda.CUDAGraph().capture_end()",
    "torch.cuda.Event": "torch.cuda.Event(enable_timing=True)",
    "torch.cuda.Event.record": "torch.cuda.Event().record()",
    "torch.cuda.Event.wait": "torch.cuda.Event().wait()",
    "torch.cuda.MemPool": "torch.cuda.MemPool()",
    "torch.cuda.OutOfMemoryError": (
        "torch.cuda.OutOfMemoryError is torch.OutOfMemoryError"
    ),
    "torch.cuda.Stream": "torch.cuda.Stream()",
    "torch.cuda.Stream.wait_stream": "torch.cuda.Stream().wait_stream(None)",
    "torch.cuda.StreamContext": (
        "with torch.cuda.StreamContext(torch.Stream(device='cpu')):\n    pass"
    ),
    "torch.cuda._get_nvml_device_index": "torch.cuda._get_nvml_device_index(0)",
    "torch.cuda._lazy_init": "torch.cuda._lazy_init()",
    "torch.cuda._sleep": "torch.cuda._sleep(100)",
    "torch.cuda.amp": "type(torch.cuda.amp).__name__",
    "torch.cuda.amp.autocast": (
        "with torch.cuda.amp.autocast(enabled=False):\n    pass"
    ),
    "torch.cuda.can_device_access_peer": "torch.cuda.can_device_access_peer(0, 1)",
    "torch.cuda.cudart": "torch.cuda.cudart()",
    "torch.cuda.current_blas_handle": "torch.cuda.current_blas_handle()",
    "torch.cuda.current_device": "torch.cuda.current_device()",
    "torch.cuda.current_stream": "torch.cuda.current_stream()",
    "torch.cuda.default_stream": "torch.cuda.default_stream()",
    "torch.cuda.device": "with torch.cuda.device(0):\n    pass",
    "torch.cuda.device_count": "torch.cuda.device_count()",
    "torch.cuda.device_memory_used": "torch.cuda.device_memory_used(0)",
    "torch.cuda.empty_cache": "torch.cuda.empty_cache()",
    "torch.cuda.get_device_capability": "torch.cuda.get_device_capability()",
    "torch.cuda.get_device_name": "torch.cuda.get_device_name(0)",
    "torch.cuda.get_device_properties": "torch.cuda.get_device_properties(0)",
    "torch.cuda.get_rng_state": "torch.cuda.get_rng_state()",
    "torch.cuda.get_sync_debug_mode": "torch.cuda.get_sync_debug_mode()",
    "torch.cuda.graph": "torch.cuda.graph(None)",
    "torch.cuda.graph_pool_handle": "torch.cuda.graph_pool_handle()",
    "torch.cuda.ipc_collect": "torch.cuda.ipc_collect()",
    "torch.cuda.is_available": "torch.cuda.is_available()",
    "torch.cuda.is_bf16_supported": "torch.cuda.is_bf16_supported()",
    "torch.cuda.is_current_stream_capturing": (
        "torch.cuda.is_current_stream_capturing()"
    ),
    "torch.cuda.is_initialized": "torch.cuda.is_initialized()",
    "torch.cuda.make_graphed_callables": (
        "torch.cuda.make_graphed_callables(torch.nn.Linear(1, 1), (torch.zeros(1, 1),))"
    ),
    "torch.cuda.manual_seed": "torch.cuda.manual_seed(0)",
    "torch.cuda.manual_seed_all": "torch.cuda.manual_seed_all(0)",
    "torch.cuda.max_memory_allocated": "torch.cuda.max_memory_allocated()",
    "torch.cuda.mem_get_info": "torch.cuda.mem_get_info()",
    "torch.cuda.memory": "type(torch.cuda.memory).__name__",
    "torch.cuda.CUDAPluggableAllocator": (
        "torch.cuda.memory.CUDAPluggableAllocator('libc.so.6', 'malloc', 'free')"
    ),
    "torch.cuda.memory._dump_snapshot": (
        "import tempfile\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    torch.cuda.memory._dump_snapshot(d + '/snapshot.pickle')"
    ),
    "torch.cuda.memory._record_memory_history": (
        "torch.cuda.memory._record_memory_history(max_entries=1000)"
    ),
    "torch.cuda.memory_allocated": "torch.cuda.memory_allocated()",
    "torch.cuda.memory_reserved": "torch.cuda.memory_reserved()",
    "torch.cuda.memory_snapshot": "torch.cuda.memory_snapshot()",
    "torch.cuda.memory_stats": "torch.cuda.memory_stats()",
    "torch.cuda.nvtx": "type(torch.cuda.nvtx).__name__",
    "torch.cuda.nvtx.range": "with torch.cuda.nvtx.range('probe'):\n    pass",
    "torch.cuda.nvtx.range_pop": "torch.cuda.nvtx.range_pop()",
    "torch.cuda.nvtx.range_push": "torch.cuda.nvtx.range_push('probe')",
    "torch.cuda.reset_peak_memory_stats": "torch.cuda.reset_peak_memory_stats()",
    "torch.cuda.set_device": "torch.cuda.set_device(0)",
    "torch.cuda.set_per_process_memory_fraction": (
        "torch.cuda.set_per_process_memory_fraction(0.5)"
    ),
    "torch.cuda.set_rng_state": (
        "torch.cuda.set_rng_state(torch.zeros(16, dtype=torch.uint8))"
    ),
    "torch.cuda.set_stream": "torch.cuda.set_stream(torch.Stream(device='cpu'))",
    "torch.cuda.set_sync_debug_mode": "torch.cuda.set_sync_debug_mode(0)",
    "torch.cuda.sparse": "torch.cuda.sparse.FloatTensor.__name__",
    "torch.cuda.stream": (
        "with torch.cuda.stream(torch.Stream(device='cpu')):\n    pass"
    ),
    "torch.cuda.ExternalStream": "torch.cuda.streams.ExternalStream(0)",
    "torch.cuda.synchronize": "torch.cuda.synchronize()",
    "torch.cuda.use_mem_pool": (
        "with torch.cuda.use_mem_pool(torch.cuda.MemPool()):\n    pass"
    ),
    "torch.cuda.graphs": "type(torch.cuda.graphs).__name__",
    "torch.cuda.streams": "type(torch.cuda.streams).__name__",
    "torch.cuda.random": "type(torch.cuda.random).__name__",
    "torch.cuda.max_memory_reserved": "torch.cuda.max_memory_reserved()",
    "torch.cuda.reset_max_memory_allocated": "torch.cuda.reset_max_memory_allocated()",
    "torch.cuda.reset_accumulated_memory_stats": (
        "torch.cuda.reset_accumulated_memory_stats()"
    ),
    "torch.cuda.memory_summary": "torch.cuda.memory_summary()",
    "torch.cuda.get_arch_list": "torch.cuda.get_arch_list()",
    "torch.cuda.init": "torch.cuda.init()",
    "torch.cuda.utilization": "torch.cuda.utilization(0)",
    "torch.cuda.seed": "torch.cuda.seed()",
    "torch.cuda.initial_seed": "torch.cuda.initial_seed()",
    "torch.cuda.get_rng_state_all": "torch.cuda.get_rng_state_all()",
    "torch.cuda.set_rng_state_all": "torch.cuda.set_rng_state_all([])",
    "torch.cuda.get_per_process_memory_fraction": (
        "torch.cuda.get_per_process_memory_fraction()"
    ),
    "Tensor.cuda": "torch.zeros(1).cuda()",
    "Tensor.is_cuda": "torch.zeros(1).is_cuda",
    "device:cuda": "torch.zeros(1, device='cuda')",
    "guarded-import:*": (
        "if torch.cuda.is_available():\n"
        "    from os import sep as guarded_name\n"
        "guarded_name"
    ),
}


@dataclass(frozen=True)
class Outcome:
    """What one probe did: it returned, completed, raised, crashed or hung."""

    api: str
    mode: str
    signature: str  # "raises AssertionError", "returns 0", "completes", ...
    message: str  # the exception's first line, or the first warning, or ""


# --- the simulated XPU build ---------------------------------------------------------

_CUDA_PREFIXES = ("_cuda", "_Cuda", "_CUDA", "_nccl", "_gds_")
_CUDA_NAMES = frozenset(
    {"_MemPool", "_graph_pool_handle", "_cudart", "_nvtx", "_cudnn", "_cusparselt"}
    | {"_broadcast", "_broadcast_out", "_broadcast_coalesced"}
    | {"_scatter", "_scatter_out", "_gather", "_gather_out"}
)
# torch's own Python reads these unconditionally (torch/backends/cudnn), so every
# build defines them (torch/csrc/Module.cpp), an XPU build included.
_EVERY_BUILD = frozenset(
    {"_cuda_get_cudnn_benchmark_limit", "_cuda_set_cudnn_benchmark_limit"}
)


def _hide_cuda(module: ModuleType) -> None:
    for name in list(vars(module)):
        cuda_only = name.startswith(_CUDA_PREFIXES) or name in _CUDA_NAMES
        if cuda_only and name not in _EVERY_BUILD:
            delattr(module, name)
            sys.modules.pop(f"torch._C.{name}", None)  # the submodules' entries
    module._has_cuda = False
    module._has_cudnn = False
    module._has_cusparselt = False


class _XpuBuildFinder(importlib.abc.MetaPathFinder):
    """Loads torch._C and torch.version, then strips what only a CUDA build has."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in ("torch._C", "torch.version"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            if name == "torch._C":
                _hide_cuda(module)
            else:
                module.cuda = None  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _import_torch(mode: str) -> ModuleType:
    if mode == "xpu":
        sys.meta_path.insert(0, _XpuBuildFinder())
    import torch

    if mode == "xpu":
        # One XPU device, as far as Python-level device queries go.
        torch.xpu.is_available = lambda: True
        torch.xpu.device_count = lambda: 1
        torch.xpu.current_device = lambda: 0
    return torch


# --- one probe in a fork --------------------------------------------------------------


def _signature_of_value(value: object) -> str:
    if value is None or isinstance(value, bool | int | float):
        return f"returns {value!r}"
    if isinstance(value, str) and len(value) <= 40:
        return f"returns {value!r}"
    if isinstance(value, dict | list | tuple) and not value:
        return f"returns {value!r}"
    return f"returns {type(value).__name__}"


def _run_probe(torch: ModuleType, code: str) -> tuple[str, str]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        space = {"torch": torch}
        try:
            try:
                compiled = compile(code, "<probe>", "eval")
            except SyntaxError:
                exec(compile(code, "<probe>", "exec"), space)
                signature = "completes"
            else:
                signature = _signature_of_value(eval(compiled, space))
        except BaseException as exc:  # noqa: BLE001 - any outcome is the measurement
            lines = str(exc).strip().splitlines()
            return f"raises {type(exc).__name__}", lines[0] if lines else ""
    warned = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message)]
    return signature, (f"warns: {warned[0]}" if warned else "")


@dataclass
class _Running:
    """A probe's fork, and what it has written so far."""

    api: str
    pid: int
    fd: int
    deadline: float
    data: bytes = b""


def _start_probe(torch: ModuleType, api: str, code: str) -> _Running:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, leave without cleanup
        os.close(read_end)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            signature, message = _run_probe(torch, code)
            os.write(write_end, json.dumps([signature, message]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    return _Running(api, pid, read_end, time.monotonic() + PROBE_TIMEOUT)


def _finish(run: _Running, mode: str, hung: bool) -> Outcome:
    if hung:
        os.kill(run.pid, signal.SIGKILL)
    os.close(run.fd)
    _, status = os.waitpid(run.pid, 0)
    if hung:
        return Outcome(run.api, mode, "hangs", f"no answer in {PROBE_TIMEOUT:g} s")
    if not run.data:
        return Outcome(run.api, mode, f"crashes (status {status})", "")
    signature, message = json.loads(run.data)
    return Outcome(run.api, mode, signature, message[:200])


def probe_all(torch: ModuleType, mode: str, jobs: int = 4) -> dict[str, Outcome]:
    """Every probe in its own fork, `jobs` forks at a time."""
    waiting = list(PROBES.items())
    running: dict[int, _Running] = {}
    done: dict[str, Outcome] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            api, code = waiting.pop(0)
            run = _start_probe(torch, api, code)
            running[run.fd] = run
        now = time.monotonic()
        for run in [r for r in running.values() if r.deadline <= now]:
            del running[run.fd]
            done[run.api] = _finish(run, mode, hung=True)
        if not running:
            continue
        left = min(r.deadline for r in running.values()) - now
        for fd in select.select(list(running), [], [], max(left, 0))[0]:
            chunk = os.read(fd, 65536)
            if chunk:
                running[fd].data += chunk
            else:
                run = running.pop(fd)
                done[run.api] = _finish(run, mode, hung=False)
    return {api: done[api] for api in PROBES}


def run_worker(mode: str) -> int:
    """Import torch once for `mode`, probe every API in a fork, print JSON lines."""
    torch = _import_torch(mode)
    for outcome in probe_all(torch, mode).values():
        print(json.dumps(asdict(outcome)), flush=True)
    return 0


# --- the parent: both workers, then the comparison ------------------------------------


def measure(python: str) -> dict[str, dict[str, Outcome]]:
    """Outcome per mode and api, the two workers running side by side."""

    def one(mode: str) -> dict[str, Outcome]:
        done = subprocess.run(
            [python, str(Path(__file__).resolve()), "--worker", mode],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"the {mode} worker failed ({done.returncode}): "
                f"{done.stderr.strip()[-2000:]}\n"
                f"hint: run `{python} {__file__} --worker {mode}` to see it"
            )
        outcomes = [Outcome(**json.loads(line)) for line in done.stdout.splitlines()]
        return {o.api: o for o in outcomes}

    with ThreadPoolExecutor(max_workers=len(MODES)) as pool:
        return dict(zip(MODES, pool.map(one, MODES), strict=True))


def disagreements(measured: dict[str, dict[str, Outcome]]) -> list[str]:
    """Where the committed table says other than this measurement, one line each."""
    lines = []
    for api, evidence in EVIDENCE.items():
        if not evidence.probed:
            continue
        for mode, committed in (("here", evidence.here), ("xpu", evidence.xpu)):
            outcome = measured[mode].get(api)
            if outcome is None:
                lines.append(f"{api} ({mode}): not measured; hint: add it to PROBES")
            elif outcome.signature != committed:
                lines.append(
                    f"{api} ({mode}): table says '{committed}', measured "
                    f"'{outcome.signature}' {outcome.message}".rstrip()
                )
    for api in PROBES.keys() - EVIDENCE.keys():
        lines.append(f"{api}: probed but not in the table")
    return lines


def _rows(measured: dict[str, dict[str, Outcome]]) -> list[dict[str, str]]:
    rows = []
    for api in PROBES:
        here, xpu = measured["here"][api], measured["xpu"][api]
        effect = effect_of(api).effect if api in EVIDENCE else "?"
        rows.append(
            {
                "api": api,
                "effect": str(effect),
                "here": here.signature,
                "here_message": here.message,
                "xpu": xpu.signature,
                "xpu_message": xpu.message,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one object per API")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 where the table disagrees"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter whose torch to probe"
    )
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args.worker)
    started = time.monotonic()
    try:
        measured = measure(args.python)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    rows = _rows(measured)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['api']:45} {row['effect']:12} here: {row['here']}")
            print(f"{'':58} xpu:  {row['xpu']}  {row['xpu_message']}".rstrip())
    print(f"measured {len(rows)} probes x {len(MODES)} builds in {seconds:.1f} s",
          file=sys.stderr)  # fmt: skip
    if not args.check:
        return 0
    wrong = disagreements(measured)
    for line in wrong:
        print(f"disagrees: {line}", file=sys.stderr)
    if wrong:
        print(
            "hint: re-read torch/cuda for these APIs, then update the rows in "
            "python/xpu_series/audit/effects.py",
            file=sys.stderr,
        )
        return 1
    print(f"the table agrees with all {len(rows)} probes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
