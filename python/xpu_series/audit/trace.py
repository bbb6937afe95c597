"""Which torch.cuda calls a real stand-in server runs: the audit's runtime evidence.

`record_trace` starts a real SGLang server from a tree on the CPU stand-in (a
device with no CUDA, as on XPU), with the trace hook (`audit_tracer/`, a
sitecustomize on PYTHONPATH) loaded into it and into every process it spawns.
It drives what a user would (generate requests, one with a longer prompt, a chat
completion, /flush_cache, a pause and a resume with the empty-cache flag),
stops the server with its process group, and gathers each process's records:
the torch.cuda functions called, and torch.cuda classes constructed, from a file
under the tree's python/sglang/, with file, line and count. The result is cached
by the tree's content, so an audit of the same tree reads it back
(`cached_trace`).

The stand-in's settings (tiny model, server flags, environment) live in the
project's test/standin/cpu_standin.py, shared with the tests and scripts that
run servers. That folder is not a package on the tool's path, so the module is
loaded from the project by file (importlib), not copied; the model is built by
the server's interpreter, which has torch, so this process never imports it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from xpu_series.errors import StandinError, UsageError
from xpu_series.git import Git
from xpu_series.stack.bytecode import prime

# Bump when the hook or the workload changes what a run records: old records
# then no longer match any tree's key.
TRACE_FORMAT = 1
HOOK_DIR = Path(__file__).resolve().parent / "tracer"
DIR_ENV = "XPU_SERIES_AUDIT_TRACE_DIR"
ROOT_ENV = "XPU_SERIES_AUDIT_TRACE_ROOT"
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 120.0
STOP_GRACE_S = 20.0
STANDIN = Path("test") / "standin" / "cpu_standin.py"

_SHORT_PROMPTS = [
    "The quick brown fox",
    "Intel GPUs serve language models",
    "Question: what is two plus three? Answer:",
]


@dataclass(frozen=True)
class TracedCall:
    """One call site of a torch.cuda API that ran, and how often it ran."""

    file: str  # path in the tree, e.g. "python/sglang/srt/managers/scheduler.py"
    line: int
    api: str  # "torch.cuda.memory_reserved" (the dotted name as called)
    count: int


def trace_key(tree: Path) -> str:
    """The content key of `tree`: its HEAD tree plus its uncommitted changes."""
    git = Git(tree)
    if not git.is_repo():
        raise UsageError(
            f"{tree} is not a git repository, so its trace cannot be keyed",
            hint="trace a tree made by 'xpu-series apply' (build/sglang or --tree)",
        )
    head = git.run("rev-parse", "--verify", "-q", "HEAD^{tree}", check=False)
    if not head.ok:
        raise UsageError(
            f"{tree} has no commit to key its trace by",
            hint="trace a tree made by 'xpu-series apply' (build/sglang or --tree)",
        )
    status = git.run(
        "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"
    ).stdout
    digest = hashlib.sha256(
        f"audit-trace {TRACE_FORMAT}\0{head.stdout.strip()}\0".encode()
    )
    for entry in sorted(e for e in status.split("\0") if e):
        digest.update(entry.encode() + b"\0")
        path = tree / entry[3:]
        if path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:32]


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / "audit-trace" / f"{key}.json"


def commit_key(repo: Path, commit: str) -> str:
    """trace_key of a clean checkout of `commit`, without checking it out."""
    tree_id = Git(repo).out("rev-parse", f"{commit}^{{tree}}")
    text = f"audit-trace {TRACE_FORMAT}\0{tree_id}\0"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_trace(
    cache_dir: Path, tree: Path, key: str | None = None
) -> list[TracedCall] | None:
    """What an earlier run recorded for this tree's content (or for `key`, a
    commit_key), or None."""
    try:
        key = key or trace_key(tree)
        data = json.loads(_cache_file(cache_dir, key).read_text())
        if data.get("format") != TRACE_FORMAT:
            return None
        return [TracedCall(**call) for call in data["calls"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_records(folder: Path) -> list[TracedCall]:
    """Every process's JSONL records in `folder`, summed per (file, line, api)."""
    counts: Counter[tuple[str, int, str]] = Counter()
    for path in sorted(folder.glob("trace-*.jsonl")):
        for text in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(text)
                counts[(str(row["file"]), int(row["line"]), str(row["api"]))] += int(
                    row["count"]
                )
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a killed process
    return [TracedCall(f, line, api, n) for (f, line, api), n in sorted(counts.items())]


def hook_environment(tree: Path, records: Path) -> dict[str, str]:
    """The variables that make a Python process import sglang from `tree` and
    record its torch.cuda calls into `records`."""
    paths = [str(tree / "python"), str(HOOK_DIR)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {
        "PYTHONPATH": os.pathsep.join(paths),
        DIR_ENV: str(records),
        ROOT_ENV: str(tree),
    }


def load_standin(project_root: Path) -> ModuleType:
    """The project's test/standin/cpu_standin.py, loaded by file (see the module
    docstring for why)."""
    path = project_root / STANDIN
    spec = importlib.util.spec_from_file_location("xpu_series_cpu_standin", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise UsageError(
            f"no CPU stand-in at {path}",
            hint="run from an sglang-xpu checkout (test/standin/cpu_standin.py)",
        )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(log: Path, lines: int = 40) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# No proxy: the server listens on 127.0.0.1, and an http_proxy must not see it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(url: str, body: object | None, timeout: float) -> tuple[int, str]:
    """Status and text of one request (POST with a JSON body, else GET)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class _Server:
    """A stand-in server in its own process group, logging to a file."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.url = ""
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip

    def fail(self, what: str) -> StandinError:
        return StandinError(
            f"the stand-in server {what}; the tail of its log ({self.log}):\n"
            f"{_tail(self.log)}",
            hint="fix what the log shows, or start it by hand with the same "
            "command (the log's first lines) to see more",
        )

    def wait_ready(self, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise self.fail(f"exited with {self.proc.returncode} while starting")
            try:
                if _http(f"{self.url}/v1/models", None, 5)[0] == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(1)
        raise self.fail(f"was not ready within {timeout:.0f} s")

    def stop(self) -> None:
        """SIGTERM to the launcher, which stops its children as on Ctrl-C; after
        a grace, SIGKILL to the whole process group, so nothing of it is left."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=STOP_GRACE_S)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            # The group outlives its leader while a child of it is alive, and
            # Linux reuses no id that still names a group.
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def _workload(
    server: _Server, corpus: list[str], say: Callable[[str], None]
) -> list[dict[str, object]]:
    """What a user does with a server, as HTTP requests; each step's outcome.
    The long prompt is the stand-in tokenizer's corpus four times (~500 tokens)."""
    long_prompt = " ".join(corpus * 4)
    steps: list[tuple[str, object | None]] = [
        ("/get_server_info", None),
        *(
            ("/generate", {"text": p, "sampling_params": _sampling(16)})
            for p in _SHORT_PROMPTS
        ),
        ("/generate", {"text": _SHORT_PROMPTS[:2], "sampling_params": _sampling(8)}),
        ("/generate", {"text": long_prompt, "sampling_params": _sampling(16)}),
        (
            "/v1/chat/completions",
            {
                "model": "default",
                "messages": [{"role": "user", "content": _SHORT_PROMPTS[1]}],
                "max_tokens": 8,
                "temperature": 0,
            },
        ),
        ("/flush_cache", {}),
        ("/pause_generation", {"mode": "retract"}),
        ("/continue_generation", {"torch_empty_cache": True}),
        ("/generate", {"text": _SHORT_PROMPTS[0], "sampling_params": _sampling(8)}),
    ]
    outcomes: list[dict[str, object]] = []
    for path, body in steps:
        if server.proc.poll() is not None:
            raise server.fail(f"exited with {server.proc.returncode} during {path}")
        try:
            status, text = _http(f"{server.url}{path}", body, REQUEST_TIMEOUT_S)
        except OSError as exc:
            # A server that stops answering would stall every later step too.
            raise server.fail(f"did not answer {path} ({exc})") from exc
        if path == "/continue_generation" and status == 422:
            # A release before the empty-cache flag: resume without it.
            status, text = _http(f"{server.url}{path}", {}, REQUEST_TIMEOUT_S)
        if status == 404:
            say(f"trace: {path}: this release has no such endpoint, skipped")
        elif status != 200:
            say(f"trace: {path}: HTTP {status}: {text[:200]}")
        outcomes.append({"path": path, "status": status})
    return outcomes


def _sampling(tokens: int) -> dict[str, object]:
    return {"max_new_tokens": tokens, "temperature": 0}


def _model_dir(python: Path, project_root: Path, log: Path) -> Path:
    """The stand-in's tiny model, built by `python` (which has torch) if absent."""
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('cpu_standin', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.model_dir())\n"
    )
    with open(log, "wb") as err:
        try:
            proc = subprocess.run(
                [str(python), "-c", code, str(project_root / STANDIN)],
                stdout=subprocess.PIPE, stderr=err, timeout=600, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess([], 1, b"", b"")
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise StandinError(
            f"could not build the stand-in's tiny model with {python}:\n{_tail(log)}",
            hint="check that this interpreter has torch and transformers "
            "(scripts/bootstrap builds .venv with them)",
        )
    return Path(lines[-1])


def _write_cache(path: Path, payload: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def record_trace(
    project_root: Path,
    tree: Path,
    cache_dir: Path,
    python: Path,
    say: Callable[[str], None] | None = None,
) -> list[TracedCall]:
    """Run a real stand-in server from `tree` with the hook, drive a user's
    workload, stop it, and cache and return what every process recorded."""
    say = say or (lambda _message: None)
    tree = Path(tree).resolve()
    key = trace_key(tree)
    if not (tree / "python" / "sglang" / "launch_server.py").is_file():
        raise UsageError(
            f"{tree} is not an sglang tree (no python/sglang/launch_server.py)",
            hint="trace a tree made by 'xpu-series apply' (build/sglang or --tree)",
        )
    if not Path(python).is_file():
        raise UsageError(
            f"no Python interpreter at {python}",
            hint="pass the project's .venv/bin/python (scripts/bootstrap makes it)",
        )
    standin = load_standin(project_root)
    out = cache_dir / "audit-trace"
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{key}.log"
    started = time.monotonic()
    say(f"trace: bytecode for {tree} and the stand-in's model")
    prime(Git(tree), cache_dir)
    model = _model_dir(Path(python), project_root, log)
    flags = standin.launch_args(model)
    with tempfile.TemporaryDirectory(prefix="xpu-series-trace-") as tmp:
        records = Path(tmp)
        port = _free_port()
        cmd = [str(python), "-m", "sglang.launch_server", *flags, "--port", str(port)]
        env = {
            **os.environ,
            **standin.ENVIRONMENT,
            **hook_environment(tree, records),
        }
        say(f"trace: starting a stand-in server from {tree} (log: {log})")
        server = _Server(cmd, env, log)
        server.url = f"http://127.0.0.1:{port}"
        try:
            ready = server.wait_ready(START_TIMEOUT_S)
            say(f"trace: server ready in {ready:.0f} s; driving the workload")
            steps = _workload(server, list(standin.RECIPE["tokenizer_corpus"]), say)
        finally:
            server.stop()
        calls = read_records(records)
        processes = len(list(records.glob("trace-*.jsonl")))
    seconds = time.monotonic() - started
    _write_cache(
        _cache_file(cache_dir, key),
        {
            "format": TRACE_FORMAT,
            "key": key,
            "tree": str(tree),
            "seconds": round(seconds, 1),
            "processes": processes,
            "workload": steps,
            "calls": [asdict(call) for call in calls],
        },
    )
    say(f"trace: {len(calls)} call sites from {processes} processes in {seconds:.0f} s")
    return calls
