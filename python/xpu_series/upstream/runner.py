"""The test runs of `upstream --check`, in one interpreter per check: pytest,
torch, transformers and what else sglang imports load once, then each run is a
fork that imports sglang and the tests afresh from the scratch work tree as it
stands then, with no project folder on sys.path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from xpu_series.git import stop_worker

# Runs in the server before anything else: drops every sys.path entry inside the
# project except the interpreter's own (.venv lives in the checkout), then puts
# the work tree's python/ first. Not an xpu_series module: the project's
# python/ folder is exactly what the server must not see.
_ISOLATE = r"""
import json, os, sys
def _inside(path, folder):
    path, folder = os.path.realpath(path or "."), os.path.realpath(folder)
    return path == folder or path.startswith(folder + os.sep)
_project = os.environ.pop("XPU_UPSTREAM_PROJECT")
sys.path[:] = [os.path.join(os.getcwd(), "python")] + [
    p for p in sys.path if not _inside(p, _project) or _inside(p, sys.prefix)
]
_leaks = [p for p in sys.path[1:]
          if _inside(p, _project) and not _inside(p, sys.prefix)]
"""

# One job per stdin line: {"out", "log", "mode" ("run" or "collect"), "tests"};
# one answer line per job, {"code"}, once the fork wrote "out" (its outcomes, its
# exit code, where sglang came from and, for "collect", upstream's collector on
# the files). The first job's tests are collected here first, so that the
# server holds what they import; each fork forgets everything of the work tree.
SERVER = _ISOLATE + r"""
import contextlib, gc, importlib, importlib.util
import pytest
ARGS = ["-q", "-p", "no:cacheprovider", "--rootdir", os.getcwd(),
        "-c", os.environ["XPU_UPSTREAM_INI"], "--confcutdir", os.getcwd()]
WORK = os.path.realpath(os.getcwd()) + os.sep
TOOL = os.environ.pop("XPU_UPSTREAM_TOOL")

def load(name):
    # A module of the tool by its file (stdlib-only ones): the tool's folder
    # stays off sys.path, where the exported tests must not find it.
    spec = importlib.util.spec_from_file_location(
        "_xpu_series_" + name, os.path.join(TOOL, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

worker = load("prefix_worker")

def forget():
    for name, mod in list(sys.modules.items()):
        path = os.path.realpath(getattr(mod, "__file__", None) or "/")
        if name == "sglang" or name.startswith("sglang.") or path.startswith(WORK):
            del sys.modules[name]
    worker.fresh_metrics()

def child(job, server):
    worker.die_with(server)  # nobody else waits for this fork
    forget()
    importlib.invalidate_caches()
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    outcomes = load("pytest_outcomes")  # loaded here: its record starts empty
    code = pytest.main([*ARGS, *job["tests"]], plugins=[outcomes])
    mod = sys.modules.get("sglang")
    data = {"outcomes": outcomes._OUTCOMES, "exit": int(code), "leaks": _leaks,
            "sglang": getattr(mod, "__file__", None)}
    if job["mode"] == "collect":
        try:  # upstream's collector, from the same tree (sglang is imported)
            from sglang.test.ci.ci_register import collect_tests
            data["registries"] = [
                dict(file=r.filename, backend=r.backend.name,
                     suite=r.effective_suite, est_time=r.est_time,
                     nightly=r.nightly, disabled=r.disabled)
                for r in collect_tests(job["tests"], sanity_check=True)]
        except (ImportError, ValueError) as exc:
            data["collect_error"] = f"{type(exc).__name__}: {exc}"
    with open(job["out"], "w") as f:
        json.dump(data, f)
    sys.stdout.flush()
    sys.stderr.flush()

sys.dont_write_bytecode = True
answers = sys.stdout
server = os.getpid()
primed = False
for line in sys.stdin:
    job = json.loads(line)
    if not primed:
        with open(os.devnull, "w") as sink:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                pytest.main([*ARGS, "--co", *job["tests"]])
        gc.freeze()  # what is loaded now is no fork's garbage to walk
        primed = True
    pid = os.fork()
    if pid == 0:
        try:
            child(job, server)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
    answers.flush()
"""  # fmt: skip


class TestServer:
    """One server per `upstream --check` invocation, started at the first run
    and shared by every patch it checks; a server that died is started again
    at the next run."""

    def __init__(self, project_root: Path, work_root: Path) -> None:
        self.project_root = project_root
        self.work_root = work_root
        self._proc: subprocess.Popen[str] | None = None
        self._tmp: Path | None = None
        self._errors: IO[str] | None = None
        self._jobs = 0

    def __enter__(self) -> TestServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[str]:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="xpu-upstream-"))
            (self._tmp / "pytest.ini").write_text("[pytest]\n")
        self._errors = (self._tmp / "server.err").open("w")
        # A project's outcome file is not the server's to write.
        inherited = {k: v for k, v in os.environ.items() if k != "XPU_SERIES_OUTCOMES"}
        env = {
            **inherited,
            "XPU_UPSTREAM_PROJECT": str(self.project_root),
            "XPU_UPSTREAM_INI": str(self._tmp / "pytest.ini"),
            "XPU_UPSTREAM_TOOL": str(Path(__file__).parents[1] / "proofs"),
            # Processes the tests start import sglang from the work tree too.
            "PYTHONPATH": str(self.work_root / "python"),
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=self.work_root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )

    def run(self, mode: str, tests: list[str]) -> dict[str, Any]:
        """The fork's answer for the work tree as it is now; "log" holds the
        end of what pytest printed (or why the server died)."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        assert self._tmp is not None and self._proc.stdin and self._proc.stdout
        self._jobs += 1
        out = self._tmp / f"out-{self._jobs}.json"
        log = self._tmp / f"log-{self._jobs}.txt"
        job = {"out": str(out), "log": str(log), "mode": mode, "tests": tests}
        try:
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
            answered = bool(self._proc.stdout.readline())
        except BrokenPipeError:
            answered = False
        try:
            data = json.loads(out.read_text())
        except (OSError, ValueError):
            data = {}
        text = log.read_text(errors="replace") if log.is_file() else ""
        if not answered:
            self._proc.kill()
            self._proc.wait()
            text += "\nthe test server died: " + self._server_errors()
        data["log"] = text[-5000:].strip()
        return data

    def _server_errors(self) -> str:
        if self._tmp is None:
            return ""
        path = self._tmp / "server.err"
        return path.read_text(errors="replace")[-2000:] if path.is_file() else ""

    def close(self) -> None:
        if self._proc is not None:
            stop_worker(self._proc)
            if self._proc.stdout:
                self._proc.stdout.close()
            self._proc = None
        if self._errors is not None:
            self._errors.close()
            self._errors = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
