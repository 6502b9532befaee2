"""Composition root: builds every object from a validated ``RouterConfig`` and owns every background task.

Nothing else constructs long-lived objects or starts loops. ``App.start()`` brings the service up (scraping,
event subscriptions, tokenizers, the gRPC server, the metrics endpoint); ``App.stop()`` takes it down in reverse.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from extproc.backends.dns import DnsDiscovery, DnsResolver, system_nameserver
from extproc.backends.inflight import InflightLoad
from extproc.backends.registry import EndpointRegistry
from extproc.backends.scraper import Scraper
from extproc.config import EndpointConfig, RouterConfig
from extproc.diagnostics.live import PrefixStabilityCollector, SampledDiagnostics
from extproc.indexes import build_indexes
from extproc.kvcache.feed import EventFeed
from extproc.kvcache.hash_cache import CachedHasher, HashCacheStats
from extproc.kvcache.hashing import BlockHasher
from extproc.kvcache.subscriber import EventSource
from extproc.lifecycle import EndpointLifecycle
from extproc.observability import CountersCollector, PreciseGauge, RouterMetrics, TokenizerCollector
from extproc.prompt.encoders import ShadowCheck
from extproc.prompt.preparer import build_preparer
from extproc.protocol.exchange import ProcessorOptions
from extproc.protocol.server import RunningServer, start_server
from extproc.resolvers import SchemeResolver, TenantResolver
from extproc.router import PendingHashes, Router, RouterDeps, RouterSettings
from extproc.scheduling.build import build_profile
from extproc.types import BlockHash, Endpoint, EndpointId, HashScheme, LoraAdapter

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


def sources_from_config(endpoints: Iterable[EndpointConfig]) -> list[EventSource]:
    """One ``EventSource`` per endpoint whose config names a KV-event publisher."""
    return [
        EventSource(
            endpoint=EndpointId(e.address),
            address=e.kv_events.endpoint,
            replay_address=e.kv_events.replay_endpoint,
            topic=e.kv_events.topic,
        )
        for e in endpoints
        if e.kv_events is not None
    ]


class App:
    """The running service. ``grpc_port`` / ``metrics_port`` are the bound ports once started."""

    def __init__(self, config: RouterConfig, *, base_dir: Path | None = None) -> None:
        self.config = config
        self._base = base_dir or Path.cwd()
        endpoints = [Endpoint(EndpointId(e.address), models=frozenset(e.models)) for e in config.endpoints]
        self.registry = EndpointRegistry(endpoints)
        self.inflight = InflightLoad(config.scheduling.prefill_tokens_per_s)
        self.metrics = RouterMetrics(CollectorRegistry())
        self.indexes = build_indexes(config.index, self._approx_capacity, config.scheduling.prefill_tokens_per_s)
        self.precise, self.approx = self.indexes.precise, self.indexes.approx
        self.shared_load = self.indexes.shared_load
        self.executor = ThreadPoolExecutor(config.limits.tokenizer_workers, thread_name_prefix="tokenize")
        # Hashing gets its own thread: behind busy tokenizer threads it queued for tens of ms under load.
        self.hash_executor = ThreadPoolExecutor(1, thread_name_prefix="hash")
        # Shadow tokenizer checks (HF re-encodes of sampled requests) never queue behind or ahead of requests.
        self.check_executor = ThreadPoolExecutor(1, thread_name_prefix="tokcheck")
        self.scraper = Scraper(
            self.registry,
            {EndpointId(e.address): f"http://{e.address}" for e in config.endpoints},
            metrics_urls={EndpointId(e.address): e.metrics_url or "" for e in config.endpoints},
            interval_s=config.scrape.interval_s,
            timeout_s=config.scrape.timeout_s,
            discover_interval_s=config.scrape.discover_interval_s,
            on_scrape=self.inflight.scraped,
            on_down=lambda eid: self.lifecycle.down(eid),
        )
        self.discovery = self._build_discovery()
        self.schemes = SchemeResolver({m.name: m for m in config.models}, self.registry)
        self.feed = EventFeed(
            sources_from_config(config.endpoints), self.indexes.writes, self.approx, self._scheme_of,
            leases=self.indexes.leases,
        )  # fmt: skip
        self.lifecycle = EndpointLifecycle(self.registry, self.scraper.set_targets, self.feed, self.indexes,
                                           self.inflight)  # fmt: skip
        self.metrics.registry.register(CountersCollector("router_kv", self._kv_counters))
        self.metrics.registry.register(
            PreciseGauge(lambda: len(self.feed.precise_endpoints() & self.registry.snapshot().keys()))
        )
        self.router = Router(
            self._router_deps(),
            RouterSettings(
                stale_after_s=config.scrape.stale_after_s,
                lookup_deadline_s=config.index.lookup_deadline_s,
                approx_ttl_s=config.index.approx_ttl_s,
                burst_mark_ttl_s=config.index.burst_mark_ttl_s,
                tenant_header=config.tenants.header.lower(),
                max_blocks=config.index.max_blocks,
                use_index=config.index.enabled,
                log_prompts=config.logging.log_prompts,
                track_served=not config.protocol.close_after_pick,
                answer_budget_s=config.limits.answer_budget_s,
            ),
        )
        self._server: RunningServer | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.grpc_port = 0
        self.metrics_port = 0

    def _build_discovery(self) -> DnsDiscovery | None:
        dns = self.config.discovery.dns
        if dns is None:
            return None
        if dns.nameserver:
            host, _, port = dns.nameserver.rpartition(":")
            nameserver = (host.strip("[]"), int(port))
        else:
            nameserver = system_nameserver()
        resolver = DnsResolver(nameserver, timeout_s=dns.timeout_s)
        return DnsDiscovery(resolver, dns.name, dns.port, interval_s=dns.interval_s, on_change=self._discovered)

    def _discovered(self, found: frozenset[EndpointId]) -> None:
        """Discovery changed the set: static endpoints plus ``found`` (``EndpointLifecycle.discovered``); a
        discovered endpoint's KV events are followed when ``discovery.dns.kv_events`` names them (with its IP)."""
        static = {EndpointId(e.address): frozenset(e.models) for e in self.config.endpoints}
        self.lifecycle.discovered(static, found, self._discovered_events)

    def _discovered_events(self, eid: EndpointId) -> EventSource | None:
        dns = self.config.discovery.dns
        kv = dns.kv_events_for(eid.rpartition(":")[0]) if dns else None
        return None if kv is None else EventSource(eid, kv.endpoint, kv.replay_endpoint, topic=kv.topic)

    def _kv_counters(self) -> list[tuple[str, object]]:
        """The write path's counters, exported as ``router_kv_<group>_<field>``."""
        return [*self.feed.counters(), *self.indexes.counters]

    def _scheme_of(self, eid: EndpointId) -> HashScheme | None:
        """The hash scheme an endpoint's engine should use: that of the (first) model it serves."""
        state = self.registry.snapshot().get(eid)
        models = sorted(state.endpoint.models) if state and state.endpoint.models else []
        return self.schemes(models[0] if models else self.config.models[0].name)

    def _approx_capacity(self, eid: EndpointId) -> int:
        state = self.registry.snapshot().get(eid)
        known = state.endpoint.num_gpu_blocks if state else None
        return known or self.config.index.approx_capacity_blocks

    def _count_tokenizer_check(self, model: str, matched: bool) -> None:
        self.metrics.tokenizer_checks.labels(model, "match" if matched else "mismatch").inc()

    def _router_deps(self) -> RouterDeps:
        config = self.config
        shadow = ShadowCheck(
            config.tokenizer.verify_fraction, self.check_executor,
            on_result=self._count_tokenizer_check,
        )  # fmt: skip
        self.preparer = build_preparer(config, self._base, self.executor, shadow)
        hasher = HasherCache(config.tokenizer.hash_cache_mib << 20)
        self.metrics.registry.register(
            TokenizerCollector(self.preparer.tokenizers.encoders, self.preparer.tokenizers.segment_stats, hasher.stats)
        )
        self.diagnostics = self._build_diagnostics()
        return RouterDeps(
            preparer=self.preparer,
            hasher=hasher,
            scheme_for=self.schemes,
            tenant_for=TenantResolver(config.tenants),
            registry=self.registry,
            inflight=self.inflight,
            precise=self.precise,
            approx=self.approx,
            precise_endpoints=self.feed.precise_endpoints,
            profile=build_profile(config.scheduling),
            metrics=self.metrics,
            executor=self.hash_executor,
            shared_load=self.shared_load,
            has_live_events=self.feed.has_live_events,
            diagnose=self.diagnostics.offer if self.diagnostics else None,
        )

    def _build_diagnostics(self) -> SampledDiagnostics | None:
        """Prefix-stability diagnostics (sampled), labelled by tenant class: a configured id, else "default"."""
        config = self.config
        if config.diagnostics.sample_fraction <= 0:
            return None
        classes = frozenset(config.tenants.classes)
        diagnostics = SampledDiagnostics(
            config.diagnostics,
            lambda t: t if t in classes else "default",
            defer=lambda work: asyncio.get_running_loop().call_soon(work),  # after the pick is answered
        )
        self.metrics.registry.register(PrefixStabilityCollector(diagnostics.detector))
        return diagnostics

    async def start(self) -> None:
        """Start scraping, serve gRPC (readiness NOT_SERVING until the first scrape round), serve metrics."""
        listen = self.config.listen
        if self.discovery is not None:
            await self.discovery.start()
        await self.scraper.start()
        self.feed.start()
        failed = await self.preparer.warm_up()
        for model, error in failed.items():
            log.warning("tokenizer for %s failed to load (%s): its requests route by load", model, error)
        if self.diagnostics is not None:  # so that a span found live names its chat message
            await self.diagnostics.probe_markers(
                self.preparer, [m.name for m in self.config.models if m.name not in failed]
            )
        options = ProcessorOptions(
            max_body_bytes=self.config.limits.max_body_bytes,
            close_after_pick=self.config.protocol.close_after_pick,
        )
        self._server = await start_server(
            self.router, host=listen.host, port=listen.grpc_port, options=options, ready=False
        )
        self.grpc_port = self._server.port
        if listen.metrics_port is not None:
            await self._serve_metrics(listen.host, listen.metrics_port)
        await self._wait_first_scrape(timeout_s=2.0)
        await self._server.set_ready(True)
        log.info(
            "extproc: serving ext_proc on %s:%d, metrics on %s",
            listen.host,
            self.grpc_port,
            self.metrics_port or "off",
        )

    async def _wait_first_scrape(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if all(s.metrics is not None or s.failures for s in self.registry.snapshot().values()):
                return
            await asyncio.sleep(0.02)

    async def _serve_metrics(self, host: str, port: int) -> None:
        async def handle(_: web.Request) -> web.Response:
            for eid, state in self.registry.snapshot().items():
                self.metrics.endpoint_healthy.labels(eid).set(1 if state.endpoint.healthy else 0)
            body = generate_latest(self.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", handle)
        self._metrics_runner = web.AppRunner(app, access_log=None)
        await self._metrics_runner.setup()
        site = web.TCPSite(self._metrics_runner, host, port)
        await site.start()
        addresses = self._metrics_runner.addresses
        self.metrics_port = int(addresses[0][1]) if addresses else port

    async def stop(self) -> None:
        """Take the service down in reverse: no new requests or endpoints, then drain the background writes
        (the router's, the lifecycle's cleanups), stop the event feed, close the indexes."""
        if self.discovery is not None:
            await self.discovery.stop()
        if self._server:
            await self._server.stop(grace_s=1.0)
        if self._metrics_runner:
            await self._metrics_runner.cleanup()
        await self.scraper.stop()
        await self.router.drain()
        await self.lifecycle.stop()
        await self.feed.stop()
        await self.indexes.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.hash_executor.shutdown(wait=False, cancel_futures=True)
        self.check_executor.shutdown(wait=False, cancel_futures=True)
