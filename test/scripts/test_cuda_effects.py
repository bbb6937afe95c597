"""The audit's effect table: it agrees with a fresh measurement, covers the tree, and
names replacements that exist."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from conftest import SCRIPTS, load_script

from xpu_series.audit.effects import (
    CUDA_ONLY_PACKAGES,
    EFFECTS,
    EVIDENCE,
    PACKAGE_NOTES,
    SUBMODULES,
    Basis,
    Effect,
    effect_of,
    explicit_row,
)
from xpu_series.errors import NetworkError
from xpu_series.project import Project
from xpu_series.stack.wheel import fetch_wheel

ROOT = SCRIPTS.parent
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
SGLANG = ROOT / "build" / "sglang" / "python" / "sglang"


def _venv_torch_missing() -> str:
    if not VENV_PYTHON.exists():
        return f"no {VENV_PYTHON}; hint: run scripts/bootstrap"
    code = "import importlib.util as u; print(u.find_spec('torch'))"
    found = subprocess.run(
        [str(VENV_PYTHON), "-c", code], capture_output=True, text=True
    )  # fmt: skip
    if found.stdout.strip() in ("", "None"):
        return f"torch is not installed in {VENV_PYTHON}"
    return ""


def test_the_table_agrees_with_a_fresh_measurement_on_this_torch() -> None:
    missing = _venv_torch_missing()
    if missing:
        pytest.skip(missing)
    done = subprocess.run(
        [str(VENV_PYTHON), str(SCRIPTS / "measure_cuda_effects.py"), "--check"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"the table agrees with all {len(EVIDENCE)} probes" in done.stderr


# --- coverage of the tree -------------------------------------------------------------


_CHAIN = re.compile(r"\btorch\.cuda((?:\.[A-Za-z_]\w*)+)")
_FROM = re.compile(
    r"^\s*from torch\.cuda((?:\.\w+)*) import \(?([\w\s,]+?)\)?\s*$", re.M
)
_IMPORT_AS = re.compile(r"^\s*import torch\.cuda((?:\.\w+)+) as (\w+)", re.M)
_FROM_TORCH = re.compile(r"^\s*from torch import [^\n]*\bcuda\b", re.M)


def _torch_cuda_names(text: str) -> set[str]:
    """Every torch.cuda.<dotted> a module's text names, code, comments and aliases.

    A superset of what the scanner emits (it reads code only), so a row for each of
    these leaves the scanner no name without one."""
    names = {"torch.cuda" + rest for rest in _CHAIN.findall(text)}
    aliases = {"cuda": "torch.cuda"} if _FROM_TORCH.search(text) else {}
    for sub, listed in _FROM.findall(text):
        for item in filter(None, (i.strip() for i in listed.split(","))):
            name, _, asname = item.partition(" as ")
            aliases[(asname or name).strip()] = f"torch.cuda{sub}.{name.strip()}"
    aliases |= {asname: f"torch.cuda{sub}" for sub, asname in _IMPORT_AS.findall(text)}
    for alias, target in aliases.items():
        names.add(target)
        uses = re.findall(rf"(?<![\w.]){alias}((?:\.[A-Za-z_]\w*)+)", text)
        names |= {target + rest for rest in uses}
    return names


def _missing_rows(texts: Iterable[str]) -> tuple[int, list[str]]:
    names: set[str] = set()
    for text in texts:
        if "torch.cuda" in text or "cuda" in text and "from torch import" in text:
            names |= _torch_cuda_names(text)
    return len(names), sorted(n for n in names if explicit_row(n) is None)


def test_every_torch_cuda_name_the_tree_references_has_a_row() -> None:
    if not SGLANG.is_dir():
        pytest.skip(f"no sglang tree at {SGLANG}; hint: run `xpu-series apply`")
    texts = (
        p.read_text(encoding="utf-8", errors="replace") for p in SGLANG.rglob("*.py")
    )
    found, missing = _missing_rows(texts)
    assert found > 40, "too few names for the sglang tree"
    assert missing == []


def _wheel(version: str) -> Path:
    """The release's wheel, from the project's cache or else the index: a clean
    clone's run has only the pin's cached when these tests run, and skipping on
    that meant they never ran in CI."""
    project = Project(ROOT)
    try:
        return fetch_wheel(project.pin.for_version(version), project.cache_dir).path
    except NetworkError as exc:
        pytest.skip(f"no sglang {version} wheel cached, and {exc.message}")


def _wheel_texts(wheel: Path) -> Iterator[str]:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("sglang/") and name.endswith(".py"):
                yield archive.read(name).decode("utf-8", errors="replace")


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22"])
def test_every_torch_cuda_name_an_older_release_references_has_a_row(version) -> None:
    found, missing = _missing_rows(_wheel_texts(_wheel(version)))
    assert found > 40, f"too few names for sglang {version}"
    assert missing == []


# --- the replacements name what exists ------------------------------------------------


def _resolves(root: object, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(root, part):
            return False
        root = getattr(root, part)
    return True


def test_every_replacement_names_a_torch_api_that_exists() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    missing = []
    for row in EFFECTS.values():
        text = row.replacement.split("sglang:")[0]
        for attr in re.findall(r"torch\.get_device_module\([^)]*\)\.(\w+)", text):
            if not hasattr(torch.xpu, attr):
                missing.append(f"{row.api}: torch.xpu has no {attr}")
        for dotted in re.findall(r"\btorch((?:\.\w+)+)", text):
            if not _resolves(torch, dotted[1:]):
                missing.append(f"{row.api}: torch{dotted}")
    assert missing == []


def test_every_sglang_helper_a_replacement_names_is_defined_in_the_tree() -> None:
    if not SGLANG.is_dir():
        pytest.skip(f"no sglang tree at {SGLANG}; hint: run `xpu-series apply`")
    named = {
        name
        for row in (*EFFECTS.values(), effect_of("import:flashinfer"))
        if "sglang:" in row.replacement
        for name in re.findall(r"(\w+)\(", row.replacement.split("sglang:")[1])
    }
    definition = re.compile(rf"^\s*def ({'|'.join(named)})\(", re.M)
    defined = set()
    for path in (SGLANG / "srt").rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        defined |= set(definition.findall(text))
    assert named >= {"empty_device_cache", "get_device", "synchronize"}
    assert sorted(named - defined) == []


def test_a_submodule_path_takes_the_row_of_the_same_object() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    checked = 0
    for api in EFFECTS:
        name = api.removeprefix("torch.cuda.")
        if not api.startswith("torch.cuda.") or "." in name:
            continue
        for sub in SUBMODULES:
            module = getattr(torch.cuda, sub)
            if hasattr(module, name) and f"torch.cuda.{sub}.{name}" not in EFFECTS:
                assert getattr(module, name) is getattr(torch.cuda, name), (sub, name)
                assert explicit_row(f"torch.cuda.{sub}.{name}") is EFFECTS[api]
                checked += 1
    assert checked >= 10


# --- effect_of's rules ----------------------------------------------------------------


def test_effect_of_answers_each_kind_the_scanner_emits() -> None:
    assert effect_of("Tensor.cuda").effect == Effect.RAISES
    assert effect_of("Tensor.is_cuda").effect == Effect.SKIPS_XPU
    assert effect_of("device:cuda:1").effect == Effect.WRONG_DEVICE
    assert effect_of("device:cuda:1").api == "device:cuda:1"
    guarded = effect_of("guarded-import:transfer_kv_all_layer")
    assert guarded.effect == Effect.RAISES
    assert "transfer_kv_all_layer" in guarded.what and "NameError" in guarded.what
    assert effect_of("import:flashinfer.jit").effect == Effect.RAISES
    assert effect_of("import:sgl_kernel").effect == Effect.HARMLESS
    assert effect_of("torch.cuda").effect == Effect.HARMLESS
    assert effect_of("torch.cuda.memory_reserved").effect == Effect.SILENT_ZERO
    assert effect_of("torch.cuda.empty_cache").effect == Effect.NO_OP


def test_names_without_a_row_follow_the_documented_defaults() -> None:
    via_graphs = effect_of("torch.cuda.graphs.CUDAGraph")
    assert via_graphs.api == "torch.cuda.graphs.CUDAGraph"
    assert via_graphs.what == EFFECTS["torch.cuda.CUDAGraph"].what
    member = effect_of("torch.cuda.Event.elapsed_time")
    assert member.effect == Effect.RAISES and member.what.startswith(
        "as torch.cuda.Event"
    )
    unknown = effect_of("torch.cuda.some_future_api")
    assert unknown.effect == Effect.RAISES
    assert unknown.what.startswith(f"{Basis.DEFAULT} (not measured)")
    # A function in a module row is not the module: it gets the default, not harmless.
    assert effect_of("torch.cuda.memory.some_future_api").effect == Effect.RAISES
    with pytest.raises(ValueError, match="hint:"):
        effect_of("torch.xpu.empty_cache")


def test_every_row_says_in_one_line_how_it_was_established() -> None:
    for api, row in EFFECTS.items():
        basis = EVIDENCE[api].basis
        assert "\n" not in row.what and row.what.startswith(f"{basis}: "), api
        if basis is Basis.TORCH_SOURCE:
            assert EVIDENCE[api].here != EVIDENCE[api].xpu, api


# --- the check itself -----------------------------------------------------------------


def _measurement_matching_the_table(script) -> dict:
    return {
        mode: {
            api: script.Outcome(api, mode, getattr(ev, mode), "")
            for api, ev in EVIDENCE.items()
            if ev.probed
        }
        for mode in script.MODES
    }


def test_check_reports_an_api_whose_measurement_changed() -> None:
    script = load_script("measure_cuda_effects.py")
    measured = _measurement_matching_the_table(script)
    assert script.disagreements(measured) == []
    measured["xpu"]["torch.cuda.empty_cache"] = script.Outcome(
        "torch.cuda.empty_cache", "xpu", "raises AssertionError", "not compiled"
    )
    del measured["here"]["torch.cuda.synchronize"]
    assert sorted(script.disagreements(measured)) == [
        "torch.cuda.empty_cache (xpu): table says 'returns None', measured "
        "'raises AssertionError' not compiled",
        "torch.cuda.synchronize (here): not measured; hint: add it to PROBES",
    ]


def test_every_probe_has_a_row_and_every_probed_row_a_probe() -> None:
    script = load_script("measure_cuda_effects.py")
    probed = {api for api, ev in EVIDENCE.items() if ev.probed}
    assert set(script.PROBES) == probed


# --- packages -------------------------------------------------------------------------


def _normalized(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def test_each_cuda_only_package_is_a_requirement_of_the_cuda_wheel() -> None:
    with zipfile.ZipFile(_wheel("0.5.23")) as wheel:
        metadata = wheel.read("sglang-0.5.23.dist-info/METADATA").decode()
    required = {
        _normalized(re.split(r"[\s\[;<>=!~]", line.split(":", 1)[1].strip())[0])
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    dists = {package: _normalized(n.dist) for package, n in PACKAGE_NOTES.items()}
    assert {p: d for p, d in dists.items() if d not in required} == {}
    # The CUDA wheel requires sglang-kernel too; the XPU image provides sgl_kernel.
    assert "sglang-kernel" in required and "sgl_kernel" not in CUDA_ONLY_PACKAGES


def test_the_library_does_not_import_torch() -> None:
    code = "import sys, xpu_series.audit.effects; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "python")},
    )  # fmt: skip
    assert done.stdout.strip() == "False"


def test_a_package_path_below_a_cuda_only_package_is_cuda_only() -> None:
    for package in CUDA_ONLY_PACKAGES:
        row = effect_of(f"import:{package}.sub")
        assert row.effect == Effect.RAISES and PACKAGE_NOTES[package].dist in row.what
