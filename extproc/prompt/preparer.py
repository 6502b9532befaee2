"""The router's ``Preparer``: one HTTP request -> model, adapter, cache salt and token ids.

Parse errors and unknown models are ``RouterError`` s (the client gets them); a tokenizer failure is not an
error: ``token_ids`` is None and the request is routed by load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from extproc.config import RouterConfig
from extproc.errors import BadRequest, RouterError
from extproc.prompt.encoders import TokenIds
from extproc.prompt.models import Adapter, BaseModel, ModelRegistry
from extproc.prompt.openai import ParsedRequest, RequestKind, kind_for_path, parse_request
from extproc.prompt.shadow import ShadowCheck
from extproc.prompt.tokenizers import EncoderSettings, PromptTokenizer, TokenizeFailed, TokenizerRegistry
from extproc.types import HttpRequest, LoraAdapter, PreparedPrompt

log = logging.getLogger(__name__)

INLINE_PARSE_BYTES = 256 * 1024
"""Bodies larger than this are parsed on the executor (``json.loads`` runs ~2-4 ms per MiB)."""


class RequestPreparer:
    """Implements ``extproc.router.Preparer``; stateless apart from its injected collaborators."""

    def __init__(
        self,
        models: ModelRegistry,
        tokenizer: PromptTokenizer,
        executor: Executor,
        *,
        max_body_bytes: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._models = models
        self._tokenizer = tokenizer
        self._executor = executor
        self._max_body_bytes = max_body_bytes
        self._clock = clock

    @property
    def tokenizers(self) -> TokenizerRegistry:
        """The loaded tokenizers (read by the metrics collector)."""
        return self._tokenizer.registry

    async def warm_up(self) -> dict[str, str]:
        """Load every base model's tokenizer now, on the executor (call once from ``App.start``).

        Without it the first requests pay the load (~1 s) and, past the tokenize timeout, route by load.
        Returns {model name: error} for tokenizers that failed to load; never raises for them.
        """
        loop = asyncio.get_running_loop()
        models = list(self._models.models.values())
        failed = await loop.run_in_executor(self._executor, self._tokenizer.preload, models)
        for model in models:  # the first chat render compiles the template (~100 ms): pay it now
            if model.name in failed:
                continue
            body = json.dumps({"model": model.name, "messages": [{"role": "user", "content": "warm up"}]})
            with contextlib.suppress(TokenizeFailed, RouterError):
                parsed = parse_request(body.encode(), "application/json", RequestKind.CHAT)
                await self._tokenizer.render_and_tokenize(parsed, model)
        return failed

    def parses(self, path: str) -> bool:
        """Whether ``path`` is an OpenAI completions path (``kind_for_path``); the router passes the rest through."""
        return kind_for_path(path) is not None

    async def prepare(self, request: HttpRequest, tokenize_within_s: float | None = None) -> PreparedPrompt:
        """Parse, resolve the model, render and tokenize ``request`` (a POST to an OpenAI path).

        ``tokenize_within_s`` bounds tokenization below the configured timeout; <= 0 skips it (the request
        is late: routed by load). Raises ``BadRequest`` / ``UnsupportedMediaType`` / ``BodyTooLarge`` /
        ``UnknownModel``; never raises for a tokenizer failure (``token_ids`` is None then).
        """
        start = self._clock()
        parsed = await self._parse(request)
        parse_s = self._clock() - start
        base, lora = self._models.resolve(parsed.model)
        try:
            if tokenize_within_s is not None and tokenize_within_s <= 0:
                raise TokenizeFailed("no time left in the answer budget")
            tokens: TokenIds | None = await self._tokenizer.render_and_tokenize(
                parsed, base, len(request.body), timeout_s=tokenize_within_s
            )
        except TokenizeFailed as exc:
            log.debug("request %s: tokenization failed, routing by load: %s", request.request_id, exc)
            tokens = None
        return PreparedPrompt(
            model=parsed.model, base_model=base.name, lora=lora, cache_salt=parsed.cache_salt,
            token_ids=tokens, parse_s=parse_s,
        )  # fmt: skip

    async def _parse(self, request: HttpRequest) -> ParsedRequest:
        kind = kind_for_path(request.path)
        if kind is None:
            raise BadRequest(f"path {request.path!r} is not an OpenAI completions endpoint")
        content_type = request.headers.get("content-type")
        if len(request.body) <= INLINE_PARSE_BYTES:
            return parse_request(request.body, content_type, kind, max_bytes=self._max_body_bytes)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor,
            lambda: parse_request(request.body, content_type, kind, max_bytes=self._max_body_bytes),
        )


def registry_from_config(config: RouterConfig, base_dir: Path) -> ModelRegistry:
    """The model registry the config describes; relative tokenizer folders are resolved against ``base_dir``.

    (Hash schemes are not the parser's business: ``resolvers.SchemeResolver`` decides what is hashed.)
    """
    models, adapters = [], []
    for m in config.models:
        folder = base_dir / m.tokenizer_dir if m.tokenizer_dir else None
        models.append(BaseModel(m.name, tokenizer_dir=folder))
        adapters += [Adapter(LoraAdapter(lo.name, lo.path), m.name) for lo in m.loras]
    return ModelRegistry(models, adapters)


def build_preparer(
    config: RouterConfig, base_dir: Path, executor: Executor, shadow: ShadowCheck | None = None
) -> RequestPreparer:
    """The composition root's entry point: registry, tokenizers (loaded lazily) and preparer from config."""
    tok = config.tokenizer
    encoders = EncoderSettings(
        fast=tok.encoder == "auto", fast_templates=tok.renderer == "auto",
        segment_cache_bytes=tok.segment_cache_mib << 20, checkpoint_bytes=tok.checkpoint_cache_mib << 20, shadow=shadow,
    )  # fmt: skip
    tokenizers = TokenizerRegistry(base_dir / config.tokenizer_cache_dir, encoders=encoders)
    prompt_tokenizer = PromptTokenizer(
        tokenizers, executor, timeout_s=config.limits.tokenize_timeout_s,
        max_pending=max(8, 16 * config.limits.tokenizer_workers), inline_bytes=tok.inline_body_bytes,
        inline_render_bytes=tok.inline_render_bytes,
    )  # fmt: skip
    return RequestPreparer(
        registry_from_config(config, base_dir), prompt_tokenizer, executor,
        max_body_bytes=config.limits.max_body_bytes,
    )  # fmt: skip
