"""The engine loop of one simulated server: schedule, wait out the step's modelled time, update, publish.

Steps run on a virtual timeline. A step starts when the previous one ended, or at the arrival of the newest
request it admits if that is later (an idle engine), and lasts ``timing.step_time_s(cost) * time_scale``;
the loop sleeps until that absolute deadline, so wake-up lag does not accumulate. If the process falls more
than ``max_lag_s`` behind (CPU saturated), the timeline is re-anchored to the wall clock. Each request keeps
the model's own arrival, first-token and finish times, so a benchmark can compare them with what a client
measured (``GET /sim/requests``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_sim.events import EventRecord
from vllm_sim.hashing import BlockHasher, HashAlgo
from vllm_sim.kv_cache import BlockPool, KVCacheManager
from vllm_sim.request import FINISH_ABORT, SimRequest
from vllm_sim.scheduler import Scheduler, SchedulerConfig
from vllm_sim.timing import TimingProfile

log = logging.getLogger(__name__)
# epoll waits in whole milliseconds, rounded up, so asyncio wakes 0-1 ms after a deadline; aiming half a
# millisecond early centres the wake-up error on zero instead of adding ~0.5 ms to every step.
_TIMER_SLACK_S = 0.0005


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one engine needs besides its collaborators."""

    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    enable_prefix_caching: bool
    hash_algo: HashAlgo
    hash_seed: str
    scheduler: SchedulerConfig
    record_events: bool = False
    time_scale: float = 1.0
    max_lag_s: float = 0.05
    request_log_size: int = 10_000


class EventSink(Protocol):
    """Receives one step's KV event records (the ZMQ publisher)."""

    def publish(self, records: list[EventRecord]) -> None: ...


class EngineObserver(Protocol):
    """Receives request milestones (the metrics)."""

    def on_first_token(self, req: SimRequest, ttft_s: float) -> None: ...

    def on_finished(self, req: SimRequest, e2e_s: float) -> None: ...


def request_record(req: SimRequest) -> dict[str, Any]:
    """The model's view of a finished (or running) request, for ``GET /sim/requests``."""
    ttft = None if req.first_token_s is None else req.first_token_s - req.arrival_s
    e2e = None if req.finish_s is None else req.finish_s - req.arrival_s
    queue = None if req.scheduled_s is None else req.scheduled_s - req.arrival_s
    return {
        "arrival_s": req.arrival_s,  # the engine loop's clock (monotonic): orders one server's requests
        "prompt_tokens": len(req.prompt_token_ids),
        "cached_tokens": max(req.num_cached_tokens, 0),
        "output_tokens": req.num_output_tokens,
        "num_preemptions": req.num_preemptions,
        "model_ttft_s": ttft,
        "model_queue_s": queue,  # arrival → the first step that ran it (the rest of the TTFT is its prefill)
        "model_e2e_s": e2e,
        "finish_reason": req.finish_reason,
    }


class Engine:
    """One server's engine: owns the scheduler, the block pool and the loop task."""

    def __init__(
        self,
        cfg: EngineConfig,
        timing: TimingProfile,
        events: EventSink | None = None,
        observer: EngineObserver | None = None,
    ) -> None:
        self.cfg = cfg
        self.timing = timing
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.block_size, cfg.enable_prefix_caching, cfg.record_events)
        hasher = BlockHasher(cfg.hash_algo, cfg.hash_seed, cfg.block_size) if cfg.enable_prefix_caching else None
        self.scheduler = Scheduler(cfg.scheduler, KVCacheManager(self.pool, cfg.max_model_len), hasher)
        self._events = events
        self._observer = observer
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed = False
        # {request id: live request, or its compact record once finished}; bounded, oldest dropped first
        self._log: OrderedDict[str, SimRequest | dict[str, Any]] = OrderedDict()

    # --- lifecycle

    def set_observer(self, observer: EngineObserver) -> None:
        """Attach the metrics (they need the engine first, hence not a constructor argument)."""
        self._observer = observer

    def start(self) -> None:
        """Start the loop task in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="vllm-sim-engine")

    async def stop(self) -> None:
        """Cancel the loop and wait for it."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --- API for the server

    @property
    def healthy(self) -> bool:
        """False once the loop has failed (``/health`` then answers 500, as vLLM's dead engine does)."""
        return not self._failed

    def submit(self, req: SimRequest) -> None:
        """Queue a request; its tokens arrive on ``req.sink`` (an engine that failed ends it at once)."""
        if self._failed:
            req.finish_reason = FINISH_ABORT
            req.sink.close(FINISH_ABORT)
            return
        self.scheduler.add(req)
        self._log[req.request_id] = req
        while len(self._log) > self.cfg.request_log_size:
            self._log.popitem(last=False)
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        """Drop a request whose client went away."""
        self.scheduler.abort(req)
        self._retire(req)
        self._flush_events()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's prefix-cache reset: only when no block is in use unless running requests are preempted."""
        if reset_running_requests:
            self.scheduler.preempt_all()
        ok = self.pool.reset()
        # No flush here: vLLM queues the AllBlocksCleared and publishes it with the next engine step's batch
        # (scheduler.update_from_output), so a reset on an idle engine reaches subscribers only when the
        # engine serves again (seen on vLLM 0.32's CPU build).
        if not ok:
            log.warning("prefix cache not reset: blocks are still in use")
        return ok

    def missing_prefix_blocks(self, req: SimRequest) -> int:
        """P/D decode leg, before the pull: the prompt's usable full blocks this engine does not hold."""
        self.scheduler.hash_prompt(req)
        usable = (req.num_tokens - 1) // self.cfg.block_size
        return max(usable - len(self.scheduler.kv.computed_blocks(req)), 0)

    def receive_prefix_blocks(self, req: SimRequest) -> int:
        """P/D decode leg, after the pull: store the prompt's missing full blocks as cached (``BlockStored``
        goes out now), so that the request, submitted next, prefills only its tail. Returns the blocks stored
        (0 when KV is short: the request then computes them)."""
        kv, pool = self.scheduler.kv, self.pool
        if not pool.enable_caching:
            return 0
        self.scheduler.hash_prompt(req)
        hits = kv.computed_blocks(req)
        missing = (req.num_tokens - 1) // self.cfg.block_size - len(hits)
        evictable_hits = sum(1 for b in hits if pool.ref_count(b) == 0)
        if missing <= 0 or missing > pool.num_free - evictable_hits:
            return 0
        pool.touch(hits)
        req.block_ids = [*hits, *pool.allocate(missing)]
        req.num_cached_blocks = len(hits)
        pool.cache_full_blocks(req, len(req.block_ids))
        kv.free(req)  # cached and free (evictable) until the request takes them again at admission
        self._flush_events()
        return missing

    def records(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Model-side timings of recent requests by id (unknown ids are left out)."""
        out: dict[str, dict[str, Any]] = {}
        for i in ids:
            entry = self._log.get(i)
            if entry is not None:
                out[i] = request_record(entry) if isinstance(entry, SimRequest) else entry
        return out

    def _retire(self, req: SimRequest) -> None:
        """Swap a finished request for its compact record (drops its token lists)."""
        if req.request_id in self._log:
            self._log[req.request_id] = request_record(req)

    # --- the loop

    def _flush_events(self) -> None:
        records = self.pool.take_events()
        if records and self._events is not None:
            self._events.publish(records)

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:  # a bug must not leave clients waiting forever
            log.exception("engine loop failed; aborting every request")
            self._failed = True
            for req in [*self.scheduler.running, *self.scheduler.waiting]:
                self.scheduler.abort(req)
                req.sink.close(FINISH_ABORT)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.scheduler.has_work():
                self._wake.clear()
                await self._wake.wait()  # the next step starts at the newest arrival (below)
            step = self.scheduler.schedule()
            if not step.entries:
                log.error("engine stalled with %d waiting requests", len(self.scheduler.waiting))
                await asyncio.sleep(0.01)
                continue
            start = max(deadline, step.latest_arrival_s)
            if loop.time() - start > self.cfg.max_lag_s:
                start = loop.time()
            end = start + self.timing.step_time_s(step.cost()) * self.cfg.time_scale
            for req, _, _ in step.entries:
                if req.scheduled_s is None:
                    req.scheduled_s = start
            await asyncio.sleep(max(end - loop.time() - _TIMER_SLACK_S, 0.0))
            self._deliver(self.scheduler.update(step, end))
            self._flush_events()
            deadline = end

    def _deliver(self, outputs: list[tuple[SimRequest, int, str | None]]) -> None:
        obs = self._observer
        for req, token, reason in outputs:
            req.sink.push(token, reason)
            if reason is not None:
                self._retire(req)
            if obs is None:
                continue
            if req.num_output_tokens == 1 and req.first_token_s is not None:
                obs.on_first_token(req, req.first_token_s - req.arrival_s)
            if reason is not None and req.finish_s is not None:
                obs.on_finished(req, req.finish_s - req.arrival_s)
