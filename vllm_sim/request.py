"""One request's engine-side state (vLLM's ``Request``), and the sink its outputs go to."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from vllm_sim.hashing import BlockHash, LoraKey

FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_ABORT = "abort"


class OutputStream:
    """Where the engine delivers a request's tokens; the HTTP handler drains it.

    ``wake_every``: 0 wakes the reader only at the end (non-streaming); N wakes it for the first token, then
    whenever N tokens are pending (vLLM's ``--stream-interval``). Tokens pushed between two reads coalesce into
    one delta, as vLLM's output collector does when the client lags. Touched only from the event-loop thread.
    """

    __slots__ = ("_event", "_pending", "_sent_any", "_wake_every", "finish_reason")

    def __init__(self, wake_every: int = 1) -> None:
        self._wake_every = wake_every
        self._sent_any = False
        self._pending: list[int] = []
        self._event = asyncio.Event()
        self.finish_reason: str | None = None

    def _ready(self) -> bool:
        if self._wake_every == 0:
            return False
        return len(self._pending) >= (self._wake_every if self._sent_any else 1)

    def push(self, token_id: int, finish_reason: str | None) -> None:
        """Called by the engine once per generated token, after the step that produced it."""
        self._pending.append(token_id)
        if finish_reason is not None:
            self.finish_reason = finish_reason
            self._event.set()
        elif self._ready():
            self._event.set()

    def close(self, finish_reason: str) -> None:
        """End the stream without a token (abort)."""
        self.finish_reason = finish_reason
        self._event.set()

    async def next_delta(self) -> tuple[list[int], str | None]:
        """Wait for the next delta; returns (tokens since the last call, finish reason or None)."""
        while self.finish_reason is None and not self._ready():
            await self._event.wait()
            self._event.clear()
        out, self._pending = self._pending, []
        self._sent_any = self._sent_any or bool(out)
        return out, self.finish_reason


@dataclass(eq=False, slots=True)
class SimRequest:
    """Engine state of one request. ``output_len`` is resolved at admission from max/min tokens and EOS rules."""

    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    eos_at_end: bool
    lora: LoraKey | None
    cache_salt: str | None
    arrival_s: float
    sink: OutputStream
    filler: tuple[int, ...]
    eos_token_id: int
    all_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_blocks: int = 0
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    scheduled_s: float | None = None  # start of the first step that ran it (vLLM's queue/prefill boundary)
    first_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens so far."""
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    def next_output_token(self) -> tuple[int, str | None]:
        """The deterministic next token and, if it ends the request, the finish reason."""
        k = self.num_output_tokens
        if k + 1 >= self.output_len:
            if self.eos_at_end:
                return self.eos_token_id, FINISH_STOP
            return self.filler[k % len(self.filler)], FINISH_LENGTH
        return self.filler[k % len(self.filler)], None
