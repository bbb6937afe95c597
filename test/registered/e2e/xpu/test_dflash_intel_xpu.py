"""DFLASH speculative decoding served on one Intel GPU: triton and intel_xpu
attention, small-chunk prefill, and the decode graph. Each case checks what the
model says and that drafts are accepted, not only that the server answered."""

import os
import unittest
from pathlib import Path

import requests
from sglang.srt.utils import kill_process_tree
from sglang.test.ci.ci_register import register_xpu_ci
from sglang.test.test_utils import (
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    CustomTestCase,
    popen_launch_server,
)

register_xpu_ci(est_time=600, suite="nightly-xpu-1-gpu", nightly=True)

TARGET = os.environ.get("SGLANG_XPU_DFLASH_TARGET", "Qwen/Qwen3-8B")
DRAFT = os.environ.get("SGLANG_XPU_DFLASH_DRAFT", "z-lab/Qwen3-8B-DFlash-b16")
# With greedy decoding every verify step emits at least the bonus token, so an
# accept length of 1.0 means no draft token was ever accepted. 1.5 is a floor
# well under what a matched draft/target pair reaches; it catches a draft that
# computes garbage (e.g. causal masks on its encoder-only layers).
MIN_ACCEPT_LENGTH = 1.5
LAUNCH_ARGS = [
    "--device", "xpu",
    "--speculative-algorithm", "DFLASH",
    "--speculative-draft-model-path", DRAFT,
    "--mem-fraction-static", "0.75",
    "--disable-overlap-schedule",
]  # fmt: skip
PROMPTS = [
    # (prompt, a substring the answer must contain)
    ("The capital of France is", "Paris"),
    ("Count from one to ten: one, two, three,", "four"),
    ("def add(a, b):\n    return", "a + b"),
]


def _missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return "no Intel GPU: torch.xpu.is_available() is False"
    from huggingface_hub import try_to_load_from_cache

    for role, model in (("target", TARGET), ("draft", DRAFT)):
        local = Path(model) / "config.json"
        if not local.is_file() and not isinstance(
            try_to_load_from_cache(model, "config.json"), str
        ):
            return (
                f"DFLASH {role} model {model} is not available locally "
                "(pre-download it or set SGLANG_XPU_DFLASH_TARGET / _DRAFT)"
            )
    return None


SKIP = _missing()


class _DflashXpuServer:
    """One server per class; subclasses set the attention flags."""

    extra_args: list = []

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.base_url = DEFAULT_URL_FOR_TEST
        cls.process = popen_launch_server(
            TARGET,
            cls.base_url,
            timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
            other_args=LAUNCH_ARGS + cls.extra_args,
        )

    @classmethod
    def tearDownClass(cls):
        process = getattr(cls, "process", None)
        if process is not None:
            kill_process_tree(process.pid)
        super().tearDownClass()

    def _generate(self, prompt: str) -> dict:
        response = requests.post(
            f"{self.base_url}/generate",
            json={
                "text": prompt,
                "sampling_params": {"temperature": 0, "max_new_tokens": 48},
            },
            timeout=300,
        )
        self.assertEqual(response.status_code, 200, response.text)
        return response.json()

    def test_answers_are_right_and_drafts_are_accepted(self):
        lengths = []
        for prompt, expected in PROMPTS:
            with self.subTest(prompt=prompt):
                out = self._generate(prompt)
                self.assertIn(expected, out["text"])
                self.assertNotIn("!!!!", out["text"])
                meta = out["meta_info"]
                self.assertIn("spec_accept_length", meta, "no speculative metrics")
                lengths.append(meta["spec_accept_length"])
        average = sum(lengths) / len(lengths)
        print(f"{type(self).__name__}: accept lengths {lengths}, mean {average:.2f}")
        self.assertGreaterEqual(average, MIN_ACCEPT_LENGTH)

    def test_long_prompt_survives_chunking(self):
        # Longer than every chunk size used below, so prefill is split.
        prompt = "Repeat the word blue. " * 120 + "The capital of Japan is"
        out = self._generate(prompt)
        self.assertIn("Tokyo", out["text"])


@unittest.skipIf(SKIP, SKIP or "")
class TestDflashXpuTriton(_DflashXpuServer, CustomTestCase):
    extra_args = ["--attention-backend", "triton"]


@unittest.skipIf(SKIP, SKIP or "")
class TestDflashXpuIntelXpu(_DflashXpuServer, CustomTestCase):
    extra_args = [
        "--attention-backend", "intel_xpu",
        "--speculative-draft-attention-backend", "intel_xpu",
        "--page-size", "64",
    ]  # fmt: skip


@unittest.skipIf(SKIP, SKIP or "")
class TestDflashXpuTritonChunkedPrefill(_DflashXpuServer, CustomTestCase):
    # Tiny chunks are the point of this variant: every prompt is split.
    extra_args = ["--attention-backend", "triton", "--chunked-prefill-size", "4"]


@unittest.skipIf(SKIP, SKIP or "")
class TestDflashXpuIntelXpuChunkedPrefill(_DflashXpuServer, CustomTestCase):
    # intel_xpu takes page sizes 64/128 only, so its smallest chunk here is 128.
    extra_args = [
        "--attention-backend", "intel_xpu",
        "--speculative-draft-attention-backend", "intel_xpu",
        "--page-size", "128", "--chunked-prefill-size", "128",
    ]  # fmt: skip


@unittest.skipIf(SKIP, SKIP or "")
class TestDflashXpuDecodeGraph(_DflashXpuServer, CustomTestCase):
    # The decode graph is opt-in on XPU; it is the only path that reads the
    # DFLASH verify-mask policy (patch 0002 puts XPUAttentionBackend in it).
    extra_args = [
        "--attention-backend", "intel_xpu",
        "--page-size", "64",
        "--cuda-graph-backend-decode", "full",
    ]  # fmt: skip


if __name__ == "__main__":
    unittest.main()
