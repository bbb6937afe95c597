"""audit on real sglang releases: it finds the bugs the series already knows.

Runs where the wheels are in the project's cache (CI's audit step fetches them);
skips with the reason where they are not.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from xpu_series.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = "python/sglang/srt/managers/scheduler.py"
RECLAIM = {"torch.cuda.memory_reserved", "torch.cuda.empty_cache"}


def cached(version: str) -> bool:
    wheels = ROOT / "build" / "cache" / "wheels"
    return any(wheels.glob(f"*/sglang-{version}-*.whl"))


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    capsys.readouterr()
    code = main(["-C", str(ROOT), "audit", "--json", *args])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return json.loads(out)["findings"]


def reclaim(findings: list[dict]) -> list[tuple[str, str, bool]]:
    return [
        (f["api"], f["verdict"], f["patched"])
        for f in findings
        if f["file"] == SCHEDULER
        and f["function"] == "Scheduler.continue_generation"
        and f["api"] in RECLAIM
    ]


@pytest.mark.skipif(
    not cached("0.5.19"),
    reason="the sglang 0.5.19 wheel is not in build/cache (xpu-series fetch "
    "--upstream 0.5.19 brings it)",
)
def test_pristine_0_5_19_has_the_reclaim_and_the_host_pool_movers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Untriaged: patches/audit.toml speaks for the pin's files, not 0.5.19's.
    empty = tmp_path / "audit.toml"
    empty.write_text("")
    findings = audit(
        capsys, "--upstream", "0.5.19", "--pristine", "--triage", str(empty)
    )
    # Exposed in upstream's code; the series (0003) fixes them.
    assert sorted(set(reclaim(findings))) == [
        ("torch.cuda.empty_cache", "exposed", True),
        ("torch.cuda.memory_reserved", "exposed", True),
    ]
    movers = [
        f
        for f in findings
        if f["file"] == "python/sglang/srt/mem_cache/memory_pool_host.py"
        and f["kind"] == "guarded-import"
        and f["verdict"] == "exposed"
    ]
    assert movers, "the kvcacheio movers imported under a CUDA/ROCm guard"
    assert {f["effect"] for f in movers} == {"raises"}
    assert any("transfer_kv" in f["api"] for f in movers)


@pytest.mark.skipif(
    not (ROOT / "build" / "sglang" / ".git").exists(),
    reason="no build/sglang tree (scripts/bootstrap builds it)",
)
def test_pin_pristine_has_the_reclaim_and_the_series_removes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pristine = audit(capsys, "--pristine")
    # Exposed in the release as shipped, and the series fixes them.
    assert sorted(set(reclaim(pristine))) == [
        ("torch.cuda.empty_cache", "exposed", True),
        ("torch.cuda.memory_reserved", "exposed", True),
    ]
    patched = audit(capsys)
    # On the tree with the series they are gone; the report lists them as
    # patched at their pristine place.
    assert {v for _, v, _ in reclaim(patched)} == {"patched"}
    live = [f for f in patched if f["file"] == SCHEDULER and f["verdict"] != "patched"]
    assert not [f for f in live if f["function"] == "Scheduler.continue_generation"]


# --- the kinds beyond the CUDA calls, on the pin's release as shipped -------------

needs_pin_tree = pytest.mark.skipif(
    not (ROOT / "build" / "sglang" / ".git").exists(),
    reason="no build/sglang tree (scripts/bootstrap builds it)",
)


def one(findings: list[dict], kind: str, file: str, function: str) -> list[dict]:
    return [
        f
        for f in findings
        if f["kind"] == kind
        and f["file"] == f"python/sglang/{file}"
        and f["function"] == function
    ]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Pristine 0.5.23 audited with an empty triage file: what the rules find."""
    empty = tmp_path_factory.mktemp("triage") / "audit.toml"
    empty.write_text("")
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        code = main(
            ["-C", str(ROOT), "audit", "--pristine", "--json", "--triage", str(empty)]
        )
    assert code in (0, 1)
    return json.loads(capture.getvalue())["findings"]


@needs_pin_tree
def test_each_new_kind_finds_a_real_bug_in_the_release_as_shipped(
    shipped: list[dict],
) -> None:
    expected = [
        ("xpu-downgrade", "srt/speculative/eagle_utils.py", "_verify_uses_greedy",
         "is_xpu:is_all_greedy", "wrong-result"),
        ("xpu-downgrade", "srt/arg_groups/overrides.py",
         "supports_mamba_cache_extra_buffer",
         "is_xpu:supports_mamba_cache_extra_buffer", "feature-off"),
        ("backend-class", "srt/models/gemma4_mm.py",
         "Gemma4ForConditionalGeneration.prepare_attn_masks",
         "isinstance:TritonAttnBackend", "feature-off"),
        ("collective-op", "srt/layers/sampler.py",
         "Sampler._sync_token_ids_across_tp", "all_reduce:ReduceOp.MIN",
         "wrong-result"),
        ("ipc", "srt/utils/common.py", "MultiprocessingSerializer.serialize",
         "ForkingPickler.dump", "raises"),
        ("ipc", "srt/utils/patch_torch.py", "_reduce_tensor_modified",
         "reductions.reduce_tensor", "raises"),
        ("kernel-surface", "srt/layers/attention/xpu_backend.py", "<module>",
         "sgl_kernel.flash_mla_decode_get_workspace_size", "raises"),
        ("no-xpu-forward", "srt/models/deepseek_v2.py",
         "DeepseekV2AttentionMLA.__init__", "forward:IndexerKPool", "raises"),
        ("no-xpu-forward", "kernels/ops/speculative/verify_sampling.py", "<module>",
         "select:tree_speculative_sampling_target_only", "feature-off"),
    ]  # fmt: skip
    for kind, file, function, api, effect in expected:
        hits = [f for f in one(shipped, kind, file, function) if f["api"] == api]
        assert hits, (kind, file, function, api)
        # Found by the rule (nothing triaged here), exposed on XPU's path.
        assert {(f["verdict"], f["effect"]) for f in hits} == {("exposed", effect)}
    (ccl,) = one(
        shipped,
        "collective-op",
        "srt/layers/sampler.py",
        "Sampler._sync_token_ids_across_tp",
    )
    assert "sglang/issues/31011" in ccl["what"]
    (kernel,) = one(
        shipped, "kernel-surface", "srt/layers/attention/xpu_backend.py", "<module>"
    )
    assert (
        "unless the installed sgl-kernel-xpu is newer than 9cf16bf" in (kernel["what"])
    )


@needs_pin_tree
def test_the_guards_that_silence_the_new_kinds_hold_on_the_release(
    shipped: list[dict],
) -> None:
    silenced = [
        # A CPU tensor is reduced by gloo, not xccl.
        ("collective-op", "srt/managers/cache_controller.py",
         "HiCacheController._sync_prefetch_hit_query", "built on the CPU"),
        # A group named for the CPU.
        ("collective-op", "srt/disaggregation/prefill.py",
         "SchedulerDisaggregationPrefillMixin.is_disagg_prefill_batch_result_ready",
         "CPU (gloo) group"),
        # A branch under the tensor's is_cuda.
        ("ipc", "srt/managers/mm_utils.py", "TransportProxyTensor.__getstate__",
         "is False on XPU"),
        # A platform branch XPU never takes.
        ("kernel-surface", "kernels/ops/speculative/eagle.py", "<module>",
         "`if _is_cpu`"),
        ("backend-class", "srt/arg_groups/overrides.py", "_dllm_attention_backend",
         "is False on XPU"),
    ]  # fmt: skip
    for kind, file, function, why in silenced:
        hits = one(shipped, kind, file, function)
        assert hits, (kind, file, function)
        assert all(f["verdict"] == "guarded" and why in f["reason"] for f in hits)


@needs_pin_tree
def test_the_new_rules_leave_what_is_right_on_xpu_alone(shipped: list[dict]) -> None:
    # Defaults XPU sets only when the user set nothing (platform_hook.py).
    assert not one(
        shipped,
        "xpu-downgrade",
        "srt/arg_groups/platform_hook.py",
        "handle_xpu_backends",
    )
    # A test that already names XPU's backend (sampler.py, dflash_utils.py).
    named = ("layers/sampler.py", "dflash_utils.py")
    assert not [
        f for f in shipped if f["kind"] == "backend-class" and f["file"].endswith(named)
    ]
    # Gemma-3's mask rule has an `elif is_xpu()` arm beside its Triton test.
    assert not one(
        shipped,
        "backend-class",
        "srt/models/gemma3_mm.py",
        "Gemma3ForConditionalGeneration.prepare_attn_masks",
    )
    # An op that defines forward_xpu (QSAIndexer) is no finding where built.
    assert not [f for f in shipped if f["api"] == "forward:QSAIndexer"]
    # A float MIN/MAX (the NVFP4 activation scale) is not an xccl hazard.
    assert not one(
        shipped,
        "collective-op",
        "multimodal_gen/runtime/layers/quantization/modelopt_quant.py",
        "_dynamic_nvfp4_input_scale",
    )
    # A module the XPU package has, from which a name is taken.
    assert not [
        f
        for f in shipped
        if f["kind"] == "kernel-surface" and f["api"] == "sgl_kernel.flash_attn"
    ]


@needs_pin_tree
def test_the_default_report_on_the_series_fits_a_screen_and_counts_each_kind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    code = main(["-C", str(ROOT), "audit"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert len(lines) <= 60, out
    assert lines[0].startswith("audited: ")
    for kind in ("torch-cuda", "xpu-downgrade", "collective-op", "no-xpu-forward"):
        assert any(line.startswith(f"  {kind}: ") for line in lines), kind
    assert "kernel surface: sgl-kernel-xpu main 9cf16bf" in out
    data = audit(capsys)
    assert not [f for f in data if f["verdict"] == "exposed" and not f["patched"]]


@pytest.mark.skipif(
    not cached("0.5.20"),
    reason="the sglang 0.5.20 wheel is not in build/cache (xpu-series fetch "
    "--upstream 0.5.20 brings it)",
)
def test_the_gemma3_mask_rule_upstream_fixed_is_found_where_it_stood(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 0.5.20-0.5.22 gave Gemma-3's bidirectional image mask to TritonAttnBackend
    # only (https://github.com/sgl-project/sglang/pull/39805 fixed it in 0.5.23).
    empty = tmp_path / "audit.toml"
    empty.write_text("")
    findings = audit(
        capsys, "--upstream", "0.5.20", "--pristine", "--triage", str(empty)
    )
    mask = one(
        findings,
        "backend-class",
        "srt/models/gemma3_mm.py",
        "Gemma3ForConditionalGeneration.prepare_attn_masks",
    )
    assert [(f["api"], f["verdict"]) for f in mask] == [
        ("isinstance:TritonAttnBackend", "exposed")
    ]
    # The rejection-sampling flag XPU ignored, then inline in eagle_sample.
    greedy = one(
        findings, "xpu-downgrade", "srt/speculative/eagle_utils.py", "eagle_sample"
    )
    assert {f["effect"] for f in greedy} == {"wrong-result"}
