"""One chat completion through a running stack, and what the backend itself reported about its cache."""

from __future__ import annotations

from typing import Any

import aiohttp

from bench.stack_config import MODEL


async def chat(session: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], max_tokens: int = 4,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """POST ``messages`` for the stack's model to ``url``; returns the status and the JSON body."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
    async with session.post(url, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json(content_type=None)


def cached(body: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` as the backend reported it (0 when absent)."""
    details = body["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)
