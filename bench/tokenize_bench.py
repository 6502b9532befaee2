"""Request-understanding cost per prompt shape and size: HF vs the fast encoder, cached vs uncached.

Run: ``.venv/bin/python -m bench.tokenize_bench [--repeat N] [--sizes 1K,8K,32K]``. Prints two tables
(median ms over N requests of each shape, measured side by side in one process):

1. render + encode per shape: HF (``apply_chat_template`` and HF tokenizers, vLLM's reference), the fast
   encoder without its segment cache, with it, and with it and the checkpoints of long texts (the picker's
   default; all after the picker's renderer; hit rate and bytes of the segment cache, share of tokens taken
   from checkpoints, after the shape's requests);
2. block hashing (sha256_cbor, block size 16): the plain hasher vs the prefix cache (hit share, bytes);
3. chat-template rendering: transformers' ``apply_chat_template`` (vLLM's reference) vs the fast renderer
   (``templates.FastTemplate``, the memoized sandbox), alternating on each request, texts checked equal.

Shapes, each a sequence of requests as traffic sends them: ``unique`` (a new document every time: no cache
can help), ``same-message`` (the same document, a new question at the end of the same user message),
``new-message`` (the same document, the question as a second user message), ``agent`` (a context growing by
~500 tokens per request, the last one at the size).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.stack_config import MODEL
from extproc.kvcache.hash_cache import CachedHasher
from extproc.kvcache.hashing import BlockHasher
from extproc.prompt.checkpoints import cut_difference
from extproc.prompt.encoders import FastEncoder, HfEncoder, TextEncoder, check_corpus
from extproc.prompt.models import BaseModel
from extproc.prompt.openai import ParsedRequest, RequestKind, parse_request
from extproc.prompt.render import render_and_tokenize_sync, render_chat_text
from extproc.prompt.templates import RENDERER_FAST
from extproc.prompt.tokenizers import EncoderSettings, LoadedTokenizer, TokenizerRegistry
from extproc.types import HashScheme

SHAPES = ("unique", "same-message", "new-message", "agent")
_WORDS = ("revenue", "costs", "margin", "headcount", "cash", "backlog", "pricing", "demand", "North", "South")


def document(tokens: int, seed: int) -> str:
    """About ``tokens`` tokens of report-like text (Qwen3: ~6 tokens per item here)."""
    rng = random.Random(seed)
    items = (f"{rng.choice(_WORDS)} {rng.randint(1, 9999)}{'.' * (rng.random() < 0.1)}" for _ in range(tokens // 6))
    return " ".join(items)


def body(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages}).encode()


def requests(shape: str, tokens: int, count: int) -> Iterator[ParsedRequest]:
    """The shape's requests, in order (the first one warms whatever cache the shape can use)."""
    system = {"role": "system", "content": "You are a careful analyst. Answer from the document only."}
    doc = document(tokens, seed=tokens)
    for i in range(count):
        if shape == "unique":
            msgs = [system, {"role": "user", "content": document(tokens, seed=tokens * 1000 + i)}]
        elif shape == "same-message":
            msgs = [system, {"role": "user", "content": f"{doc}\n\nQuestion {i}: what changed in item {i}?"}]
        elif shape == "new-message":
            msgs = [system, {"role": "user", "content": doc}, {"role": "user", "content": f"Question {i}?"}]
        else:  # agent: one step (~500 tokens) per request, the last request at ``tokens``
            steps = max(1, tokens // 500 - (count - 1 - i))
            msgs = [system, {"role": "user", "content": "Audit the ledger with the lookup tool."}]
            for s in range(steps):
                msgs += [{"role": "assistant", "content": f"Step {s}: next items."},
                         {"role": "user", "content": f"Tool result {s}: {document(500, seed=s)}"}]  # fmt: skip
        yield parse_request(body(msgs), "application/json", RequestKind.CHAT)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def encode_row(loaded: LoadedTokenizer, encoders: dict[str, TextEncoder], shape: str, size: int, n: int) -> str:
    """Median render+encode ms per encoder over the shape's requests after the first (the warm-up)."""
    cells, tokens, stats, reused = [], 0, None, 0.0
    for encoder in encoders.values():
        if isinstance(encoder, FastEncoder):
            encoder.clear_cache()  # fresh for every shape: its hit rate is this shape's
        times = []
        # HF: vLLM's own path (apply_chat_template, HF tokenizers); the fast columns: the picker's renderer
        renderer = loaded.tokenizer if isinstance(encoder, HfEncoder) else loaded.renderer
        for i, parsed in enumerate(requests(shape, size, n + 1)):
            took, ids = timed(lambda p=parsed, e=encoder, r=renderer: render_and_tokenize_sync(r, loaded.info, p, e))
            tokens = len(ids)
            if i:
                times.append(took)
        cells.append(statistics.median(times) * 1e3)
        if isinstance(encoder, FastEncoder) and encoder.cache_stats() is not None:
            stats = encoder.cache_stats()
        checkpoints = encoder.checkpoint_stats() if isinstance(encoder, FastEncoder) else None
        if checkpoints is not None:
            reused = checkpoints.reused_tokens / max(checkpoints.reused_tokens + checkpoints.encoded_tokens, 1)
    hit = stats["hit_bytes"] / max(stats["hit_bytes"] + stats["miss_bytes"], 1) if stats else 0.0
    mib = stats["bytes"] / (1 << 20) if stats else 0.0
    return (f"{shape:>12} {tokens:>7} " + " ".join(f"{c:>10.3f}" for c in cells)
            + f" {cells[0] / cells[-1]:>7.0f}x {hit:>8.0%} {mib:>7.1f} {reused:>8.0%}")  # fmt: skip


def hash_row(loaded: LoadedTokenizer, shape: str, size: int, n: int) -> str:
    scheme = HashScheme(block_size=16, algo="sha256_cbor")
    plain, cached = BlockHasher(scheme), CachedHasher(BlockHasher(scheme))
    fast = loaded.encoder
    prompts = [render_and_tokenize_sync(loaded.tokenizer, loaded.info, p, fast) for p in requests(shape, size, n + 1)]
    plain_times = [timed(lambda t=t: plain.hash_blocks(t))[0] for t in prompts[1:]]
    cached.hash_blocks(prompts[0])
    hits0 = cached.stats.hit_blocks
    cached_times = [timed(lambda t=t: cached.hash_blocks(t))[0] for t in prompts[1:]]
    hit_share = (cached.stats.hit_blocks - hits0) / max(sum(len(t) // 16 for t in prompts[1:]), 1)
    p, c = statistics.median(plain_times) * 1e3, statistics.median(cached_times) * 1e3
    return (f"{shape:>12} {len(prompts[-1]):>7} {p:>10.3f} {c:>10.3f} {p / max(c, 1e-9):>7.0f}x {hit_share:>8.0%} "
            f"{cached.stats.bytes / (1 << 20):>7.1f}")  # fmt: skip


def render_row(loaded: LoadedTokenizer, shape: str, size: int, n: int) -> str:
    """Median render ms, reference and fast, each request rendered by both in turn (the text must match)."""
    ref_times, fast_times, messages = [], [], 0
    for parsed in list(requests(shape, size, n + 1))[1:]:
        ref_took, ref = timed(lambda p=parsed: render_chat_text(loaded.tokenizer, loaded.info, p))
        fast_took, ours = timed(lambda p=parsed: render_chat_text(loaded.renderer, loaded.info, p))
        assert ours == ref, f"{shape}: the fast renderer differs"
        ref_times.append(ref_took)
        fast_times.append(fast_took)
        messages = len(parsed.messages)
    r, f = statistics.median(ref_times) * 1e3, statistics.median(fast_times) * 1e3
    return f"{shape:>12} {size:>7} {messages:>8} {r:>10.3f} {f:>10.3f} {r / max(f, 1e-9):>7.1f}x"


def parse_sizes(text: str) -> list[int]:
    return [int(s[:-1]) * 1024 if s.upper().endswith("K") else int(s) for s in text.split(",") if s]


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--repeat", type=int, default=9, help="requests per shape and size (after a warm-up one)")
    args.add_argument("--sizes", default="1K,8K,32K")
    opts = args.parse_args(argv)
    registry = TokenizerRegistry(Path("tokenizer_cache"), encoders=EncoderSettings(fast=True))
    loaded = registry.get(BaseModel(MODEL))
    assert loaded.encoder.name == "fastokens", loaded.encoder.fallback_reason
    hf = HfEncoder(loaded.tokenizer)
    fast = FastEncoder.from_hf(loaded.tokenizer)
    cached = FastEncoder.from_hf(loaded.tokenizer, segment_cache_bytes=64 << 20)
    checkpointed = FastEncoder.from_hf(loaded.tokenizer, segment_cache_bytes=64 << 20)
    assert fast is not None and cached is not None and checkpointed is not None
    assert cut_difference(checkpointed.encode_whole, check_corpus([])) is None, "no checkpoints for this tokenizer"
    checkpointed.enable_checkpoints(32 << 20)
    encoders: dict[str, TextEncoder] = {"hf": hf, "fast": fast, "fast+cache": cached, "+checkpoints": checkpointed}
    print(f"render + encode, ms (median of {opts.repeat} requests per shape, after one warm-up request)")
    print(f"{'shape':>12} {'tokens':>7} {'HF':>10} {'fast':>10} {'fast+cache':>10} {'+ckpt':>10} {'HF/best':>8} "
          f"{'seg hit':>8} {'seg MiB':>7} {'ckpt':>8}")  # fmt: skip
    for size in parse_sizes(opts.sizes):
        for shape in SHAPES:
            print(encode_row(loaded, encoders, shape, size, opts.repeat), flush=True)
    print("\nblock hashing sha256_cbor/16, ms (same requests)")
    print(f"{'shape':>12} {'tokens':>7} {'plain':>10} {'cached':>10} {'ratio':>8} {'hit':>8} {'MiB':>7}")
    for size in parse_sizes(opts.sizes):
        for shape in SHAPES:
            print(hash_row(loaded, shape, size, opts.repeat), flush=True)
    assert loaded.renderer.name == RENDERER_FAST, loaded.renderer.fallback_reason
    print(f"\nchat-template rendering, ms (same requests; {loaded.renderer.name} vs apply_chat_template)")
    print(f"{'shape':>12} {'size':>7} {'messages':>8} {'HF':>10} {'fast':>10} {'ratio':>8}")
    for size in parse_sizes(opts.sizes):
        for shape in SHAPES:
            print(render_row(loaded, shape, size, opts.repeat), flush=True)


if __name__ == "__main__":
    main()
