"""Request-understanding cost per prompt size: parse, render+tokenize, and block hashing (both algorithms).

Run: ``.venv/bin/python -m bench.tokenize_bench [--repeat N]``. Prints one table (median ms of N runs).
The budget for everything but tokenization is <= 25% of tokenization on 32K-token prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from extproc.kvcache.hashing import BlockHasher
from extproc.prompt.models import BaseModel
from extproc.prompt.openai import RequestKind, parse_request
from extproc.prompt.render import render_and_tokenize_sync
from extproc.prompt.tokenizers import TokenizerRegistry
from extproc.types import HashScheme

SENTENCE = "The quarterly report covers revenue, costs and the outlook for the next year. "
SIZES = (1024, 8192, 32768)


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm (memo, caches)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def body_for(tokens_wanted: int, tokens_per_sentence: int) -> bytes:
    text = SENTENCE * max(1, tokens_wanted // tokens_per_sentence)
    return json.dumps({"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": text}]}).encode()


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--repeat", type=int, default=7)
    repeat = args.parse_args().repeat
    loaded = TokenizerRegistry(Path("tokenizer_cache")).get(BaseModel("Qwen/Qwen3-0.6B"))
    per_sentence = len(loaded.tokenizer(SENTENCE, add_special_tokens=False)["input_ids"])
    hashers = {(a, b): BlockHasher(HashScheme(b, a)) for a in ("sha256", "sha256_cbor") for b in (16, 64)}
    head = f"{'tokens':>7} {'body KB':>8} {'parse':>7} {'tokenize':>9}" + "".join(
        f" {a + '/' + str(b):>15}" for a, b in hashers
    )
    print(f"{head}   (ms, median of {repeat})")
    for size in SIZES:
        raw = body_for(size, per_sentence)
        parsed = parse_request(raw, "application/json", RequestKind.CHAT)
        tokens = render_and_tokenize_sync(loaded.tokenizer, loaded.info, parsed)
        parse_ms = median_ms(lambda raw=raw: parse_request(raw, None, RequestKind.CHAT), repeat)
        tok_ms = median_ms(lambda p=parsed: render_and_tokenize_sync(loaded.tokenizer, loaded.info, p), repeat)
        cells = [median_ms(lambda h=h, t=tokens: h.hash_blocks(t), repeat) for h in hashers.values()]
        print(f"{len(tokens):>7} {len(raw) / 1024:>8.0f} {parse_ms:>7.2f} {tok_ms:>9.2f}"
              + "".join(f" {c:>15.2f}" for c in cells))  # fmt: skip
    blocks = {key: len(tokens) // key[1] for key in hashers}  # the largest size's row
    print("us/block at the largest size:", ", ".join(
        f"{a}/B{b} {c * 1e3 / blocks[(a, b)]:.2f}" for (a, b), c in zip(hashers, cells, strict=True)
    ))  # fmt: skip


if __name__ == "__main__":
    main()
