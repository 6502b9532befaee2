"""What the router's front half is built from, in one place for both callers: the composition root (one
picker process) and a front worker process (``extproc.workers.front``).

``build_front`` makes the preparer (parse, render, tokenize; the shadow tokenizer check), the block hasher with
its prefix cache, their executors and the tokenizer metrics; ``router_settings`` and ``processor_options`` map
the config to the router's and the ext_proc server's settings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from extproc.config import RedisIndexConfig, RouterConfig
from extproc.decider import DeciderSettings
from extproc.diagnostics.live import PrefixStabilityCollector, SampledDiagnostics
from extproc.kvcache.hash_cache import CachedHasher, HashCacheStats
from extproc.kvcache.hashing import BlockHasher
from extproc.observability import RouterMetrics, TokenizerCollector
from extproc.prompt.preparer import RequestPreparer, build_preparer
from extproc.prompt.shadow import ShadowCheck
from extproc.protocol.exchange import ProcessorOptions
from extproc.router import FrontDeps, PendingHashes, RouterSettings
from extproc.types import BlockHash, HashScheme, LoraAdapter

log = logging.getLogger(__name__)


class HasherCache:
    """One ``CachedHasher`` per scheme (each keeps its token memo and prefix cache), as the router's ``Hasher``.

    ``max_bytes`` bounds each scheme's prefix cache (a fleet has one scheme per model pool, usually one).
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._max_bytes = max_bytes
        self._hashers: dict[HashScheme, CachedHasher] = {}

    def start(
        self, scheme: HashScheme, tokens: Sequence[int], lora: LoraAdapter | None, salt: str | None
    ) -> PendingHashes:
        return self._for(scheme).start(tokens, lora=lora, cache_salt=salt)

    def finish(self, scheme: HashScheme, pending: PendingHashes) -> list[BlockHash]:
        return self._for(scheme).finish(pending)  # type: ignore[arg-type]

    def stats(self) -> list[tuple[str, HashCacheStats]]:
        """Each scheme's cache counters, labelled ``algo/block_size``."""
        return [(f"{s.algo}/{s.block_size}", h.stats) for s, h in list(self._hashers.items())]

    def _for(self, scheme: HashScheme) -> CachedHasher:
        hasher = self._hashers.get(scheme)
        if hasher is None:
            hasher = self._hashers.setdefault(scheme, CachedHasher(BlockHasher(scheme), max_bytes=self._max_bytes))
        return hasher


@dataclass
class FrontParts:
    """The front half's objects; ``shutdown()`` stops its executors."""

    deps: FrontDeps
    preparer: RequestPreparer
    executors: tuple[ThreadPoolExecutor, ...]
    diagnostics: SampledDiagnostics | None  # prefix stability, None when ``diagnostics.sample_fraction`` is 0

    def shutdown(self) -> None:
        for executor in self.executors:
            executor.shutdown(wait=False, cancel_futures=True)


def build_front(
    config: RouterConfig, base_dir: Path, metrics: RouterMetrics, scheme_for: Callable[[str], HashScheme]
) -> FrontParts:
    """The preparer, the hasher and their executors, with the tokenizer metrics registered on ``metrics``."""
    tokenize = ThreadPoolExecutor(config.limits.tokenizer_workers, thread_name_prefix="tokenize")
    # Hashing gets its own thread: behind busy tokenizer threads it queued for tens of ms under load.
    hashing = ThreadPoolExecutor(1, thread_name_prefix="hash")
    # Shadow checks (HF re-encodes and re-renders of sampled requests) never queue behind or ahead of requests.
    checks = ThreadPoolExecutor(1, thread_name_prefix="tokcheck")

    def count_check(model: str, check: str, matched: bool) -> None:
        metrics.tokenizer_checks.labels(model, check, "match" if matched else "mismatch").inc()

    def count_skip(model: str, check: str) -> None:
        metrics.tokenizer_checks.labels(model, check, "skipped").inc()

    shadow = ShadowCheck(
        config.tokenizer.verify_fraction, checks, on_result=count_check, on_skip=count_skip,
        max_cpu_share=config.tokenizer.verify_cpu_share,
    )  # fmt: skip
    preparer = build_preparer(config, base_dir, tokenize, shadow)
    hasher = HasherCache(config.tokenizer.hash_cache_mib << 20)
    metrics.registry.register(
        TokenizerCollector(
            preparer.tokenizers.encoders,
            preparer.tokenizers.segment_stats,
            hasher.stats,
            preparer.tokenizers.renderers,
            preparer.tokenizers.checkpoint_stats,
        )
    )
    diagnostics = _diagnostics(config, metrics)
    deps = FrontDeps(
        preparer=preparer, hasher=hasher, scheme_for=scheme_for, metrics=metrics, executor=hashing,
        diagnose=diagnostics.offer if diagnostics else None,
    )  # fmt: skip
    return FrontParts(deps, preparer, (tokenize, hashing, checks), diagnostics)


def _diagnostics(config: RouterConfig, metrics: RouterMetrics) -> SampledDiagnostics | None:
    """Prefix-stability diagnostics (sampled), labelled by tenant class: a configured id, else "default".
    With front workers each front diagnoses its own share of the traffic."""
    if config.diagnostics.sample_fraction <= 0:
        return None
    classes = frozenset(config.tenants.classes)
    diagnostics = SampledDiagnostics(
        config.diagnostics,
        lambda t: t if t in classes else "default",
        defer=lambda work: asyncio.get_running_loop().call_soon(work),  # after the pick is answered
    )
    metrics.registry.register(PrefixStabilityCollector(diagnostics.detector))
    return diagnostics


async def warm_up(parts: FrontParts, models: Sequence[str]) -> None:
    """Load every model's tokenizer (one that fails routes by load, said once), then let the diagnostics find
    each model's message marker, so that a span found live names its chat message."""
    failed = await parts.preparer.warm_up()
    for model, error in failed.items():
        log.warning("tokenizer for %s failed to load (%s): its requests route by load", model, error)
    if parts.diagnostics is not None:
        await parts.diagnostics.probe_markers(parts.preparer, [m for m in models if m not in failed])


def router_settings(config: RouterConfig) -> RouterSettings:
    """The router's settings from the validated config."""
    return RouterSettings(
        tenant_header=config.tenants.header.lower(),
        max_blocks=config.index.max_blocks,
        use_index=config.index.enabled,
        answer_budget_s=config.limits.answer_budget_s,
        decider=DeciderSettings(
            stale_after_s=config.scrape.stale_after_s,
            lookup_deadline_s=config.index.lookup_deadline_s,
            approx_ttl_s=config.index.approx_ttl_s,
            burst_mark_ttl_s=config.index.burst_mark_ttl_s,
            log_prompts=config.logging.log_prompts,
            track_served=not config.protocol.close_after_pick,
            reserve_redecisions=config.index.reserve_redecisions if isinstance(config.index, RedisIndexConfig) else 0,
            share_busy=config.index.share_busy if isinstance(config.index, RedisIndexConfig) else False,
        ),
    )


def processor_options(config: RouterConfig) -> ProcessorOptions:
    """The ext_proc server's per-stream options from the validated config."""
    return ProcessorOptions(
        max_body_bytes=config.limits.max_body_bytes,
        close_after_pick=config.protocol.close_after_pick,
    )
