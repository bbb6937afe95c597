"""Upstream's lint hooks as we pin them: they leave the pinned wheel's own files
byte for byte, and they do change (and report) a file upstream would reject."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from xpu_series.project import find_project
from xpu_series.upstream.lint import format_files, lint_files, load_hooks

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "sglang"
CACHE = ROOT / "build" / "cache"


def _pristine(path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(TREE), "show", f"upstream:{path}"],
        check=True,
        capture_output=True,
    ).stdout


def _touched() -> list[str]:
    """The upstream files the carried patches change, plus two test modules."""
    project = find_project(ROOT)
    files = {
        f
        for p in project.series().patches
        for f in p.files
        if f.startswith("python/") and f.endswith(".py")
    }
    return sorted(files | {"python/sglang/test/test_utils.py",
                           "python/sglang/test/ci/ci_register.py"})  # fmt: skip


def test_formatters_are_kept_as_data() -> None:
    pins = {h.id: h.pin for h in load_hooks()}
    assert pins["ruff-format"] == "ruff==0.15.1"
    assert pins["isort"] == "isort==7.0.0"
    assert all(h.version for h in load_hooks())


@pytest.mark.skipif(
    not (TREE / ".git").exists(), reason="needs build/sglang (scripts/bootstrap)"
)
def test_formatting_an_unchanged_upstream_file_leaves_it_byte_for_byte(
    tmp_path: Path,
) -> None:
    paths = [p for p in _touched() if _pristine(p)]
    assert len(paths) >= 5
    for path in paths:
        dest = tmp_path / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(_pristine(path))
    format_files(tmp_path, paths, CACHE)
    changed = [p for p in paths if (tmp_path / p).read_bytes() != _pristine(p)]
    assert changed == []
    # Upstream's own lines are upstream's: the hooks that read only the lines an
    # export adds (codespell) have none to read here.
    assert lint_files(tmp_path, paths, CACHE, added={p: set() for p in paths}).ok


def test_a_file_upstream_would_reformat_is_changed_and_reported(
    tmp_path: Path,
) -> None:
    bad = "import os\nimport sglang\nimport abc\nx = {  'a':1 }   \n"
    (tmp_path / "mod.py").write_text(bad)
    result = lint_files(tmp_path, ["mod.py"], CACHE)
    assert {"isort", "ruff-format", "trailing-whitespace"} <= set(result.findings)
    assert (tmp_path / "mod.py").read_text() == bad  # check mode copies
    format_files(tmp_path, ["mod.py"], CACHE)
    assert (tmp_path / "mod.py").read_text() == (
        'import abc\nimport os\n\nimport sglang\n\nx = {"a": 1}\n'
    )
