"""Continuous batching, modelled on vLLM v1's scheduler (FCFS policy). Pure and synchronous.

Each :meth:`Scheduler.schedule` call plans one step within ``max_num_batched_tokens``:

1. running requests first, in order: each gets ``min(tokens not yet computed, budget)`` (a decode gets 1, an
   unfinished prefill a chunk). When KV runs out, the *last* running request is preempted (its blocks
   freed, its
   progress lost, it goes back to the head of the waiting queue) until the allocation fits;
2. then, only if nothing was preempted, waiting requests in FCFS order while ``len(running) <
  max_num_seqs``, the
   budget lasts and at most ``max_loras`` distinct adapters run; each starts after its cached prefix.

:meth:`Scheduler.update` is called when the step's time has passed: requests whose every known token is now
computed sample one (deterministic) token; finished requests free their blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vllm_sim.hashing import BlockHasher
from vllm_sim.kv_cache import KVCacheManager
from vllm_sim.request import FINISH_ABORT, SimRequest
from vllm_sim.timing import StepCost


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Batching limits (vLLM's ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--max-loras``)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_loras: int = 1


@dataclass(slots=True)
class SchedulerStats:
    """Monotonic counters, read by /metrics."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0


@dataclass(slots=True)
class ScheduledStep:
    """One planned step: ``(request, first new token index, number of new tokens)`` per scheduled request."""

    entries: list[tuple[SimRequest, int, int]] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    latest_arrival_s: float = 0.0  # newest arrival among requests admitted in this step

    def cost(self) -> StepCost:
        """The step's work for the timing model: prefill chunks vs single decode tokens."""
        pre_tokens = pre_pairs = dec_seqs = dec_ctx = 0
        for req, start, n in self.entries:
            if n == 1 and req.num_output_tokens > 0 and start == req.num_tokens - 1:
                dec_seqs += 1
                dec_ctx += start + 1
            else:
                pre_tokens += n
                pre_pairs += n * start + n * (n + 1) // 2
        return StepCost(pre_tokens, pre_pairs, dec_seqs, dec_ctx)


class Scheduler:
    """Waiting queue, running set and the KV cache of one engine."""

    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager, hasher: BlockHasher | None) -> None:
        self.cfg = cfg
        self.kv = kv
        self._hasher = hasher
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = SchedulerStats()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: SimRequest) -> None:
        """Queue a new request (hashing its prompt's full blocks when prefix caching is on)."""
        self.hash_prompt(req)
        self.waiting.append(req)

    def hash_prompt(self, req: SimRequest) -> None:
        """Hash the full blocks of ``req`` not hashed yet (idempotent); nothing without prefix caching."""
        if self._hasher is not None:
            self._hasher.extend(req.block_hashes, req.all_token_ids, req.lora, req.cache_salt)

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is (client went away); frees its blocks. Idempotent."""
        if req.finish_reason is not None:
            return
        req.finish_reason = FINISH_ABORT
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)

    def preempt_all(self) -> None:
        """Preempt every running request (before a forced prefix-cache reset)."""
        while self.running:
            self._preempt(self.running.pop())

    def _preempt(self, req: SimRequest) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self.stats.num_preemptions += 1

    def _fit_running(self, req: SimRequest, n: int, step: ScheduledStep) -> bool:
        """Allocate for a running request, preempting from the tail; False if ``req`` itself was preempted."""
        while not self.kv.allocate_slots(req, n, []):
            victim = self.running.pop()
            self._preempt(victim)
            step.preempted.append(victim)
            if victim is req:
                return False
        return True

    def schedule(self) -> ScheduledStep:
        """Plan the next step (mutates queues, KV and ``num_computed_tokens``)."""
        step = ScheduledStep()
        budget = self.cfg.max_num_batched_tokens
        idx = 0
        while idx < len(self.running) and budget > 0:
            req = self.running[idx]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n > 0:
                if not self._fit_running(req, n, step):
                    break
                step.entries.append((req, req.num_computed_tokens, n))
                req.num_computed_tokens += n
                budget -= n
            idx += 1
        if not step.preempted:
            self._admit(step, budget)
        return step

    def _lora_blocked(self, req: SimRequest, loras: set[str]) -> bool:
        return req.lora is not None and req.lora.name not in loras and len(loras) >= self.cfg.max_loras

    def _admit(self, step: ScheduledStep, budget: int) -> None:
        bs = self.kv.pool.block_size
        loras = {r.lora.name for r in self.running if r.lora is not None}
        skipped: list[SimRequest] = []
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            if self._lora_blocked(req, loras):
                skipped.append(self.waiting.popleft())
                continue
            hits = self.kv.computed_blocks(req)
            computed = len(hits) * bs
            if req.num_preemptions == 0 and self.kv.pool.enable_caching:
                self.stats.prefix_cache_queries += req.num_tokens
                self.stats.prefix_cache_hits += computed
            n = min(req.num_tokens - computed, budget)
            if not self.kv.allocate_slots(req, n, hits):
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.lora is not None:
                loras.add(req.lora.name)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed
            step.entries.append((req, computed, n))
            step.latest_arrival_s = max(step.latest_arrival_s, req.arrival_s)
            req.num_computed_tokens = computed + n
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def update(self, step: ScheduledStep, now_s: float) -> list[tuple[SimRequest, int, str | None]]:
        """Finish a step at (virtual) time ``now_s``: sample tokens, retire finished requests.

        Returns ``(request, token id, finish reason or None)`` for every token produced.
        """
        out: list[tuple[SimRequest, int, str | None]] = []
        finished = False
        for req, _, _ in step.entries:
            if req.finish_reason is not None or req.num_computed_tokens < req.num_tokens:
                continue
            token, reason = req.next_output_token()
            req.all_token_ids.append(token)
            if self._hasher is not None and req.num_tokens % self._hasher.block_size == 0:
                self._hasher.extend(req.block_hashes, req.all_token_ids, req.lora, req.cache_salt)
            if req.first_token_s is None:
                req.first_token_s = now_s
            if reason is not None:
                req.finish_reason, req.finish_s, finished = reason, now_s, True
                self.kv.free(req)
            out.append((req, token, reason))
        if finished:
            self.running = [r for r in self.running if r.finish_reason is None]
        return out
