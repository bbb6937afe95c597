"""The CPU stand-in for an Intel GPU: a tiny deterministic model and the server
settings under which a real SGLang server runs on a CPU-only machine.

Used by the manual XPU suite (when SGLANG_XPU_STANDIN=cpu), by the per-patch server
tests and by the measurement scripts. A green run on it is not an XPU result: see
CANNOT_SHOW.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

STANDIN_ENV = "SGLANG_XPU_STANDIN"
ROOT = Path(__file__).resolve().parents[2]

# What the model is; its hash names the cache folder, so a change rebuilds it.
RECIPE: dict[str, Any] = {
    "arch": "GPT2LMHeadModel",
    "vocab_size": 512,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 2,
    "n_positions": 2048,
    "seed": 1234,
    "tokenizer_corpus": [
        "The quick brown fox jumps over the lazy dog.",
        "Intel GPUs serve language models with SGLang.",
        "Chunked prefill splits a long prompt into pieces.",
        "Question: what is two plus three? Answer: five.",
        "Natalia sold clips to 48 of her friends in April.",
        "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    ],
}

# What the stand-in does not exercise: a green CPU run says nothing about these.
CANNOT_SHOW = (
    "the intel_xpu attention backend (the stand-in runs torch_native)",
    "page sizes above 1 (the paged allocator's triton kernel has no CPU driver)",
    "XPU memory: capacity, reservation and the numbers the reclaim log reports",
    "oneCCL / xccl collectives (one CPU rank, no tensor parallelism)",
    "XPU kernels (sgl-kernel-xpu), XPU graphs, and real model weights",
)

# Server settings that run on CPU: torch_native attention, no graphs, fp32.
ENGINE_KWARGS: dict[str, Any] = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "page_size": 1,
    "dtype": "float32",
    "mem_fraction_static": 0.5,
    # A small KV pool: the host is the device here, and HiCache needs room too.
    "max_total_tokens": 16384,
    # sglang's create_device_stream passes device= to torch.cpu.Stream, which takes
    # no such argument, so a KV canary cannot be installed on CPU (it can on XPU).
    # A platform difference: the suite does not test the canary.
    "kv_canary": "none",
    "kv_canary_sweep_interval": 0,
}


# The wheel ships no Rust workspace for the Rust TreeCore (a source install such as
# the XPU image has one), so the stand-in's servers use the Python TreeCore.
ENVIRONMENT = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}


def apply_environment() -> None:
    """Set ENVIRONMENT for this process and the servers it spawns (not overriding)."""
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def engine_kwargs() -> dict[str, Any]:
    """ENGINE_KWARGS plus graphs off, named the way this sglang names them."""
    import inspect

    from sglang.srt.server_args import ServerArgs

    names = set(inspect.signature(ServerArgs).parameters)
    apply_environment()
    kwargs = dict(ENGINE_KWARGS)
    if "cuda_graph_backend_decode" in names:
        kwargs["cuda_graph_backend_decode"] = "disabled"
        kwargs["cuda_graph_backend_prefill"] = "disabled"
    else:
        kwargs["disable_cuda_graph"] = True
    return kwargs


def enabled() -> bool:
    return os.environ.get(STANDIN_ENV, "").lower() == "cpu"


def _recipe_key() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]


def model_dir(cache: Path | None = None) -> Path:
    """The tiny model's folder under build/standin/, built on first use."""
    base = cache or ROOT / "build" / "standin"
    dest = base / f"tiny-gpt2-{_recipe_key()}"
    if (dest / "config.json").is_file() and (dest / "tokenizer.json").is_file():
        return dest
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".{dest.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _build(tmp)
    try:
        os.replace(tmp, dest)
    except OSError:
        # Another process built it first: theirs is as good as ours.
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _build(dest: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    dest.mkdir(parents=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"],
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(RECIPE["tokenizer_corpus"], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    # A chat template, so /v1/chat/completions works like on a real model.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tokenizer.save_pretrained(dest)
    torch.manual_seed(RECIPE["seed"])
    config = GPT2Config(
        vocab_size=RECIPE["vocab_size"],
        n_embd=RECIPE["n_embd"],
        n_layer=RECIPE["n_layer"],
        n_head=RECIPE["n_head"],
        n_positions=RECIPE["n_positions"],
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(dest, safe_serialization=True)


def launch_args(model: Path | None = None) -> list[str]:
    """`sglang.launch_server` flags for the stand-in (the CLI form of ENGINE_KWARGS)."""
    return [
        "--model-path", str(model or model_dir()),
        "--device", "cpu", "--attention-backend", "torch_native",
        "--page-size", "1", "--dtype", "float32", "--mem-fraction-static", "0.5",
        "--max-total-tokens", "16384",
        "--cuda-graph-backend-decode", "disabled",
        "--cuda-graph-backend-prefill", "disabled",
        # An idle scheduler polls without sleeping: a whole core per idle server
        # (10.1 s of CPU in 10 s, measured; 0.3 s with this), taken from the
        # tests and servers beside it. Not in engine_kwargs: the scripted runtime
        # hands the scheduler a socket proxy that the idle sleeper cannot poll.
        "--sleep-on-idle",
    ]  # fmt: skip
