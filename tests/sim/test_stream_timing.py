"""Streaming timing as vLLM does it: the chat role-only chunk comes with the first output, after prefill, so a
client's first SSE event measures time to first token."""

from __future__ import annotations

import time

import aiohttp

from tests.sim.helpers import sim_config
from vllm_sim.cluster import SimCluster
from vllm_sim.tokenize import PromptTokenizer


async def test_first_chat_chunk_waits_for_prefill(tokenizer: PromptTokenizer) -> None:
    config = sim_config("--sim-prefill-tokens-per-s", "4000", "--sim-output-len", "3")
    prompt = "word " * 2000  # ~2000 tokens: ~0.5 s of modeled prefill
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 3, "stream": True}
    async with SimCluster(config, n=1, tokenizer=tokenizer) as cluster, aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.post(f"{cluster.urls[0]}/v1/chat/completions", json=body) as resp:
            first = None
            async for line in resp.content:
                if line.startswith(b"data: "):
                    first = first or (time.monotonic() - start, line)
    assert first is not None
    elapsed, line = first
    assert b'"role": "assistant"' in line or b'"role":"assistant"' in line
    assert elapsed >= 0.4, f"the role chunk went out before prefill ({elapsed:.3f}s)"


async def test_absurdly_nested_json_is_a_400_not_a_500(tokenizer: PromptTokenizer) -> None:
    body = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with SimCluster(sim_config(), n=1, tokenizer=tokenizer) as cluster, aiohttp.ClientSession() as session:
        async with session.post(
            f"{cluster.urls[0]}/v1/completions", data=body, headers={"content-type": "application/json"}
        ) as resp:
            assert resp.status == 400
        async with session.get(f"{cluster.urls[0]}/health") as resp:
            assert resp.status == 200
