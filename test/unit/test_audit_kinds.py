"""audit: the kinds beyond the CUDA calls, each rule on a small synthetic tree, and
the two rule defects (an assert is no guard; a helper's callers across modules)."""

from __future__ import annotations

import textwrap

import pytest

from xpu_series.audit.analysis import effect_of_finding
from xpu_series.audit.place import candidates
from xpu_series.audit.scan import scan_source
from xpu_series.audit.surface import Surface

PACKAGES = frozenset({"flashinfer"})
SURFACE = Surface(
    "main",
    "9cf16bf9f37928c2786195c7e10ff92d9051dfaf",
    "2026-08-21",
    frozenset({"sgl_kernel", "sgl_kernel.flash_attn"}),
    frozenset({"present", "exported_kernel"}),
    "test",
    "0" * 64,
)
SCHEDULER = "python/sglang/srt/managers/scheduler.py"


def scan(code: str, path: str = SCHEDULER):
    return scan_source(textwrap.dedent(code), path, PACKAGES)


def found(code: str, kind: str) -> list[tuple[str, str, bool]]:
    """(api, function, guarded) of each finding of `kind` the file alone gives."""
    return [
        (f.api, f.function, bool(f.guard))
        for f in scan(code).findings
        if f.kind == kind
    ]


def placed(files: dict[str, str], kind: str) -> list[tuple[str, str, str, bool]]:
    """(file, function, api, live) of each finding of `kind` across a tree, after
    the tree-wide rules; live = reached and unguarded."""
    scans = {
        path: scan_source(textwrap.dedent(code), path, PACKAGES)
        for path, code in files.items()
    }
    return [
        (
            c.file.rsplit("/", 1)[-1],
            c.raw.function,
            c.raw.api,
            c.reached and not c.raw.guard,
        )
        for c in candidates(scans, SURFACE)[0]
        if c.raw.kind == kind
    ]


# --- the two defects ------------------------------------------------------------


def test_an_assert_that_fails_on_xpu_guards_nothing_and_raises() -> None:
    code = """
    def f(x):
        assert x.is_cuda and torch.cuda.current_device() == x.device.index
        assert x.is_cuda or x.is_xpu
    """
    findings = scan(code).findings
    first, second, admitted = findings
    assert (first.api, bool(first.guard)) == ("Tensor.is_cuda", False)
    # The `and` chain of a failing assert protects nothing after it.
    assert (second.api, bool(second.guard)) == ("torch.cuda.current_device", False)
    assert effect_of_finding(first).effect == "raises"
    assert "AssertionError" in effect_of_finding(first).what
    # An assert XPU passes stays what it was.
    assert admitted.guard


def test_a_quiet_helper_another_module_calls_unguarded_is_exposed() -> None:
    helper = """
    import torch

    def _measure():
        return torch.cuda.mem_get_info()

    def report():
        if _is_cuda:
            return _measure()
    """
    files = {
        "python/sglang/srt/managers/scheduler.py": "from sglang.srt import pool\n",
        "python/sglang/srt/pool.py": helper,
        "python/sglang/srt/__init__.py": "",
    }
    # Only guarded code here uses it: quiet.
    assert placed(files, "torch-cuda") == [
        ("pool.py", "_measure", "torch.cuda.mem_get_info", False)
    ]
    # A module the server imports calls it directly: the reason no longer holds.
    files["python/sglang/srt/user.py"] = (
        "from sglang.srt.pool import _measure\n\ndef run():\n    return _measure()\n"
    )
    files["python/sglang/srt/managers/scheduler.py"] += "from sglang.srt import user\n"
    assert placed(files, "torch-cuda") == [
        ("pool.py", "_measure", "torch.cuda.mem_get_info", True)
    ]
    # Called there under a guard, it stays quiet; and so from a module no server
    # imports.
    files["python/sglang/srt/user.py"] = (
        "from sglang.srt.pool import _measure\n\n"
        "def run():\n    if _is_cuda:\n        return _measure()\n"
    )
    assert placed(files, "torch-cuda")[0][3] is False


def test_what_rested_on_a_helper_taken_back_is_taken_back_too() -> None:
    helper = """
    import torch

    def _count():
        return torch.cuda.get_device_properties(0).multi_processor_count

    def _grid(n):
        return _count() * n

    def report():
        if _is_cuda:
            return _grid(2)
    """
    files = {
        SCHEDULER: "from sglang.srt import pool, user\n",
        "python/sglang/srt/pool.py": helper,
        "python/sglang/srt/user.py": "from sglang.srt.pool import _grid\n_grid(1)\n",
    }
    assert [live for *_, live in placed(files, "torch-cuda")] == [True]


# --- xpu-downgrade -----------------------------------------------------------------


def test_a_setting_xpu_overrides_without_a_word_is_a_downgrade() -> None:
    code = """
    def resolve(server_args, cfg):
        if get_platform().is_xpu:
            declare_resolution(server_args, "_xpu", enable_overlap=False)
            envs.SGLANG_USE_FAST.set(False)
        if cfg.device == "xpu":
            server_args.chunked_prefill_size = 1024

    def supports_extra_buffer(view):
        if get_platform().is_xpu:
            return False
        return True

    @register_post_process
    def _defaults(view):
        if is_xpu():
            return {"kv_cache_dtype": "bfloat16"}
        return {}

    def verify_uses_greedy(is_all_greedy, is_xpu):
        return is_all_greedy or is_xpu
    """
    assert found(code, "xpu-downgrade") == [
        ("is_xpu:enable_overlap", "resolve", False),
        ("is_xpu:SGLANG_USE_FAST", "resolve", False),
        ("is_xpu:chunked_prefill_size", "resolve", False),
        ("is_xpu:supports_extra_buffer", "supports_extra_buffer", False),
        ("is_xpu:kv_cache_dtype", "_defaults", False),
        ("is_xpu:is_all_greedy", "verify_uses_greedy", False),
    ]
    effects = {f.api: f.effect for f in scan(code).findings}
    assert effects["is_xpu:is_all_greedy"] == "wrong-result"
    assert effects["is_xpu:enable_overlap"] == "feature-off"


def test_defaults_warnings_and_refusals_are_not_downgrades() -> None:
    code = """
    def resolve(server_args, cfg):
        if cfg.device == "xpu":
            if cfg.sampling_backend is None:
                declare_resolution(server_args, "_xpu", sampling_backend="intel_xpu")
            if (Phase.DECODE, "backend") not in server_args._cuda_graph_config_locked:
                declare_resolution(server_args, "_xpu", cuda_graph_config=None)
        if get_platform().is_xpu:
            logger.warning("--enable-symm-mem is not supported on XPU; disabling it")
            declare_resolution(server_args, "_xpu", enable_symm_mem=False)
        if get_platform().is_xpu:
            if envs.SGLANG_DSA_FUSE_TOPK.is_set():
                logger.warning("Disabling SGLANG_DSA_FUSE_TOPK on XPU")
            envs.SGLANG_DSA_FUSE_TOPK.set(False)
        if get_platform().is_xpu:
            raise ValueError("--enable-foo is not supported on XPU")
        if not _is_cuda:
            server_args.enable_bar = False
        use_naive = _is_xpu or _is_hip
    """
    assert found(code, "xpu-downgrade") == []


# --- backend-class ---------------------------------------------------------------

ATTENTION = {
    "python/sglang/srt/layers/attention/base.py": "class AttentionBackend:\n    pass\n",
    "python/sglang/srt/layers/attention/triton_backend.py": (
        "from sglang.srt.layers.attention.base import AttentionBackend\n"
        "class TritonAttnBackend(AttentionBackend):\n    pass\n"
    ),
    "python/sglang/srt/layers/attention/xpu_backend.py": (
        "from sglang.srt.layers.attention.base import AttentionBackend\n"
        "class XPUAttentionBackend(AttentionBackend):\n    pass\n"
    ),
    "python/sglang/srt/layers/attention/flashinfer_backend.py": (
        "from sglang.srt.layers.attention.base import AttentionBackend\n"
        "class FlashInferAttnBackend(AttentionBackend):\n    pass\n"
    ),
    "python/sglang/srt/layers/attention/registry.py": textwrap.dedent(
        """
        @register_attention_backend("triton")
        def create_triton_backend(runner):
            from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
            return TritonAttnBackend(runner)

        @register_attention_backend("intel_xpu")
        def create_intel_xpu_backend(runner):
            from sglang.srt.layers.attention.xpu_backend import XPUAttentionBackend
            return XPUAttentionBackend(runner)
        """
    ),
}
MODEL_HEAD = """
from sglang.srt.layers.attention.base import AttentionBackend
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.attention.xpu_backend import XPUAttentionBackend
"""


def backend_findings(model: str) -> list[tuple[str, str]]:
    files = {
        **ATTENTION,
        "python/sglang/srt/models/m.py": MODEL_HEAD + textwrap.dedent(model),
    }
    return [(fn, api) for _, fn, api, live in placed(files, "backend-class") if live]


def test_behaviour_for_triton_that_intel_xpu_misses_is_found() -> None:
    model = """
    def masks(backend, server_args):
        if not isinstance(backend, TritonAttnBackend):
            return None
        if type(backend).__name__ in ("TritonAttnBackend", "FlashAttentionBackend"):
            return 1
        if server_args.attention_backend == "triton":
            return 2
    """
    assert backend_findings(model) == [
        ("masks", "isinstance:TritonAttnBackend"),
        ("masks", "classname:FlashAttentionBackend,TritonAttnBackend"),
        ("masks", "backend-name:triton"),
    ]


def test_tests_xpu_passes_or_handles_beside_are_not_findings() -> None:
    model = """
    def masks(backend, server_args):
        if isinstance(backend, (TritonAttnBackend, XPUAttentionBackend)):
            return 1
        if isinstance(backend, FlashInferAttnBackend):
            return 2
        if isinstance(backend, AttentionBackend):
            return 3
        if isinstance(backend, TritonAttnBackend):
            return 4
        elif is_xpu():
            return 5
        if server_args.attention_backend in ("triton", "intel_xpu"):
            return 6
        if server_args.linear_attn_backend == "triton":
            return 7
    """
    assert backend_findings(model) == []


def test_the_backend_xpu_runs_comes_from_the_registry_not_from_names() -> None:
    files = dict(ATTENTION)
    # The triton factory now builds another class: the rule follows it.
    files["python/sglang/srt/layers/attention/registry.py"] = files[
        "python/sglang/srt/layers/attention/registry.py"
    ].replace(
        "return TritonAttnBackend(runner)",
        "from sglang.srt.layers.attention.xpu_backend import XPUAttentionBackend\n"
        "    return XPUAttentionBackend(runner)",
    )
    files["python/sglang/srt/models/m.py"] = MODEL_HEAD + (
        "def f(b):\n    if isinstance(b, TritonAttnBackend):\n        return 1\n"
    )
    assert [live for *_, live in placed(files, "backend-class")] == []


def test_a_chain_whose_else_raises_says_so() -> None:
    model = """
    def pick(server_args):
        attention_backend = server_args.attention_backend
        if attention_backend == "fa3":
            return 1
        elif attention_backend in ("flashmla", "triton"):
            return 2
        else:
            raise NotImplementedError(attention_backend)
    """
    files = {**ATTENTION, "python/sglang/srt/models/m.py": textwrap.dedent(model)}
    scans = {p: scan_source(textwrap.dedent(c), p, PACKAGES) for p, c in files.items()}
    (cand,) = [
        c for c in candidates(scans, SURFACE)[0] if c.raw.kind == "backend-class"
    ]
    assert cand.raw.effect == "raises"
    assert "last else raises" in cand.raw.evidence


# --- collective-op -----------------------------------------------------------------


def test_non_sum_reductions_on_device_groups_and_their_effect_per_dtype() -> None:
    code = """
    class Sampler:
        def sync(self, batch_next_token_ids):
            dist.all_reduce(batch_next_token_ids, op=dist.ReduceOp.MIN, group=self.tp)

        def flags(self, ok):
            dist.all_reduce(ok, op=dist.ReduceOp.BAND, group=self.tp)

        def mean(self, x):
            dist.all_reduce(x, op=dist.ReduceOp.AVG, group=self.tp)

        def status(self, s):
            statuses = torch.where(s, 1, 0).to(torch.int32)
            dist.all_reduce(statuses, op=dist.ReduceOp.MAX, group=self.tp)
    """
    effects = [
        (f.function, f.api, f.effect, bool(f.guard))
        for f in scan(code).findings
        if f.kind == "collective-op"
    ]
    assert effects == [
        ("Sampler.sync", "all_reduce:ReduceOp.MIN", "wrong-result", False),
        ("Sampler.flags", "all_reduce:ReduceOp.BAND", "raises", False),
        ("Sampler.mean", "all_reduce:ReduceOp.AVG", "raises", False),
        ("Sampler.status", "all_reduce:ReduceOp.MAX", "wrong-result", False),
    ]
    evidence = {f.api: f.evidence for f in scan(code).findings}
    # The oneCCL fact each effect rests on, with its source.
    assert "sglang/issues/31011" in evidence["all_reduce:ReduceOp.MIN"]
    assert "ProcessGroupXCCL" in evidence["all_reduce:ReduceOp.BAND"]
    assert "2021.15" in evidence["all_reduce:ReduceOp.AVG"]


def test_cpu_tensors_gloo_groups_floats_and_sums_are_not_xccl_hazards() -> None:
    code = """
    def f(self, size, device, t1, t2, flags):
        hits = torch.tensor(size, dtype=torch.int)
        dist.all_reduce(hits, op=dist.ReduceOp.MIN, group=self.tp_group)
        probe = torch.tensor([1], device=device if device.type == "cuda" else "cpu")
        dist.all_reduce(probe, op=dist.ReduceOp.MIN, group=self.tp_group)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.tp_cpu_group)
        amax = t1.abs().amax().float()
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.tp_group)
        dist.all_reduce(t2, op=dist.ReduceOp.SUM, group=self.tp_group)
        done = torch.zeros(1, dtype=torch.bool, device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MAX, group=self.tp_group)
    """
    findings = [f for f in scan(code).findings if f.kind == "collective-op"]
    assert [(f.api, bool(f.guard), f.effect) for f in findings] == [
        ("all_reduce:ReduceOp.MIN", True, "wrong-result"),
        ("all_reduce:ReduceOp.MIN", True, "wrong-result"),
        ("all_reduce:ReduceOp.MAX", True, "wrong-result"),
        # A bool MAX read as OR stays right on a SUM.
        ("all_reduce:ReduceOp.MAX", False, "harmless"),
    ]


# --- ipc -------------------------------------------------------------------------


def test_tensor_ipc_that_only_knows_cuda_is_found_unless_guarded() -> None:
    code = """
    from multiprocessing.reduction import ForkingPickler
    from torch.multiprocessing import reductions
    from torch.multiprocessing.reductions import reduce_tensor

    def serialize(obj):
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        return pickle.dumps(obj)

    def _modified(t):
        fn, args = reductions._reduce_tensor_original(t)
        return reduce_tensor(t)

    def share(t, storage):
        if t.is_cuda:
            return storage._share_cuda_()
        return t.cpu()
    """
    assert found(code, "ipc") == [
        ("ForkingPickler.dump", "serialize", False),
        ("reductions.reduce_tensor", "_modified", False),
        ("reductions.reduce_tensor", "_modified", False),
        ("Storage._share_cuda_", "share", True),
    ]
    raw = next(f for f in scan(code).findings if f.kind == "ipc")
    assert effect_of_finding(raw).effect == "raises"
    assert "_share_fd_" in raw.evidence


# --- kernel-surface --------------------------------------------------------------


def test_sgl_kernel_names_the_xpu_package_lacks_are_found() -> None:
    code = """
    import sgl_kernel
    from sgl_kernel import exported_kernel, missing_kernel
    from sgl_kernel.flash_attn import flash_attn_varlen_func
    import sgl_kernel.missing_module

    if _is_cuda:
        from sgl_kernel import cuda_kernel
    try:
        from sgl_kernel import optional_kernel
    except ImportError:
        optional_kernel = None

    def run(x):
        sgl_kernel.exported_kernel(x)
        return sgl_kernel.another_missing(x)
    """
    files = {SCHEDULER: textwrap.dedent(code)}
    assert [
        (fn, api, live) for _, fn, api, live in placed(files, "kernel-surface")
    ] == [
        ("<module>", "sgl_kernel.missing_kernel", True),
        ("<module>", "sgl_kernel.missing_module", True),
        ("<module>", "sgl_kernel.cuda_kernel", False),
        ("run", "sgl_kernel.another_missing", True),
    ]
    scans = {SCHEDULER: scan_source(textwrap.dedent(code), SCHEDULER, PACKAGES)}
    first = next(
        c for c in candidates(scans, SURFACE)[0] if c.raw.kind == "kernel-surface"
    )
    assert "raises ImportError" in first.raw.evidence
    assert "unless the installed sgl-kernel-xpu is newer than 9cf16bf" in (
        first.raw.evidence
    )


# --- no-xpu-forward ---------------------------------------------------------------

SHIM = """
class Shim(nn.Module):
    def forward_native(self, *args):
        raise NotImplementedError

    def forward_cuda(self, *args):
        raise NotImplementedError

    def forward_xpu(self, *args):
        return self.forward_native(*args)


class OnlyCuda(Shim):
    def forward_cuda(self, x):
        return x + 1


class Native(Shim):
    def forward_cuda(self, x):
        return x + 1

    def forward_native(self, x):
        return x


class OwnXpu(OnlyCuda):
    def forward_xpu(self, x):
        return x
"""


def test_a_platform_op_with_neither_xpu_nor_native_forward_raises_where_built() -> None:
    user = """
    from sglang.srt.layers.ops import Native, OnlyCuda, OwnXpu

    class Layer:
        def __init__(self, config, use_pool):
            self.a = OnlyCuda()
            self.b = Native()
            self.c = OwnXpu()
            if _is_cuda:
                self.d = OnlyCuda()
            cls = OnlyCuda if use_pool else Native
            self.e = cls()
    """
    files = {
        SCHEDULER: "from sglang.srt.layers import user\n",
        "python/sglang/srt/layers/ops.py": SHIM,
        "python/sglang/srt/layers/user.py": textwrap.dedent(user),
    }
    assert placed(files, "no-xpu-forward") == [
        ("user.py", "Layer.__init__", "forward:OnlyCuda", True),
        ("user.py", "Layer.__init__", "forward:OnlyCuda", False),
        ("user.py", "Layer.__init__", "forward:OnlyCuda", True),
    ]
    scans = {p: scan_source(c, p, PACKAGES) for p, c in files.items()}
    raw = next(
        c.raw for c in candidates(scans, SURFACE)[0] if c.raw.kind == "no-xpu-forward"
    )
    assert "Shim.forward_xpu -> Shim.forward_native" in raw.evidence
    assert raw.effect == "raises"


def test_a_selection_chain_that_leaves_xpu_none_while_its_kernel_exists() -> None:
    chain = """
    if is_cuda():
        from sgl_kernel import exported_kernel
    elif is_npu():
        from sgl_kernel_npu import exported_kernel
    else:
        exported_kernel = None

    if is_cuda():
        from sgl_kernel import not_on_xpu
    else:
        not_on_xpu = None

    if is_cuda():
        from sgl_kernel import with_arm
    elif is_xpu():
        from sgl_kernel import with_arm
    else:
        with_arm = None
    """
    files = {SCHEDULER: textwrap.dedent(chain)}
    assert placed(files, "no-xpu-forward") == [
        ("scheduler.py", "<module>", "select:exported_kernel", True)
    ]


# --- the kinds are rules of one pass ---------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "xpu-downgrade",
        "backend-class",
        "collective-op",
        "ipc",
        "kernel-surface",
        "no-xpu-forward",
    ],
)
def test_each_kind_has_a_sarif_rule_and_a_fix(kind: str) -> None:
    from xpu_series.audit.kinds import FIXES, RULES
    from xpu_series.audit.scan_records import KINDS

    assert kind in KINDS and RULES[kind] and FIXES[kind]
