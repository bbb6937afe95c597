"""Helpers for the tests of scripts/: load an extension-less script as a module;
scripts/test's runner in a scratch checkout, with steps of a test's own."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    path = SCRIPTS / name
    module_name = name.replace("-", "_").removesuffix(".py")
    loader = importlib.machinery.SourceFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_loader(module_name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    loader.exec_module(module)
    return module


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """run_steps.py in a scratch git checkout at tmp_path (reports there too)."""
    module = load_script("run_steps.py")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("reports/\nbuild/\n")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "REPORTS", tmp_path / "reports")
    return module


# Spins for half a second of CPU time.
BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"


def fake_steps(module: ModuleType, *specs: tuple[str, str, str, int]) -> None:
    """Replace the runner's steps: (tag, shell script, lane, limit_s) each."""
    module.STEPS = tuple(
        module.Step(tag, f"the {tag} step", module.sh(script), lane, limit_s=limit)
        for tag, script, lane, limit in specs
    )
