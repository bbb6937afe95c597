"""audit_trace on a real SGLang server on the CPU stand-in: the pristine release's
continue_generation reads torch.cuda.memory_reserved() and calls
torch.cuda.empty_cache() where there is no CUDA (the 0003 bug), and the trace
records both at their lines, with every other site it records real."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from xpu_series.audit.trace import cached_trace, record_trace
from xpu_series.errors import StandinError
from xpu_series.git import Git
from xpu_series.project import Project
from xpu_series.stack.tree import ignore_bytecode

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "sglang"
SCHEDULER = "python/sglang/srt/managers/scheduler.py"


def _calls_in(path: Path, function: str) -> dict[str, set[int]]:
    """The lines of each torch.cuda.<name>(...) call inside `function`."""
    found: dict[str, set[int]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                    name = ast.unparse(call.func)
                    if name.startswith("torch.cuda."):
                        found.setdefault(name, set()).add(call.lineno)
    return found


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pin as upstream shipped it: build/sglang's commit tagged `upstream`."""
    if not (TREE / ".git").exists():
        pytest.skip(f"no patched tree at {TREE}: run scripts/bootstrap first")
    dest = tmp_path_factory.mktemp("pristine") / "sglang"
    for args in (
        ["git", "clone", "-q", "--no-checkout", str(TREE), str(dest)],
        ["git", "-C", str(dest), "checkout", "-q", "upstream"],
    ):
        subprocess.run(args, check=True, capture_output=True, timeout=600)
    # As in the tool's trees, so the trace primes the clone's bytecode from the
    # cache (else each server process compiles the modules it imports).
    ignore_bytecode(Git(dest))
    return dest


def test_the_pristine_reclaim_endpoint_runs_torch_cuda(pristine: Path, tmp_path: Path):
    expected = _calls_in(pristine / SCHEDULER, "continue_generation")
    if not expected:
        pytest.skip("this release's continue_generation calls no torch.cuda API")
    cache = Project(ROOT).cache_dir
    messages: list[str] = []
    try:
        calls = record_trace(
            ROOT, pristine, cache, Path(sys.executable), messages.append
        )
    except StandinError as exc:
        pytest.skip(f"the stand-in server could not start here: {exc.message[:2000]}")
    recorded = {(c.file, c.line, c.api) for c in calls}
    for api, lines in expected.items():
        for line in lines:
            assert (SCHEDULER, line, api) in recorded, (api, line, messages)
    # Every site is a line of a file of the tree's sglang.
    for call in calls:
        path = pristine / call.file
        assert call.file.startswith("python/sglang/") and path.is_file(), call
        assert 1 <= call.line <= len(path.read_text().splitlines()), call
        assert call.api.startswith("torch.cuda.") and call.count >= 1, call
    assert cached_trace(cache, pristine) == calls
