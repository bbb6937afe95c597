"""Draft models share the target's embedding and head on XPU without torch.cuda."""

import importlib
import os
import sys
import unittest
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
from sglang.srt import platforms
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from transformers import PretrainedConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from standins import standin  # noqa: E402

register_cpu_ci(est_time=60, suite="base-a-test-cpu")

NOT_COMPILED = "Torch not compiled with CUDA enabled"
DRAIN = ("empty_cache", "synchronize")

# Every model class whose embed/head sharing the EAGLE, EAGLE3, NextN and MTP
# workers call at draft setup, with the device calls it makes after the swap
# (BailingMoeV3 only frees the cache).
SHARERS = [
    ("apertus", "ApertusForCausalLM", "set_embed_and_head", DRAIN),
    ("apertus", "ApertusForCausalLM", "set_embed", DRAIN),
    ("bailing_moe", "BailingMoEForCausalLM", "set_embed_and_head", DRAIN),
    ("bailing_moe_nextn", "BailingMoeForCausalLMNextN", "set_embed_and_head", DRAIN),
    ("bailing_moe_v3", "BailingMoeV3ForCausalLM", "set_embed_and_head", DRAIN[:1]),
    ("deepseek_v2", "DeepseekV2ForCausalLM", "set_embed_and_head", DRAIN),
    (
        "dots3_common.modeling",
        "Dots3LanguageModelForCausalLM",
        "set_embed_and_head",
        DRAIN,
    ),
    ("dots3_common.nextn", "Dots3NoteForCausalLMNextN", "set_embed_and_head", DRAIN),
    ("ernie4_eagle", "Ernie4_5_MoeForCausalLMMTP", "set_embed_and_head", DRAIN),
    ("exaone4", "Exaone4ForCausalLM", "set_embed_and_head", DRAIN),
    ("exaone4", "Exaone4ForCausalLM", "set_embed", DRAIN),
    ("exaone_moe", "ExaoneMoEForCausalLM", "set_embed_and_head", DRAIN),
    ("falcon_h1", "FalconH1ForCausalLM", "set_embed_and_head", DRAIN),
    ("glm4", "Glm4ForCausalLM", "set_embed_and_head", DRAIN),
    ("glm4_moe", "Glm4MoeForCausalLM", "set_embed_and_head", DRAIN),
    ("glm4_moe_lite", "Glm4MoeLiteForCausalLM", "set_embed_and_head", DRAIN),
    ("glm4v", "Glm4vForConditionalGeneration", "set_embed_and_head", DRAIN),
    ("glm5_next", "Glm5NextForConditionalGeneration", "set_embed_and_head", DRAIN),
    ("gpt_oss", "GptOssForCausalLM", "set_embed_and_head", DRAIN),
    ("hunyuan_v3", "HYV3ForCausalLM", "set_embed_and_head", DRAIN),
    ("kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM", "set_embed_and_head", DRAIN),
    ("kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM", "set_embed", DRAIN),
    ("laguna", "LagunaForCausalLM", "set_embed_and_head", DRAIN),
    ("llada2", "LLaDA2MoeModelLM", "set_embed_and_head", DRAIN),
    ("longcat_flash", "LongcatFlashForCausalLM", "set_embed_and_head", DRAIN),
    ("mimo", "MiMoForCausalLM", "set_embed_and_head", DRAIN),
    ("mimo_v2", "MiMoV2ForCausalLM", "set_embed_and_head", DRAIN),
    ("mimo_v2_nextn", "MiMoV2MTP", "set_embed_and_head", DRAIN),
    ("nanbeige", "NanbeigeForCausalLM", "set_embed_and_head", DRAIN),
    ("nemotron_h", "NemotronHForCausalLM", "set_embed_and_head", DRAIN),
    ("nemotron_h_mtp", "NemotronHForCausalLMMTP", "set_embed_and_head", DRAIN),
    ("opt", "OPTForCausalLM", "set_embed_and_head", DRAIN),
    ("opt", "OPTForCausalLM", "set_embed", DRAIN),
    ("qwen3_moe_mtp", "Qwen3MoeForCausalLMMTP", "set_embed_and_head", DRAIN),
    ("qwen3_next", "Qwen3NextForCausalLM", "set_embed_and_head", DRAIN),
    ("qwen3_next", "Qwen3NextForCausalLM", "set_embed", DRAIN),
    ("step3p5", "Step3p5ForCausalLM", "set_embed_and_head", DRAIN),
]


def model_class(module: str, name: str) -> type:
    return getattr(importlib.import_module(f"sglang.srt.models.{module}"), name)


class DeviceCalls:
    """What the device modules were asked (the boundary: torch.cuda, torch.xpu)."""

    def __init__(self) -> None:
        self.cuda: list[str] = []
        self.xpu: list[str] = []

    def recorder(self, module: str, name: str, raises: str | None = None):
        def call(*args, **kwargs) -> None:
            getattr(self, module).append(name)
            if raises:
                raise AssertionError(raises)

        return call


def pin_platform(stack: ExitStack, kind: str) -> DeviceCalls:
    """Make sglang discover `kind` ("xpu", "cuda" or "none") as the machine's
    platform on the next read of current_platform, and record the device calls.

    Off CUDA ("xpu", "none") torch.cuda behaves as in a torch built without it
    (an XPU build): CUDA is never initialised, so empty_cache does nothing and
    synchronize raises."""
    calls = DeviceCalls()
    on_xpu = kind != "cuda"
    # No out-of-tree platform plugin is installed, and no env var picks one.
    stack.enter_context(mock.patch.dict(os.environ))
    for name in ("SGLANG_PLATFORM", "SGLANG_USE_CPU_ENGINE"):
        os.environ.pop(name, None)
    stack.enter_context(
        mock.patch.object(platforms, "load_plugins_by_group", return_value={})
    )
    stack.enter_context(mock.patch.object(platforms, "_current_platform", None))
    cuda = {
        "is_available": lambda: kind == "cuda",
        # 0.5.23 checks for SAIL, a CUDA device of its own, by the device's name.
        "get_device_name": lambda *a, **k: "NVIDIA H100",
        "empty_cache": calls.recorder("cuda", "empty_cache"),
        "synchronize": calls.recorder(
            "cuda", "synchronize", NOT_COMPILED if on_xpu else None
        ),
    }
    for name, fn in cuda.items():
        stack.enter_context(mock.patch.object(torch.cuda, name, fn))
    xpu = {
        "is_available": lambda: kind == "xpu",
        "empty_cache": calls.recorder("xpu", "empty_cache"),
        "synchronize": calls.recorder("xpu", "synchronize"),
    }
    for name, fn in xpu.items():
        stack.enter_context(mock.patch.object(torch.xpu, name, fn))
    return calls


class _Body(torch.nn.Module):
    """The draft's decoder body: only its input embedding matters here. Models
    name it embed_tokens or word_embeddings; both names hold the one module."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(8, 4)
        self.word_embeddings = self.embed_tokens


def draft(cls: type, **facts):
    """A draft model of `cls` holding its own tiny embedding and head."""
    return standin(
        cls,
        model=_Body(),
        lm_head=torch.nn.Linear(4, 8, bias=False),
        config=PretrainedConfig(tie_word_embeddings=False),
        **facts,
    )


def target_weights() -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    return (
        torch.nn.Parameter(torch.ones(8, 4)),
        torch.nn.Parameter(torch.full((8, 4), 2.0)),
    )


def share(model, method: str, embed, head) -> None:
    if method == "set_embed":
        model.set_embed(embed)
    else:
        model.set_embed_and_head(embed, head)


class TestDraftSetupOnXpu(CustomTestCase):
    """The drafts EAGLE/MTP users start most, through their own classes."""

    def check_shares_and_drains_on_xpu(self, cls: type) -> None:
        embed, head = target_weights()
        model = draft(cls)
        with ExitStack() as stack:
            calls = pin_platform(stack, "xpu")
            model.set_embed_and_head(embed, head)
            self.assertIsInstance(platforms.current_platform, platforms.XpuSRTPlatform)
        self.assertIs(model.model.embed_tokens.weight, embed)
        self.assertIs(model.lm_head.weight, head)
        self.assertEqual(calls.xpu, list(DRAIN))
        self.assertEqual(calls.cuda, [])

    def test_deepseek_v3_nextn(self):
        self.check_shares_and_drains_on_xpu(
            model_class("deepseek_nextn", "DeepseekV3ForCausalLMNextN")
        )

    def test_qwen3_next_mtp(self):
        self.check_shares_and_drains_on_xpu(
            model_class("qwen3_next_mtp", "Qwen3NextForCausalLMMTP")
        )

    def test_glm4_5_mtp(self):
        self.check_shares_and_drains_on_xpu(
            model_class("glm4_moe_nextn", "Glm4MoeForCausalLMNextN")
        )

    def test_kimi_k2_5_eagle3_shares_only_the_embedding(self):
        embed, head = target_weights()
        model = draft(model_class("kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM"))
        own_head = model.lm_head.weight
        with ExitStack() as stack:
            calls = pin_platform(stack, "xpu")
            model.set_embed(embed)
        self.assertIs(model.model.embed_tokens.weight, embed)
        self.assertIs(model.lm_head.weight, own_head)
        self.assertEqual(calls.xpu, list(DRAIN))
        self.assertEqual(calls.cuda, [])

    def test_nemotron_h_mtp_with_its_own_head_keeps_it(self):
        embed, head = target_weights()
        cls = model_class("nemotron_h_mtp", "NemotronHForCausalLMMTP")
        model = draft(cls, _owns_lm_head=True)
        own_head = model.lm_head.weight
        with ExitStack() as stack:
            calls = pin_platform(stack, "xpu")
            model.set_embed_and_head(embed, head)
        self.assertIs(model.model.embed_tokens.weight, embed)
        self.assertIs(model.lm_head.weight, own_head)
        self.assertEqual(calls.xpu, list(DRAIN))
        self.assertEqual(calls.cuda, [])

    def test_dots3_nextn_with_a_checkpoint_embedding_keeps_it(self):
        embed, head = target_weights()
        cls = model_class("dots3_common.nextn", "Dots3NoteForCausalLMNextN")
        model = draft(cls, _mtp_loaded_embed=True)
        own_embed = model.model.embed_tokens.weight
        with ExitStack() as stack:
            calls = pin_platform(stack, "xpu")
            model.set_embed_and_head(embed, head)
        self.assertIs(model.model.embed_tokens.weight, own_embed)
        self.assertIs(model.lm_head.weight, head)
        self.assertEqual(calls.xpu, list(DRAIN))
        self.assertEqual(calls.cuda, [])


class TestEverySharer(CustomTestCase):
    """Each class that shares weights, on XPU, on CUDA and on a machine with
    neither (sglang's base platform, whose device calls do nothing)."""

    def sweep(self, kind: str) -> None:
        for module, name, method, drain in SHARERS:
            with self.subTest(model=f"{name}.{method}", platform=kind):
                try:
                    cls = model_class(module, name)
                except ImportError as err:
                    # An older release's module may need a package (vllm) or a
                    # transformers this environment lacks: no server here loads it.
                    self.skipTest(f"sglang.srt.models.{module} does not import: {err}")
                embed, head = target_weights()
                model = draft(cls)
                own_head = model.lm_head.weight
                with ExitStack() as stack:
                    calls = pin_platform(stack, kind)
                    share(model, method, embed, head)
                self.assertIs(model.model.embed_tokens.weight, embed)
                expected_head = own_head if method == "set_embed" else head
                self.assertIs(model.lm_head.weight, expected_head)
                expected = {
                    device: list(drain) if device == kind else []
                    for device in ("xpu", "cuda")
                }
                self.assertEqual({"xpu": calls.xpu, "cuda": calls.cuda}, expected)

    def test_on_xpu_the_xpu_device_is_drained(self):
        self.sweep("xpu")

    def test_on_cuda_torch_cuda_is_drained_as_before(self):
        self.sweep("cuda")

    def test_without_an_accelerator_no_device_is_asked(self):
        self.sweep("none")


if __name__ == "__main__":
    unittest.main()
