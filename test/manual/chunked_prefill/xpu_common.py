"""Shared pieces of the XPU chunked-prefill scripted suite: device and model
checks that skip honestly, engine kwargs for one Intel GPU, and the helpers the
scripts use to wait for a request's resources to come back."""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "standin"))
import cpu_standin  # noqa: E402  (test/standin: the CPU stand-in for an Intel GPU)

# Not registered for CI on purpose (upstream convention for test/manual): this suite
# needs an Intel GPU and model weights. See README.md for how to run it.

MODEL_ENV = "SGLANG_XPU_TEST_MODEL"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
CHUNK_SIZE = 256
# intel_xpu accepts page sizes 64 and 128 only.
PAGE_SIZE = 64
DEFAULT_MAX_STEPS = 400

# How many scheduler steps to keep stepping after a request's KV pages and lock
# refs are back, before its rid may be reused. The scheduler frees a request at
# once, but the tokenizer manager (another process) forgets the rid only when the
# finish/abort output has crossed two ZMQ hops (scheduler -> detokenizer ->
# tokenizer). One scripted `yield` is one scheduler loop iteration; 40 iterations
# is the margin upstream's scripted suites used (sglang 0.5.21) and covers the two
# hops on an Arc B60 with room to spare. On a slower host the reused rid is
# rejected as a duplicate: start_req then raises a TimeoutError that (with patch
# 0008) ends in "POST /generate failed: ...", not a silent pass. Raise the value
# if that happens.
RID_RELEASE_SETTLE_STEPS = 40
# And at least this long: an idle scheduler runs 40 iterations in milliseconds,
# and on a loaded host (CI's two cores, another step beside this suite) the
# detokenizer and tokenizer processes may not have run at all by then. Seen on
# the CPU stand-in: the reused rid's POST answered, and no request reached the
# scheduler.
RID_RELEASE_SETTLE_S = 2.0


def standin() -> bool:
    """SGLANG_XPU_STANDIN=cpu: run the suite on a real CPU server (see README)."""
    return cpu_standin.enabled()


def model_path() -> str:
    if MODEL_ENV in os.environ:
        return os.environ[MODEL_ENV]
    return str(cpu_standin.model_dir()) if standin() else DEFAULT_MODEL


def xpu_missing() -> str | None:
    """Why this host cannot run the suite, or None when an Intel GPU is visible."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return "no Intel GPU: torch.xpu.is_available() is False"
    return None


def model_missing(model: str | None = None) -> str | None:
    """Why the model's weights are not usable offline, or None when they are."""
    model = model or model_path()
    if Path(model).is_dir():
        return (
            None
            if (Path(model) / "config.json").is_file()
            else (f"{model} has no config.json")
        )
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return "huggingface_hub is not installed"
    cached = try_to_load_from_cache(model, "config.json")
    if isinstance(cached, str):
        return None
    return (
        f"model {model} is not in the Hugging Face cache: run 'hf download {model}' "
        f"or set {MODEL_ENV} to a local folder"
    )


def skip_reason() -> str | None:
    if standin():
        return model_missing()
    return xpu_missing() or model_missing()


def xpu_engine_kwargs(**overrides: Any) -> dict[str, Any]:
    """ScriptedHttpServer kwargs for one Intel GPU (ZE_AFFINITY_MASK picks which),
    or for the CPU stand-in: the same chunk size, the device settings switched."""
    if standin():
        kwargs = dict(cpu_standin.engine_kwargs(), model_path=model_path())
        kwargs["chunked_prefill_size"] = CHUNK_SIZE
        kwargs.update(overrides)
        return kwargs
    kwargs = dict(
        model_path=model_path(),
        device="xpu",
        attention_backend=os.environ.get("SGLANG_XPU_TEST_ATTENTION", "intel_xpu"),
        page_size=PAGE_SIZE,
        chunked_prefill_size=CHUNK_SIZE,
        mem_fraction_static=0.7,
    )
    kwargs.update(overrides)
    return kwargs


# The servers SharedServerTestCase classes share, by their ENGINE_KWARGS.
_SHARED: dict[str, Any] = {}


def shared_server_case(base: type, start: Callable[..., Any]) -> type:
    """`base` (sglang's ScriptedTestCase) with a server shared by the classes of
    the same ENGINE_KWARGS that run one after another, started by `start`: one
    start (a minute of CPU on the stand-in, a model load on a GPU) instead of one
    per class. Each script flushes the cache or measures its own baseline first,
    so no test depends on which class ran before it. stop_shared_servers() ends
    them (conftest.py, at the end of the session) and raises what a server's
    shutdown reports, as a class's teardown would."""

    class SharedServerTestCase(base):
        @classmethod
        def setUpClass(cls) -> None:
            super(base, cls).setUpClass()  # what is above base's: not a start
            if not cls.ENGINE_KWARGS:
                raise AssertionError(f"{cls.__name__} must set ENGINE_KWARGS")
            key = repr(sorted(cls.ENGINE_KWARGS.items()))
            if key not in _SHARED:
                # One server at a time, as one class at a time had: two would not
                # fit on one GPU at mem_fraction_static 0.7.
                stop_shared_servers()
                _SHARED[key] = start(**cls.ENGINE_KWARGS)
            cls.server = _SHARED[key]

        @classmethod
        def tearDownClass(cls) -> None:
            # The server stays up for the next class of the same kwargs.
            super(base, cls).tearDownClass()

    return SharedServerTestCase


def __getattr__(name: str) -> Any:
    """SharedServerTestCase on first use: importing sglang's scripted runtime
    takes 17 s of CPU, which the suite's device-free helpers do not need."""
    if name != "SharedServerTestCase":
        raise AttributeError(name)
    from sglang.test.scripted_runtime.http_server import ScriptedHttpServer
    from sglang.test.scripted_runtime.test_case import ScriptedTestCase

    case = shared_server_case(ScriptedTestCase, ScriptedHttpServer.start)
    globals()[name] = case
    return case


def stop_shared_servers() -> None:
    """Shut every shared server down; then raise the first error one reported
    (a fatal error in the server after the last script that used it)."""
    errors: list[BaseException] = []
    while _SHARED:
        _, server = _SHARED.popitem()
        try:
            server.shutdown()
        except Exception as exc:  # noqa: BLE001 - the others still stop first
            errors.append(exc)
    if errors:
        raise errors[0]


# Run without pytest (python -m unittest): the servers still stop at exit.
atexit.register(stop_shared_servers)


def expected_chunks(prompt_len: int, chunk: int) -> int:
    """Chunked-prefill batches a fresh prompt takes: 0 when it fits one batch.

    >>> [expected_chunks(n, 256) for n in (1, 255, 256, 257, 511, 512, 513)]
    [0, 0, 0, 2, 2, 2, 3]
    """
    return 0 if prompt_len <= chunk else math.ceil(prompt_len / chunk)


def boundary_prompt_lens(chunk: int, multiples: tuple[int, ...] = (1, 2, 3)) -> list:
    """Prompt lengths at and around each multiple of the chunk size.

    >>> boundary_prompt_lens(256, (1, 2))
    [255, 256, 257, 511, 512, 513]
    """
    return [k * chunk + delta for k in multiples for delta in (-1, 0, 1)]


def released(handle: Any) -> bool:
    """The request holds no KV page, no radix lock and no request-pool row."""
    req = handle.req
    holds_row = req is not None and getattr(req, "req_pool_idx", None) is not None
    return handle.kv_pages == 0 and handle.lock_refs == 0 and not holds_row


def drain_until_released(
    t: Any, *handles: Any, max_steps: int = DEFAULT_MAX_STEPS
) -> Iterator[None]:
    """Step the scheduler until every handle's resources are back, then settle.

    Fails with each handle's remaining holdings if that takes over `max_steps`,
    so a leak reads as a leak, not as a hang. After the release it keeps stepping
    RID_RELEASE_SETTLE_STEPS times, and for RID_RELEASE_SETTLE_S at least, so
    the release also reaches the tokenizer.
    """
    for _ in range(max_steps):
        if all(released(h) for h in handles):
            break
        yield
    else:
        state = ", ".join(
            f"{h.rid}: kv_pages={h.kv_pages} lock_refs={h.lock_refs}" for h in handles
        )
        raise AssertionError(f"not released after {max_steps} steps ({state})")
    settled = time.monotonic() + RID_RELEASE_SETTLE_S
    for _ in range(RID_RELEASE_SETTLE_STEPS):
        yield
    while time.monotonic() < settled:
        time.sleep(0.01)  # the other processes get the core, not a spinning loop
        yield


def wait_for_free_counts(
    t: Any, baseline: dict, max_steps: int = DEFAULT_MAX_STEPS
) -> Iterator[None]:
    """Step until the pools' free counts equal `baseline` (or give up quietly:
    the caller's assertEqual then shows the difference)."""
    keys = ("kv_pool_free", "req_pool_free")
    for _ in range(max_steps):
        stats = t.engine_stats()
        if all(stats[k] == baseline[k] for k in keys):
            return
        yield
