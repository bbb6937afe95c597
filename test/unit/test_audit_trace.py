"""audit_trace and its hook: what a traced process records, the record format, the
trace's content key and cache, and a whole record_trace against a synthetic
server (a stdlib HTTP server standing in for sglang, over a fake torch.cuda)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import git

from xpu_series.audit import trace as audit_trace
from xpu_series.audit.trace import (
    TracedCall,
    cached_trace,
    hook_environment,
    read_records,
    record_trace,
    trace_key,
)
from xpu_series.errors import StandinError, UsageError

# A torch with the shape the hook patches: a package, submodules whose functions
# it re-exports, a class with its own __new__ and one with its own __init__.
FAKE_TORCH = {
    "torch/__init__.py": "from torch import cuda\n",
    "torch/cuda/__init__.py": """\
        from . import nvtx
        from .memory import *
        from .streams import Event, Stream

        def is_available():
            return False

        def empty_cache():
            return None

        def fail(message):
            raise ValueError(message)

        def echo(*args, **kwargs):
            return args, kwargs
        """,
    "torch/cuda/memory.py": """\
        __all__ = ["memory_reserved"]

        def memory_reserved(device=None):
            return 0
        """,
    "torch/cuda/nvtx.py": """\
        def range_push(message):
            return len(message)
        """,
    "torch/cuda/streams.py": """\
        class Stream:
            def __new__(cls, priority=0):
                obj = super().__new__(cls)
                obj.priority = priority
                return obj

        class Event:
            def __init__(self, timing=False):
                self.timing = timing
        """,
}

PROBE = """\
    import json
    import torch

    def run():
        seen = {}
        seen["reserved"] = torch.cuda.memory_reserved()  # MARK reserved
        torch.cuda.empty_cache()  # MARK empty
        for _ in range(3):
            torch.cuda.is_available()  # MARK loop
        seen["push"] = torch.cuda.nvtx.range_push("abc")  # MARK push
        stream = torch.cuda.Stream(priority=-1)  # MARK stream
        event = torch.cuda.Event(timing=True)  # MARK event
        seen["stream"] = [
            isinstance(stream, torch.cuda.Stream),
            type(stream) is torch.cuda.streams.Stream,
            stream.priority,
        ]
        seen["event"] = [isinstance(event, torch.cuda.Event), event.timing]
        seen["echo"] = torch.cuda.echo(1, key=2)  # MARK echo
        try:
            torch.cuda.fail("boom")  # MARK fail
        except ValueError as exc:
            seen["raised"] = str(exc)
        seen["wrapped"] = hasattr(torch.cuda.empty_cache, "__xpu_audit_original__")
        return seen
    """

OUTSIDE = """\
    import torch

    def run():
        return torch.cuda.empty_cache()
    """


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _line(path: Path, mark: str) -> int:
    """The line of `path` that carries `# MARK <mark>`."""
    lines = path.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# MARK {mark}" in text)


@pytest.fixture
def synthetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git tree with python/sglang/probe.py, a module outside sglang, and a
    fake torch first on PYTHONPATH. Returns the tree."""
    _write(tmp_path / "fake", FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    tree = tmp_path / "tree"
    _write(
        tree / "python",
        {"sglang/__init__.py": "", "sglang/probe.py": PROBE, "outside.py": OUTSIDE},
    )
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    return tree


def _traced_run(
    tree: Path, records: Path, code: str, hooked: bool = True
) -> subprocess.CompletedProcess[str]:
    records.mkdir(exist_ok=True)
    env = {**os.environ, **hook_environment(tree, records)}
    if not hooked:
        del env[audit_trace.DIR_ENV]
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


RUN_PROBE = (
    "import json, outside, sglang.probe as p; outside.run(); print(json.dumps(p.run()))"
)


def test_records_sglang_calls_by_file_line_and_api(synthetic: Path, tmp_path: Path):
    proc = _traced_run(synthetic, tmp_path / "rec", RUN_PROBE)
    assert proc.returncode == 0, proc.stderr
    probe = synthetic / "python/sglang/probe.py"
    rel = "python/sglang/probe.py"
    expected = {
        TracedCall(rel, _line(probe, "reserved"), "torch.cuda.memory_reserved", 1),
        TracedCall(rel, _line(probe, "empty"), "torch.cuda.empty_cache", 1),
        TracedCall(rel, _line(probe, "loop"), "torch.cuda.is_available", 3),
        TracedCall(rel, _line(probe, "push"), "torch.cuda.nvtx.range_push", 1),
        TracedCall(rel, _line(probe, "stream"), "torch.cuda.Stream", 1),
        TracedCall(rel, _line(probe, "event"), "torch.cuda.Event", 1),
        TracedCall(rel, _line(probe, "echo"), "torch.cuda.echo", 1),
        TracedCall(rel, _line(probe, "fail"), "torch.cuda.fail", 1),
    }
    # outside.py's call is not under python/sglang/: not recorded.
    assert set(read_records(tmp_path / "rec")) == expected
    files = list((tmp_path / "rec").glob("trace-*.jsonl"))
    assert len(files) == 1
    assert all(
        set(json.loads(line)) == {"file", "line", "api", "count"}
        for line in files[0].read_text().splitlines()
    )


def test_traced_code_sees_the_same_results_classes_and_exceptions(
    synthetic: Path, tmp_path: Path
):
    hooked = _traced_run(synthetic, tmp_path / "on", RUN_PROBE)
    plain = _traced_run(synthetic, tmp_path / "off", RUN_PROBE, hooked=False)
    assert hooked.returncode == 0 and plain.returncode == 0, hooked.stderr
    seen_hooked = json.loads(hooked.stdout)
    seen_plain = json.loads(plain.stdout)
    assert seen_hooked.pop("wrapped") is True
    assert seen_plain.pop("wrapped") is False
    assert seen_hooked == seen_plain
    assert seen_hooked["stream"] == [True, True, -1]
    assert seen_hooked["raised"] == "boom"


def test_the_hook_does_nothing_without_its_variable(synthetic: Path, tmp_path: Path):
    proc = _traced_run(synthetic, tmp_path / "off", RUN_PROBE, hooked=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["wrapped"] is False
    assert list((tmp_path / "off").iterdir()) == []


def test_an_unwritable_record_folder_never_breaks_the_program(
    synthetic: Path, tmp_path: Path
):
    missing = tmp_path / "missing" / "rec"
    env = {**os.environ, **hook_environment(synthetic, missing)}
    proc = subprocess.run(
        [sys.executable, "-c", RUN_PROBE],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["wrapped"] is True
    assert json.loads(proc.stdout)["reserved"] == 0


def test_a_killed_process_keeps_every_site_it_reached(synthetic: Path, tmp_path: Path):
    code = (
        "import os, signal, sglang.probe as p; p.run(); p.run(); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = _traced_run(synthetic, tmp_path / "rec", code)
    assert proc.returncode == -9
    calls = read_records(tmp_path / "rec")
    assert {c.api for c in calls} >= {
        "torch.cuda.memory_reserved", "torch.cuda.Stream", "torch.cuda.fail",
    }  # fmt: skip
    assert all(c.count >= 1 for c in calls)


def test_spawned_children_record_into_their_own_file(synthetic: Path, tmp_path: Path):
    code = textwrap.dedent("""\
        import multiprocessing, sglang.probe as p
        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=p.run)
            child.start(); child.join()
            p.run()
        """)
    script = tmp_path / "spawner.py"
    script.write_text(code)
    proc = _traced_run(
        synthetic, tmp_path / "rec", f"exec(open({str(script)!r}).read())"
    )
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "rec").glob("trace-*.jsonl"))) == 2
    loop = [c for c in read_records(tmp_path / "rec") if c.api.endswith("is_available")]
    assert [c.count for c in loop] == [6]


def test_read_records_sums_counts_and_skips_a_cut_line(tmp_path: Path):
    row = {"file": "python/sglang/a.py", "line": 3, "api": "torch.cuda.x", "count": 1}
    (tmp_path / "trace-1.jsonl").write_text(
        json.dumps(row) + "\n" + json.dumps({**row, "count": 4}) + "\n"
    )
    (tmp_path / "trace-2.jsonl").write_text(
        json.dumps({**row, "line": 9}) + "\n" + json.dumps(row)[:20]
    )
    (tmp_path / "other.jsonl").write_text(json.dumps(row) + "\n")
    assert read_records(tmp_path) == [
        TracedCall("python/sglang/a.py", 3, "torch.cuda.x", 5),
        TracedCall("python/sglang/a.py", 9, "torch.cuda.x", 1),
    ]


def test_trace_key_follows_the_tree_content(synthetic: Path):
    key = trace_key(synthetic)
    assert trace_key(synthetic) == key
    probe = synthetic / "python/sglang/probe.py"
    original = probe.read_text()
    probe.write_text(original + "# edited\n")
    edited = trace_key(synthetic)
    assert edited != key
    probe.write_text(original)
    assert trace_key(synthetic) == key
    (synthetic / "python/sglang/new.py").write_text("X = 1\n")
    untracked = trace_key(synthetic)
    assert untracked not in (key, edited)
    (synthetic / "python/sglang/new.py").write_text("X = 2\n")
    assert trace_key(synthetic) != untracked
    (synthetic / "python/sglang/new.py").unlink()
    (synthetic / ".gitignore").write_text("*.pyc\n")
    git(synthetic, "add", ".gitignore")
    git(synthetic, "commit", "-q", "-m", "ignore")
    committed = trace_key(synthetic)
    assert committed != key
    (synthetic / "python/sglang/probe.pyc").write_bytes(b"ignored")
    assert trace_key(synthetic) == committed


def test_a_commit_is_keyed_as_a_clean_checkout_of_it(synthetic: Path, tmp_path: Path):
    from xpu_series.audit.trace import commit_key

    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(synthetic), str(bare))
    assert commit_key(bare, "HEAD") == trace_key(synthetic)
    (synthetic / "python/sglang/probe.py").write_text("# edited\n")
    assert commit_key(bare, "HEAD") != trace_key(synthetic)


def test_trace_key_refuses_a_folder_that_is_not_a_repository(tmp_path: Path):
    with pytest.raises(UsageError) as info:
        trace_key(tmp_path)
    assert str(tmp_path) in info.value.message and "apply" in info.value.hint


# The synthetic server: answers the workload, calls torch.cuda where sglang
# would, and spawns a child that records and then outlives its parent.
FAKE_SERVER = """\
    import json, multiprocessing, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import torch

    def child(pid_file):
        torch.cuda.is_available()  # MARK child
        with open(pid_file, "w") as out:
            out.write(str(os.getpid()))
        time.sleep(600)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.answer({})

        def do_POST(self):
            size = int(self.headers.get("Content-Length") or 0)
            self.answer(json.loads(self.rfile.read(size) or b"{}"))

        def answer(self, body):
            mode = os.environ.get("FAKE_MODE", "")
            with open(os.environ["FAKE_LOG"], "a") as out:
                out.write(json.dumps({"path": self.path, "body": body}) + "\\n")
            status = 200
            if mode == "stall" and self.path == "/flush_cache":
                time.sleep(300)
            if self.path == "/continue_generation":
                if mode == "no-continue":
                    status = 404
                elif mode == "old-continue" and body:
                    status = 422
                elif body.get("torch_empty_cache"):
                    torch.cuda.memory_reserved()  # MARK reserved
                    torch.cuda.empty_cache()  # MARK empty
            elif self.path == "/generate":
                torch.cuda.is_available()  # MARK generate
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    if __name__ == "__main__":
        print("fake launch", sys.argv[1:], os.environ.get("FAKE_STANDIN"), flush=True)
        if os.environ.get("FAKE_MODE") == "exit":
            sys.exit("fake: cannot load the model")
        if os.environ.get("FAKE_MODE") == "hang":
            time.sleep(600)
        ctx = multiprocessing.get_context("spawn")
        ctx.Process(target=child, args=(os.environ["FAKE_PID"],)).start()
        port = int(sys.argv[sys.argv.index("--port") + 1])
        ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """

FAKE_STANDIN = """\
    import os
    from pathlib import Path

    ENVIRONMENT = {"FAKE_STANDIN": "from-the-standin"}
    RECIPE = {"tokenizer_corpus": ["alpha beta gamma", "delta epsilon"]}

    def model_dir():
        if os.environ.get("FAKE_MODE") == "no-model":
            raise RuntimeError("fake: no transformers here")
        return Path(__file__).parent / "model"

    def launch_args(model=None):
        return ["--model-path", str(model or model_dir()), "--sleep-on-idle"]
    """


@pytest.fixture
def served(synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The synthetic tree with a fake sglang.launch_server and a project whose
    stand-in module describes it."""
    _write(synthetic / "python", {"sglang/launch_server.py": FAKE_SERVER})
    git(synthetic, "add", "-A")
    git(synthetic, "commit", "-q", "-m", "server")
    _write(tmp_path / "project", {"test/standin/cpu_standin.py": FAKE_STANDIN})
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("FAKE_PID", str(tmp_path / "child.pid"))
    return synthetic


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether `pid` has exited (a zombie waiting for init counts as gone)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_record_trace_runs_the_workload_and_caches_every_process(
    served: Path, tmp_path: Path
):
    cache = tmp_path / "cache"
    messages: list[str] = []
    assert cached_trace(cache, served) is None
    calls = record_trace(
        tmp_path / "project", served, cache, Path(sys.executable), messages.append
    )
    server = served / "python/sglang/launch_server.py"
    rel = "python/sglang/launch_server.py"
    sites = {(c.file, c.line, c.api) for c in calls}
    assert sites == {
        (rel, _line(server, "child"), "torch.cuda.is_available"),
        (rel, _line(server, "generate"), "torch.cuda.is_available"),
        (rel, _line(server, "reserved"), "torch.cuda.memory_reserved"),
        (rel, _line(server, "empty"), "torch.cuda.empty_cache"),
    }
    assert cached_trace(cache, served) == calls
    requests = [
        json.loads(line)
        for line in (tmp_path / "requests.jsonl").read_text().splitlines()
    ]
    paths = [r["path"] for r in requests]
    for step in ("/generate", "/flush_cache", "/pause_generation"):
        assert step in paths
    assert paths.index("/pause_generation") < paths.index("/continue_generation")
    assert {"torch_empty_cache": True} in [
        r["body"] for r in requests if r["path"] == "/continue_generation"
    ]
    prompts = [r["body"].get("text") for r in requests if r["path"] == "/generate"]
    longest = max((p for p in prompts if isinstance(p, str)), key=len)
    assert "alpha beta gamma" in longest and len(longest) > 4 * len("alpha beta gamma")
    log = next((cache / "audit-trace").glob("*.log")).read_text()
    # The stand-in module's flags and environment reached the server.
    assert "--sleep-on-idle" in log and "from-the-standin" in log
    assert str(tmp_path / "project/test/standin/model") in log
    # The child that outlived the launcher went with its process group.
    assert _gone(int((tmp_path / "child.pid").read_text()))
    assert any("ready" in m for m in messages)


def test_a_changed_tree_has_no_cached_trace(served: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    record_trace(tmp_path / "project", served, cache, Path(sys.executable))
    assert cached_trace(cache, served) is not None
    (served / "python/sglang/probe.py").write_text("# changed\n")
    assert cached_trace(cache, served) is None


def test_a_release_without_the_resume_endpoint_is_traced_without_it(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_MODE", "no-continue")
    messages: list[str] = []
    calls = record_trace(
        tmp_path / "project", served, tmp_path / "cache", Path(sys.executable),
        messages.append,
    )  # fmt: skip
    assert "torch.cuda.empty_cache" not in {c.api for c in calls}
    assert any(
        "/continue_generation" in m and "no such endpoint" in m for m in messages
    )


def test_a_release_without_the_empty_cache_flag_resumes_plainly(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_MODE", "old-continue")
    record_trace(tmp_path / "project", served, tmp_path / "cache", Path(sys.executable))
    requests = (tmp_path / "requests.jsonl").read_text().splitlines()
    resumes = [json.loads(r)["body"] for r in requests if "/continue_gen" in r]
    assert resumes == [{"torch_empty_cache": True}, {}]


def test_a_server_that_cannot_start_is_an_error_quoting_its_log(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_MODE", "exit")
    with pytest.raises(StandinError) as info:
        record_trace(
            tmp_path / "project", served, tmp_path / "cache", Path(sys.executable)
        )
    assert "exited with 1 while starting" in info.value.message
    assert "fake: cannot load the model" in info.value.message
    assert info.value.hint
    assert cached_trace(tmp_path / "cache", served) is None


def test_a_model_that_cannot_be_built_is_an_error_quoting_why(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_MODE", "no-model")
    with pytest.raises(StandinError) as info:
        record_trace(
            tmp_path / "project", served, tmp_path / "cache", Path(sys.executable)
        )
    assert "fake: no transformers here" in info.value.message
    assert "torch and transformers" in info.value.hint
    assert not (tmp_path / "requests.jsonl").exists()


def test_a_server_that_never_gets_ready_is_stopped(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setattr(audit_trace, "START_TIMEOUT_S", 2.0)
    with pytest.raises(StandinError) as info:
        record_trace(
            tmp_path / "project", served, tmp_path / "cache", Path(sys.executable)
        )
    assert "not ready within 2 s" in info.value.message
    assert "fake launch" in info.value.message


def test_a_server_that_stops_answering_ends_the_run(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_MODE", "stall")
    monkeypatch.setattr(audit_trace, "REQUEST_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(StandinError) as info:
        record_trace(
            tmp_path / "project", served, tmp_path / "cache", Path(sys.executable)
        )
    assert "did not answer /flush_cache" in info.value.message
    assert time.monotonic() - started < 120
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_record_trace_refuses_a_tree_that_is_not_sglang(tmp_path: Path):
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "-q")
    (tree / "README").write_text("not sglang\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "base")
    with pytest.raises(UsageError) as info:
        record_trace(tmp_path, tree, tmp_path / "cache", Path(sys.executable))
    assert "not an sglang tree" in info.value.message


REAL_TORCH = """\
    import json, sys, torch
    from torch.cuda import Event as ImportedEvent
    import sglang.real_probe as probe

    found = probe.run()
    original = torch.cuda.memory_reserved.__xpu_audit_original__
    found["same_result"] = torch.cuda.memory_reserved() == original()
    found["identity"] = [
        torch.cuda.Stream is torch.cuda.streams.Stream,
        ImportedEvent is torch.cuda.Event,
        issubclass(torch.cuda.ExternalStream, torch.cuda.Stream),
    ]
    unwrapped = []
    for name, module in list(sys.modules.items()):
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            for attr, value in vars(module).items():
                if (
                    type(value).__name__ == "function"
                    and str(getattr(value, "__module__", "")).startswith("torch.cuda")
                    and not attr.startswith("__")
                    and not hasattr(value, "__xpu_audit_original__")
                ):
                    unwrapped.append(f"{name}.{attr}")
    found["unwrapped"] = unwrapped
    print(json.dumps(found))
    """

REAL_PROBE = """\
    import torch

    def run():
        found = {"available": torch.cuda.is_available()}  # MARK available
        event = torch.cuda.Event(enable_timing=True)  # MARK event
        found["event"] = isinstance(event, torch.cuda.Event)
        try:
            torch.cuda.Stream()  # MARK stream
        except Exception as exc:
            found["stream_error"] = type(exc).__name__
        return found
    """


def test_real_torch_cuda_is_wrapped_in_place(tmp_path: Path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    tree = tmp_path / "tree"
    _write(
        tree / "python", {"sglang/__init__.py": "", "sglang/real_probe.py": REAL_PROBE}
    )
    proc = _traced_run(tree, tmp_path / "rec", textwrap.dedent(REAL_TORCH))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["available"] is False  # this machine has no CUDA device
    assert found["event"] is True
    assert found["same_result"] is True
    assert found["identity"] == [True, True, True]
    assert found["unwrapped"] == []
    probe = tree / "python/sglang/real_probe.py"
    sites = {(c.line, c.api) for c in read_records(tmp_path / "rec")}
    assert sites == {
        (_line(probe, "available"), "torch.cuda.is_available"),
        (_line(probe, "event"), "torch.cuda.Event"),
        (_line(probe, "stream"), "torch.cuda.Stream"),
    }
