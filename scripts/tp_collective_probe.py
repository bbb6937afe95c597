"""Isolate the tensor-parallel all-reduce from the server, in seconds.

Spawns N ranks on this host, each joins a process group and all-reduces a tensor
of ones. Every rank is reported PASS (right sum), ERROR (an exception) or HANG (no
answer before --timeout), with the transport environment it saw. Backend `xccl`
(or `ccl`) on Intel GPUs; `gloo` on CPU, which is how CI tests the probe.

    python scripts/tp_collective_probe.py --nproc 2            # on the XPU host
    FI_TCP_IFACE=lo python scripts/tp_collective_probe.py --nproc 2

If this passes and the server still hangs on its first request, the problem is
in the engine, not the collective: retry at a lower --tp.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
from dataclasses import dataclass

# Variables that decide which transport oneCCL/libfabric (or gloo) picks.
TRANSPORT_ENV = (
    "FI_TCP_IFACE", "FI_PROVIDER", "CCL_ATL_TRANSPORT", "CCL_ZE_IPC_EXCHANGE",
    "CCL_TOPO_P2P_ACCESS", "ZE_AFFINITY_MASK", "GLOO_SOCKET_IFNAME",
    "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


@dataclass(frozen=True)
class RankReport:
    rank: int
    verdict: str  # PASS | ERROR | HANG
    seconds: float
    detail: str
    env: dict[str, str]


def transport_env() -> dict[str, str]:
    return {k: os.environ[k] for k in TRANSPORT_ENV if k in os.environ}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int, world: int, backend: str, port: int, size: int, timeout: float,
    skip: int, results: mp.Queue,
) -> None:  # fmt: skip
    env = transport_env()
    if rank == skip:
        time.sleep(timeout * 10)  # simulates a rank that never joins
        return
    start = time.monotonic()
    try:
        import datetime

        import torch
        import torch.distributed as dist

        device = torch.device(f"xpu:{rank}") if backend in ("xccl", "ccl") else "cpu"
        if backend == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401 (registers "ccl")
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=world,
            rank=rank,
            timeout=datetime.timedelta(seconds=timeout * 4),
        )
        tensor = torch.ones(size, device=device)
        dist.all_reduce(tensor)
        if device != "cpu":
            torch.xpu.synchronize(device)
        got = float(tensor[0].item())
        dist.destroy_process_group()
        if got != world:
            verdict, detail = "ERROR", f"sum is {got}, expected {world}"
        else:
            verdict, detail = "PASS", f"all_reduce of {size} floats = {got:g}"
    except Exception as exc:  # report whatever the collective raised
        verdict, detail = "ERROR", f"{type(exc).__name__}: {exc}"
    results.put(RankReport(rank, verdict, time.monotonic() - start, detail, env))


def run_probe(
    nproc: int, backend: str, timeout: float, size: int = 1024, skip: int = -1
) -> list[RankReport]:
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(rank, nproc, backend, port, size, timeout, skip, results),
            daemon=True,
        )
        for rank in range(nproc)
    ]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    reports: dict[int, RankReport] = {}
    while len(reports) < nproc:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            break
        try:
            report = results.get(timeout=left)
        except queue.Empty:
            break
        reports[report.rank] = report
    elapsed = time.monotonic() - start
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)
    for rank in range(nproc):
        if rank not in reports:
            why = "never joined (--skip-rank)" if rank == skip else "no answer"
            reports[rank] = RankReport(
                rank, "HANG", elapsed, f"{why} within {timeout:g}s", transport_env()
            )
    return [reports[rank] for rank in range(nproc)]


def default_backend() -> str:
    try:
        import torch

        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return "xccl"
    except ImportError:
        pass
    return "gloo"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks (= --tp)")
    parser.add_argument(
        "--backend",
        choices=["auto", "xccl", "ccl", "gloo"],
        default="auto",
        help="auto: xccl when an XPU is visible, else gloo",
    )
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds")
    parser.add_argument("--size", type=int, default=1024, help="floats per rank")
    parser.add_argument(
        "--skip-rank", type=int, default=-1, help="testing: this rank never joins"
    )
    args = parser.parse_args(argv)
    backend = default_backend() if args.backend == "auto" else args.backend
    print(f"probe: {args.nproc} ranks, backend {backend}, timeout {args.timeout:g}s")
    print(f"transport env: {transport_env() or '(none set)'}")
    reports = run_probe(args.nproc, backend, args.timeout, args.size, args.skip_rank)
    for r in reports:
        print(f"rank {r.rank}: {r.verdict} after {r.seconds:.1f}s: {r.detail}")
    verdicts = {r.verdict for r in reports}
    if verdicts == {"PASS"}:
        print("PASS: the collective works; look at the engine, not the transport")
        return 0
    if "HANG" in verdicts:
        print("HANG: for ranks on one host set FI_TCP_IFACE=lo and run again")
    else:
        print("ERROR: see the rank lines above")
    return 1


if __name__ == "__main__":
    sys.exit(main())
