"""GSM8K accuracy with chunked prefill on vs off, same model, same questions.

Either points at two running servers (--url-on, --url-off) or starts them one after
the other (--model, --device; chunk size --chunk vs -1). Greedy decoding, the same
few-shot prompt per question on both. Prints both scores, their difference, the
paired standard error of that difference, the difference in sigmas, and how many
prompts actually crossed a chunk boundary: if few did, the A/B says little about
chunking, whatever its numbers.

    python scripts/gsm8k_chunked_ab.py --model Qwen/Qwen3-0.6B --device xpu \\
        --chunk 256 --num-questions 200 --num-shots 8

--data FILE reads the questions from a local GSM8K-format jsonl (one
{"question", "answer"} object per line) instead of downloading the test set.
--compare-tokens also checks that both runs generated the same text for every
question and names the first one that differs (exit 1). On a deterministic device
(the CPU stand-in) greedy decoding must not depend on how the prompt was chunked,
so this is a stronger check of the chunked KV path than a score difference.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

GSM8K_URL = (
    "https://raw.githubusercontent.com/openai/grade-school-math/master/"
    "grade_school_math/data/test.jsonl"
)
CACHE = Path.home() / ".cache" / "sglang-xpu" / "gsm8k-test.jsonl"
# Below either bound the chunked path was barely exercised.
WEAK_PROBE_MIN_CROSSED = 20
WEAK_PROBE_MIN_SHARE = 0.25
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


@dataclass(frozen=True)
class PairedResult:
    """Outcome of the A/B over the same n questions."""

    n: int
    acc_on: float
    acc_off: float
    diff: float
    se_diff: float
    sigmas: float
    on_only: int
    off_only: int


def paired_stats(on: Sequence[bool], off: Sequence[bool]) -> PairedResult:
    """Accuracy difference and its paired standard error (same questions on both).

    d_i = on_i - off_i; SE = sqrt(s^2 / n), s^2 the sample variance of d.

    >>> r = paired_stats([1, 1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0, 1])
    >>> (r.acc_on, r.acc_off, round(r.diff, 3), round(r.se_diff, 4), round(r.sigmas, 3))
    (0.8, 0.7, 0.1, 0.1795, 0.557)
    >>> (r.on_only, r.off_only)
    (2, 1)
    """
    if len(on) != len(off) or not on:
        raise ValueError("need the same, non-zero number of answers on both sides")
    n = len(on)
    d = [int(a) - int(b) for a, b in zip(on, off, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n)
    if se > 0:
        sigmas = mean / se
    else:
        sigmas = 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return PairedResult(
        n=n,
        acc_on=sum(map(int, on)) / n,
        acc_off=sum(map(int, off)) / n,
        diff=mean,
        se_diff=se,
        sigmas=sigmas,
        on_only=sum(1 for x in d if x == 1),
        off_only=sum(1 for x in d if x == -1),
    )


def crossed_count(prompt_tokens: Sequence[int], chunk: int) -> int:
    """Prompts longer than one chunk, i.e. that were really split.

    >>> crossed_count([100, 256, 257, 900], 256)
    2
    """
    return sum(1 for tokens in prompt_tokens if tokens > chunk)


def render(result: PairedResult, chunk: int, crossed: int) -> str:
    """The A/B as a small table, with a warning when the probe is weak.

    >>> r = paired_stats([1, 1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0, 1])
    >>> print(render(r, 256, 3))
    accuracy, chunk 256   0.800
    accuracy, chunk off   0.700
    difference            +0.100 (paired SE 0.180, +0.56 sigma)
    discordant            on-only 2, off-only 1 (of 10)
    crossed a chunk       3 of 10 prompts longer than 256 tokens
    weak probe: only 3 prompts crossed a chunk boundary
    """
    lines = [
        f"accuracy, chunk {chunk:<5} {result.acc_on:.3f}",
        f"accuracy, chunk off   {result.acc_off:.3f}",
        f"difference            {result.diff:+.3f} (paired SE {result.se_diff:.3f}, "
        f"{result.sigmas:+.2f} sigma)",
        f"discordant            on-only {result.on_only}, off-only {result.off_only} "
        f"(of {result.n})",
        f"crossed a chunk       {crossed} of {result.n} prompts longer than "
        f"{chunk} tokens",
    ]
    if crossed < WEAK_PROBE_MIN_CROSSED or crossed < WEAK_PROBE_MIN_SHARE * result.n:
        lines.append(f"weak probe: only {crossed} prompts crossed a chunk boundary")
    return "\n".join(lines)


def extract_answer(text: str) -> str | None:
    """The last number in a completion, without thousands separators.

    >>> extract_answer("so 3 + 4 = 7. The answer is 1,234.")
    '1234'
    >>> extract_answer("no idea") is None
    True
    """
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return numbers[-1].replace(",", "").rstrip(".")


def load_gsm8k(path: Path | None) -> list[dict]:
    if path is None:
        path = CACHE
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            urllib.request.urlretrieve(GSM8K_URL, path)
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def build_prompts(rows: list[dict], shots: int, n: int) -> list[tuple[str, str]]:
    def label(row: dict) -> str:
        return row["answer"].split("####")[-1].strip().replace(",", "")

    prefix = "".join(
        f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows[:shots]
    )
    return [
        (f"{prefix}Question: {r['question']}\nAnswer:", label(r))
        for r in rows[shots : shots + n]
    ]


def ask(url: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    body = {
        "text": prompt,
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": max_tokens,
            "stop": ["Question:", "</s>", "<|im_end|>"],
        },
    }
    request = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        out = json.loads(resp.read())
    return out["text"], int(out["meta_info"]["prompt_tokens"])


@dataclass
class Run:
    """One side of the A/B: per question, right or wrong, prompt tokens, text."""

    correct: list[bool]
    prompt_tokens: list[int]
    texts: list[str]


def score(url: str, prompts: list[tuple[str, str]], args) -> Run:
    with ThreadPoolExecutor(args.parallel) as pool:
        answers = list(pool.map(lambda p: ask(url, p[0], args.max_tokens), prompts))
    correct = [extract_answer(text) == label for (text, _), (_, label) in zip(
        answers, prompts, strict=True)]  # fmt: skip
    return Run(correct, [t for _, t in answers], [text for text, _ in answers])


def first_mismatch(on: Sequence[str], off: Sequence[str]) -> str | None:
    """Where the two runs' generations first differ, or None if they never do.

    >>> first_mismatch(["a b", "c"], ["a b", "c"]) is None
    True
    >>> first_mismatch(["same", "abcX"], ["same", "abcY"])
    "question 1 differs at character 3: chunked 'X', unchunked 'Y'"
    """
    for index, (a, b) in enumerate(zip(on, off, strict=True)):
        if a != b:
            at = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            return (
                f"question {index} differs at character {at}: chunked "
                f"{a[at : at + 20]!r}, unchunked {b[at : at + 20]!r}"
            )
    return None


def run_with_server(args, chunk: int, prompts) -> Run:
    from sglang.srt.utils import kill_process_tree
    from sglang.test.test_utils import popen_launch_server

    url = f"http://127.0.0.1:{args.port}"
    process = popen_launch_server(
        args.model,
        url,
        timeout=1200,
        other_args=["--device", args.device, "--chunked-prefill-size", str(chunk),
                    "--random-seed", str(args.seed), *args.server_args],
    )  # fmt: skip
    try:
        return score(url, prompts, args)
    finally:
        kill_process_tree(process.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url-on", help="a running server with chunking on")
    parser.add_argument("--url-off", help="a running server with chunking off")
    parser.add_argument("--model", help="start the servers with this model")
    parser.add_argument("--device", default="xpu")
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--num-questions", type=int, default=200)
    parser.add_argument("--num-shots", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data", type=Path, help="GSM8K test.jsonl (else download)")
    parser.add_argument(
        "--compare-tokens",
        action="store_true",
        help="also require the same generated text on both sides (exit 1 if not)",
    )
    parser.add_argument("server_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.server_args = (
        args.server_args[1:] if args.server_args[:1] == ["--"] else (args.server_args)
    )
    if not ((args.url_on and args.url_off) or args.model):
        parser.error("give --url-on and --url-off, or --model to start servers")
    prompts = build_prompts(load_gsm8k(args.data), args.num_shots, args.num_questions)
    if len(prompts) < args.num_questions:
        print(
            f"note: {len(prompts)} questions after the {args.num_shots} shots "
            f"(asked for {args.num_questions})"
        )
    if not prompts:
        parser.error("the data file has no question left after the shots")
    if args.model:
        on = run_with_server(args, args.chunk, prompts)
        off = run_with_server(args, -1, prompts)
    else:
        on = score(args.url_on, prompts, args)
        off = score(args.url_off, prompts, args)
    result = paired_stats(on.correct, off.correct)
    print(render(result, args.chunk, crossed_count(on.prompt_tokens, args.chunk)))
    if args.compare_tokens:
        mismatch = first_mismatch(on.texts, off.texts)
        if mismatch:
            print(f"MISMATCH: {mismatch}")
            return 1
        print(f"same generations: all {len(prompts)} answers identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
