"""A small OpenAI chat client for the demo and the benchmarks: one streamed request, timed.

TTFT is taken at the first SSE chunk that carries generated text. The simulator (like vLLM's chat endpoint)
may send a role-only chunk first; counting that one would time the HTTP round trip, not the prefill.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.stack_config import MODEL, UPSTREAM_HOST_HEADER


@dataclass(frozen=True, slots=True)
class ChatResult:
    """What one streamed request showed the client."""

    status: int
    backend: str  # ip:port from Envoy's upstream-host response header; "" when absent
    prompt_tokens: int
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens (0 when the backend omits it)
    ttft_s: float | None  # None if no text arrived
    total_s: float


def chat_body(messages: list[dict[str, str]], max_tokens: int, *, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def cached_tokens(usage: dict[str, Any] | None) -> int:
    details = (usage or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


async def stream_chat(
    session: aiohttp.ClientSession, base_url: str, messages: list[dict[str, str]], max_tokens: int
) -> ChatResult:
    """POST a streaming chat completion to ``base_url`` and read it to the end; raises on transport errors.

    A non-200 answer returns a ``ChatResult`` with that status and no timings beyond ``total_s``.
    """
    started = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, Any] | None = None
    url = base_url + "/v1/chat/completions"
    async with session.post(url, json=chat_body(messages, max_tokens)) as resp:
        backend = resp.headers.get(UPSTREAM_HOST_HEADER, "")
        if resp.status != 200:
            await resp.read()
            return ChatResult(resp.status, backend, 0, 0, None, time.perf_counter() - started)
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(_text(choice) for choice in chunk.get("choices") or []):
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                usage = chunk["usage"]
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    return ChatResult(200, backend, prompt, cached_tokens(usage), ttft, time.perf_counter() - started)


def _text(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or choice.get("text"))
