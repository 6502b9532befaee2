"""Prompt → token ids exactly as vLLM's HF renderer does it, with an LRU of results.

* Chat: ``tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, add_generation_prompt=...,
  continue_final_message=..., tools=..., **chat_template_kwargs)``. With ``add_special_tokens=True`` the
  rendered
  text is tokenized with special tokens added instead (vLLM's ``add_special_tokens`` request field).
* Completions: ``tokenizer(prompt, add_special_tokens=True)["input_ids"]``; token-id prompts bypass this module.

Tokenizing costs about 1 µs per token, so results are cached by the exact request inputs; the work itself
runs in
an executor supplied by the caller. The cache is touched only from the event-loop thread.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

# Keys a client may not override through chat_template_kwargs (they would break the call itself).
_RESERVED_KWARGS = frozenset({"conversation", "messages", "tokenize", "return_dict", "tools", "chat_template"})


class TemplateError(ValueError):
    """The chat template rejected the conversation (maps to HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ChatInput:
    """Everything that decides a chat prompt's tokens (vLLM 0.33 ``ChatCompletionRequest`` fields)."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[Any] | None = None


def _flatten_content(message: dict[str, Any]) -> dict[str, Any]:
    """vLLM's "string" content format: text parts of a list content are joined with newlines."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return {**message, "content": "\n".join(texts)}


DEFAULT_CACHE_TOKENS = 1_000_000
"""``TokenCache``'s default bound (``--sim-token-cache-tokens``)."""


class TokenCache:
    """LRU of token-id lists bounded by total tokens held (not by entries)."""

    def __init__(self, max_tokens: int = DEFAULT_CACHE_TOKENS) -> None:
        self._max_tokens = max_tokens
        self._held = 0
        self._entries: OrderedDict[bytes, list[int]] = OrderedDict()

    def get(self, key: bytes) -> list[int] | None:
        """The cached ids for ``key`` (marks it most recently used), or None."""
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
        return ids

    def put(self, key: bytes, ids: list[int]) -> None:
        """Insert, evicting least recently used entries beyond the token bound."""
        if len(ids) > self._max_tokens or key in self._entries:
            return
        self._entries[key] = ids
        self._held += len(ids)
        while self._held > self._max_tokens:
            _, old = self._entries.popitem(last=False)
            self._held -= len(old)


class PromptTokenizer:
    """One tokenizer folder, loaded offline, plus its result cache. Shared by every server of one model."""

    def __init__(self, path: str | Path, executor: Executor | None = None, cache: TokenCache | None = None) -> None:
        from transformers import AutoTokenizer  # heavy import, deferred to construction

        self._tok: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self._executor = executor
        self._cache = cache or TokenCache()
        self.eos_token_id: int = int(self._tok.eos_token_id)
        self.vocab_size: int = len(self._tok)

    # --- synchronous primitives (run in the executor)

    def chat_sync(self, chat: ChatInput) -> list[int]:
        """Render and tokenize a chat; raises TemplateError when the template rejects it."""
        messages = [_flatten_content(m) for m in chat.messages]
        kwargs = {k: v for k, v in chat.chat_template_kwargs.items() if k not in _RESERVED_KWARGS}
        kwargs.setdefault("add_generation_prompt", chat.add_generation_prompt)
        kwargs.setdefault("continue_final_message", chat.continue_final_message)
        try:
            if chat.add_special_tokens:
                text = self._tok.apply_chat_template(
                    messages, tools=chat.tools, chat_template=chat.chat_template, tokenize=False, **kwargs
                )
                return list(self._tok(text, add_special_tokens=True)["input_ids"])
            ids = self._tok.apply_chat_template(
                messages,
                tools=chat.tools,
                chat_template=chat.chat_template,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
        except Exception as exc:  # jinja raises many types; all mean "this conversation is invalid"
            raise TemplateError(str(exc)) from exc
        return [int(i) for i in ids]

    def completion_sync(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize a completion prompt as vLLM does (special tokens added by default)."""
        return list(self._tok(prompt, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize (used once per filler token at startup, not per request)."""
        return str(self._tok.decode(list(token_ids)))

    def encode_plain(self, text: str) -> list[int]:
        """Tokenize without special tokens (for filler text)."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    # --- cached async API (event-loop thread only)

    async def _cached(self, key: bytes, fn: Any, *args: Any) -> list[int]:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        ids: list[int] = await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        self._cache.put(key, ids)
        return ids

    async def chat(self, chat: ChatInput) -> list[int]:
        """Token ids of a chat prompt (cached by the exact inputs). Raises TemplateError."""
        key = b"c" + msgspec.json.encode(
            [
                chat.messages,
                chat.add_generation_prompt,
                chat.continue_final_message,
                chat.add_special_tokens,
                chat.chat_template,
                chat.chat_template_kwargs,
                chat.tools,
            ]
        )
        return await self._cached(key, self.chat_sync, chat)

    async def completion(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completion prompt (cached by the exact inputs)."""
        key = (b"p1" if add_special_tokens else b"p0") + prompt.encode("utf-8", "surrogatepass")
        return await self._cached(key, self.completion_sync, prompt, add_special_tokens)
