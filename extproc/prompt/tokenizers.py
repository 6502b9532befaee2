"""Tokenizers per base model, loaded offline, and rendering + tokenization on or off the event loop.

``TokenizerRegistry`` loads ``tokenizer_cache/<model>/`` with ``local_files_only=True`` (lazily, or all at
once with ``preload``) and picks each model's encoder (``encoders.py``): the fast one when it loads and passes
its self-check against HF, else HF; and its chat-template renderer (``renderers.py``): the fast one when it
renders the self-check conversations as ``apply_chat_template`` does, else ``apply_chat_template``.
``PromptTokenizer`` runs ``render.render_and_tokenize_sync``, or its two halves: on the event loop for short
prompts, and for long ones whose text is mostly known to the fast encoder (cheaper than the executor hop),
otherwise on an injected, bounded executor with a timeout. Every failure becomes ``TokenizeFailed``: the router
then routes by load and the request still goes through. Both encoders release the GIL while encoding, so worker
threads give real parallelism for the expensive part.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from extproc.prompt.checkpoints import cut_difference
from extproc.prompt.encoders import (
    ENCODER_FAST,
    EncoderChoice,
    FastEncoder,
    HfEncoder,
    NativeHeadStart,
    TextEncoder,
    TokenIds,
    check_corpus,
    self_check,
)
from extproc.prompt.models import BaseModel
from extproc.prompt.openai import ParsedRequest, RequestKind
from extproc.prompt.render import (
    ChatTokenizer,
    TemplateInfo,
    TokenizeFailed,
    encode_prompt,
    prompt_text,
    render_and_tokenize_sync,
    truncate,
)
from extproc.prompt.renderers import TemplateChoice
from extproc.prompt.shadow import ShadowCheck
from extproc.prompt.tokenizer_cache import model_dir

__all__ = ["LoadedTokenizer", "PromptTokenizer", "TokenizeFailed", "TokenizerRegistry", "load_hf_tokenizer"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Loader = Callable[[Path], ChatTokenizer]


def load_hf_tokenizer(folder: Path) -> ChatTokenizer:
    """``AutoTokenizer.from_pretrained(folder, local_files_only=True)``: never touches the network."""
    from transformers import AutoTokenizer  # heavy import, paid once, at first load

    tokenizer: ChatTokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return tokenizer


@dataclass(frozen=True, slots=True)
class EncoderSettings:
    """How models' encoders are chosen (config ``tokenizer.*``)."""

    fast: bool = True  # use a fast encoder where one loads and passes the self-check
    fast_templates: bool = True  # render chat templates with templates.FastTemplate where it passes its self-check
    segment_cache_bytes: int = 64 << 20  # the fast encoder's segment cache; 0 = off
    checkpoint_bytes: int = 32 << 20  # the fast encoder's checkpoints of long texts (checkpoints.py); 0 = off
    shadow: ShadowCheck | None = None  # sampled live comparison with HF (encodings and renders)
    head_start: Callable[[Path], NativeHeadStart | None] = NativeHeadStart.for_folder  # begun before the HF load
    make_fast: Callable[[Any, int, NativeHeadStart | None], TextEncoder | None] = lambda tokenizer, cache_bytes, head: (
        FastEncoder.from_hf(tokenizer, segment_cache_bytes=cache_bytes, head_start=head)
    )  # the fast encoder for a loaded HF tokenizer, or None (a seam for tests)


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    """A base model's HF tokenizer, its renderer and encoder, and what we derived from its template."""

    tokenizer: ChatTokenizer  # the reference for both
    info: TemplateInfo
    encoder: EncoderChoice
    renderer: TemplateChoice


@dataclass(frozen=True, slots=True)
class _Failure:
    message: str
    at_s: float  # monotonic


class TokenizerRegistry:
    """Base model name -> ``LoadedTokenizer``; thread-safe, each model loaded at most once at a time.

    A failed load is remembered for ``retry_after_s`` so a missing folder does not cost a load per request.
    """

    def __init__(
        self,
        cache_root: Path,
        *,
        loader: Loader = load_hf_tokenizer,
        retry_after_s: float = 30.0,
        encoders: EncoderSettings | None = None,
    ) -> None:
        self._root = cache_root
        self._loader = loader
        self._encoders = encoders or EncoderSettings()
        self._retry_after_s = retry_after_s
        self._loaded: dict[str, LoadedTokenizer | _Failure] = {}  # {model name: tokenizer or last failure}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()  # protects _locks

    def get(self, model: BaseModel) -> LoadedTokenizer:
        """The tokenizer of ``model``, loading it on first use (blocking: call from a worker thread).

        Raises ``TokenizeFailed`` when the load fails (or failed less than ``retry_after_s`` ago).
        """
        entry = self._loaded.get(model.name)
        if isinstance(entry, LoadedTokenizer):
            return entry
        with self._lock_for(model.name):
            entry = self._loaded.get(model.name)
            if isinstance(entry, _Failure) and time.monotonic() - entry.at_s < self._retry_after_s:
                raise TokenizeFailed(entry.message)
            if not isinstance(entry, LoadedTokenizer):
                entry = self._load(model)
                self._loaded[model.name] = entry
        if isinstance(entry, _Failure):
            raise TokenizeFailed(entry.message)
        return entry

    def loaded(self, model: BaseModel) -> LoadedTokenizer | None:
        """The tokenizer of ``model`` if it is loaded already (never loads; safe on the event loop)."""
        entry = self._loaded.get(model.name)
        return entry if isinstance(entry, LoadedTokenizer) else None

    def encoders(self) -> list[EncoderChoice]:
        """The encoder choice of every loaded model (for metrics and the log)."""
        return [e.encoder for e in list(self._loaded.values()) if isinstance(e, LoadedTokenizer)]

    def renderers(self) -> list[TemplateChoice]:
        """The chat-template renderer of every loaded model (for metrics and the log)."""
        return [e.renderer for e in list(self._loaded.values()) if isinstance(e, LoadedTokenizer)]

    def segment_stats(self) -> dict[str, dict[str, int]]:
        """{model: its fast encoder's segment-cache counters} for the models that have one."""
        out: dict[str, dict[str, int]] = {}
        for choice in self.encoders():
            stats = choice.fast.cache_stats() if isinstance(choice.fast, FastEncoder) else None
            if stats is not None:
                out[choice.model] = stats
        return out

    def checkpoint_stats(self) -> dict[str, object]:
        """{model: its fast encoder's checkpoint counters (``checkpoints.CheckpointStats``)} where they are on."""
        out: dict[str, object] = {}
        for choice in self.encoders():
            stats = choice.fast.checkpoint_stats() if isinstance(choice.fast, FastEncoder) else None
            if stats is not None:
                out[choice.model] = stats
        return out

    def preload(self, models: list[BaseModel]) -> dict[str, str]:
        """Load every model now (at startup, off the loop); returns {model name: error} for the failures."""
        errors: dict[str, str] = {}
        for model in models:
            try:
                self.get(model)
            except TokenizeFailed as exc:
                errors[model.name] = str(exc)
        return errors

    def _lock_for(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def _load(self, model: BaseModel) -> LoadedTokenizer | _Failure:
        folder = model.tokenizer_dir or model_dir(self._root, model.name)
        head = self._encoders.head_start(folder) if self._encoders.fast else None
        try:
            tokenizer = self._loader(folder)
            info = TemplateInfo.of(tokenizer.chat_template, model.content_format, model.default_chat_template_kwargs)
        except Exception as exc:  # OSError, ValueError, anything a tokenizer folder can throw at us
            return _Failure(f"cannot load the tokenizer of {model.name!r} from {folder}: {exc}", time.monotonic())
        renderer = TemplateChoice.of(
            model.name, tokenizer, fast=self._encoders.fast_templates, shadow=self._encoders.shadow
        )
        return LoadedTokenizer(tokenizer, info, self._choose_encoder(model.name, tokenizer, head), renderer)

    def _choose_encoder(self, name: str, tokenizer: ChatTokenizer, head: NativeHeadStart | None) -> EncoderChoice:
        """HF, or the fast encoder once it equals HF on ``check_corpus`` (a failed check is logged)."""
        reference = HfEncoder(tokenizer)
        choice = EncoderChoice(name, reference, shadow=self._encoders.shadow)
        if not self._encoders.fast:
            return choice
        fast = self._encoders.make_fast(tokenizer, self._encoders.segment_cache_bytes, head)
        if fast is None:
            return choice
        added = [str(getattr(t, "content", t)) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()]
        corpus = check_corpus(added)
        difference = self_check(fast, reference, corpus)
        choice.fast = fast
        if difference is not None:
            choice.fall_back(f"start-up self-check: {difference}")
            return choice
        log.info("model %s: tokenizing with %s (equal to HF tokenizers on the self-check corpus)", name, fast.name)
        if isinstance(fast, FastEncoder) and self._encoders.checkpoint_bytes > 0:
            cut = cut_difference(fast.encode_whole, corpus)
            if cut is None:
                fast.enable_checkpoints(self._encoders.checkpoint_bytes)
            else:
                log.info("model %s: long texts encoded whole (a line break before a letter is no cut: %s)", name, cut)
        return choice


class PromptTokenizer:
    """Renders and tokenizes on the event loop or on a bounded executor (at most ``max_pending`` jobs queued or
    running there).

    Where the work runs, for a model whose tokenizer is loaded with the fast encoder (any other: the executor):
    - a body of at most ``inline_bytes``: all of it on the event loop;
    - a body of at most ``inline_render_bytes``: the template is rendered on the loop, then the text is encoded
      there too if the encoder would encode at most ``inline_bytes`` characters of it afresh
      (``TextEncoder.fresh_chars``: an agent's context that grew by a turn), else on the executor;
    - a larger body: all of it on the executor.

    Why: rendering is Python and holds the GIL wherever it runs, so a worker thread buys the loop only a turn
    every switch interval, while a hop costs two thread wake-ups (~0.2 ms of CPU each on a small VM) and moves
    the request's data to another core. Encoding releases the GIL: a long fresh encode is worth a hop.
    """

    def __init__(
        self,
        registry: TokenizerRegistry,
        executor: Executor,
        *,
        timeout_s: float = 1.0,
        max_pending: int = 64,
        inline_bytes: int = 64 * 1024,
        inline_render_bytes: int = 512 * 1024,
    ) -> None:
        self._registry = registry
        self._executor = executor
        self._inline_bytes = inline_bytes  # ~16K tokens: ~0.3 ms on the fast encoder, about one executor hop
        self._inline_render_bytes = inline_render_bytes
        self._timeout_s = timeout_s
        self._max_pending = max_pending
        self._pending = 0  # touched on the event loop thread only

    @property
    def registry(self) -> TokenizerRegistry:
        return self._registry

    def preload(self, models: list[BaseModel]) -> dict[str, str]:
        """Blocking: load these models' tokenizers now (see ``TokenizerRegistry.preload``)."""
        return self._registry.preload(models)

    async def render_and_tokenize(
        self, parsed: ParsedRequest, base_model: BaseModel, size_hint: int = 0, *, timeout_s: float | None = None
    ) -> TokenIds:
        """Token ids of ``parsed`` for ``base_model``, exactly as vLLM computes them.

        ``size_hint`` (the body's bytes) decides where the work runs (the class docstring). ``timeout_s``
        shortens the configured timeout for work on the executor. Token-id completion prompts return at once.
        Raises ``TokenizeFailed`` on any failure, on timeout, and when ``max_pending`` jobs are already in
        flight.
        """
        if parsed.kind is RequestKind.COMPLETION and isinstance(parsed.prompt, tuple):
            return truncate(list(parsed.prompt), parsed.truncate_prompt_tokens, parsed.truncation_side)
        timeout = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        loaded = self._registry.loaded(base_model)
        if loaded is None or loaded.encoder.name != ENCODER_FAST or size_hint > self._inline_render_bytes:
            return await self._run(lambda: self._tokenize(parsed, base_model), timeout)
        if size_hint <= self._inline_bytes:
            return self._tokenize(parsed, base_model)
        text = prompt_text(loaded.renderer, loaded.info, parsed)
        if loaded.encoder.fresh_chars(text) <= self._inline_bytes:
            return encode_prompt(loaded.encoder, parsed, text)
        return await self._run(lambda: encode_prompt(loaded.encoder, parsed, text), timeout)

    def _tokenize(self, parsed: ParsedRequest, base_model: BaseModel) -> TokenIds:
        loaded = self._registry.get(base_model)
        return render_and_tokenize_sync(loaded.renderer, loaded.info, parsed, loaded.encoder)

    async def _run(self, work: Callable[[], T], timeout_s: float) -> T:
        if self._pending >= self._max_pending:
            raise TokenizeFailed(f"tokenizer busy: {self._pending} jobs in flight")
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, work)
        except RuntimeError as exc:  # executor shut down
            raise TokenizeFailed(f"tokenizer executor unavailable: {exc}") from exc
        self._pending += 1
        future.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise TokenizeFailed(f"tokenization took longer than {timeout_s:.3f}s") from None
        except TokenizeFailed:
            raise
        except Exception as exc:
            raise TokenizeFailed(f"{type(exc).__name__}: {exc}") from exc

    def _done(self, future: asyncio.Future[Any]) -> None:
        self._pending -= 1
        if not future.cancelled():
            future.exception()  # mark retrieved: a timed-out job's late failure is not "never retrieved"
