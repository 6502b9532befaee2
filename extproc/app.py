"""Composition root: builds every object from a validated ``RouterConfig`` and owns every background task.

Nothing else constructs long-lived objects or starts loops. ``App.start()`` brings the service up (scraping,
event subscriptions, tokenizers, the gRPC server, the metrics endpoint); ``App.stop()`` takes it down in reverse.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from extproc.authz import AuthzOptions, start_authz_server
from extproc.backends.calibration import CostLearning, TtftCalibration
from extproc.backends.dns import DnsDiscovery, DnsResolver, system_nameserver
from extproc.backends.hot_blocks import HotBlocks
from extproc.backends.inflight import InflightLoad
from extproc.backends.registry import EndpointRegistry
from extproc.backends.scraper import Scraper
from extproc.config import DEFAULT_CLASS, DnsDiscoveryConfig, EndpointConfig, RouterConfig, SchedulingConfig
from extproc.decider import DeciderDeps, LocalDecider
from extproc.diagnostics.report import render_section
from extproc.front_build import build_front, processor_options, router_settings, warm_up
from extproc.indexes import build_indexes
from extproc.kvcache.feed import EventFeed
from extproc.kvcache.gate import CacheObserver, ObservedWrites
from extproc.kvcache.occupancy import Occupancy
from extproc.kvcache.subscriber import EventSource, SubscriberOptions
from extproc.lifecycle import EndpointLifecycle
from extproc.observability import CountersCollector, PreciseGauge, RouterMetrics
from extproc.protocol.server import ExtProcServer, start_ext_proc
from extproc.resolvers import SchemeResolver, TenantResolver
from extproc.router import Router
from extproc.scheduling.build import build_pd, build_profile, estimator_params
from extproc.scheduling.estimate import configured_cost
from extproc.status.ceiling import CeilingEstimator
from extproc.status.service import FleetStatus
from extproc.status.tap import DecisionTap, tenant_classes
from extproc.status.tenant_cache import TenantCacheCollector
from extproc.status.tenant_cache import render_section as render_tenant_cache
from extproc.status.view import Sources
from extproc.types import DueCall, Endpoint, EndpointId, HashScheme, Role
from extproc.workers import FrontWorkers

log = logging.getLogger(__name__)


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


def tenant_occupancy(config: RouterConfig) -> Occupancy | None:
    """The per-class cache bookkeeping, when tenant classes are configured (``TenantsConfig.attributed``)."""
    tenants = config.tenants
    if not tenants.attributed:
        return None
    protected = {name for name, c in tenants.classes.items() if c.protect_hot_prefixes}
    if tenants.default.protect_hot_prefixes:
        protected.add(DEFAULT_CLASS)
    return Occupancy(config.scheduling.prefill_tokens_per_s, protected.__contains__)


class App:
    """The running service. ``grpc_port`` / ``metrics_port`` are the bound ports once started."""

    def __init__(
        self, config: RouterConfig, *, base_dir: Path | None = None, before_ready: Callable[[], None] | None = None
    ) -> None:
        """``before_ready``: called once in ``start``, after the warm-up and before readiness (the process main's
        ``process.freeze_startup_heap``)."""
        self.config = config
        self._base = base_dir or Path.cwd()
        self._before_ready = before_ready
        endpoints = [
            Endpoint(EndpointId(e.address), models=frozenset(e.models), role=Role(e.role)) for e in config.endpoints
        ]
        self.registry = EndpointRegistry(endpoints)
        self.inflight = InflightLoad(config.scheduling.prefill_tokens_per_s)
        self.tap = DecisionTap(tenant_classes(config.tenants.classes), CeilingEstimator())
        self.metrics = RouterMetrics(CollectorRegistry(), self.tap)
        self.indexes = build_indexes(config.index, self._approx_capacity, config.scheduling.prefill_tokens_per_s)
        touches = self.indexes.touches
        # per endpoint, the cached blocks recent requests hit (with replicas, every replica's requests)
        hot_sets = touches if self.indexes.share_hot_sets else None
        self.hot_blocks = HotBlocks(self._kv_blocks, on_touch=None if hot_sets is None else hot_sets.publish)
        self.precise, self.approx = self.indexes.precise, self.indexes.approx
        self.shared_load = self.indexes.shared_load
        self.scraper = Scraper(
            self.registry,
            {EndpointId(e.address): f"http://{e.address}" for e in config.endpoints},
            metrics_urls={EndpointId(e.address): e.metrics_url or "" for e in config.endpoints},
            interval_s=config.scrape.interval_s,
            timeout_s=config.scrape.timeout_s,
            discover_interval_s=config.scrape.discover_interval_s,
            narrow_pages=config.scrape.narrow_pages,
            deferred_reads=config.scrape.deferred_reads,
            on_send=self.inflight.scrape_sent,
            on_scrape=self.inflight.scraped,
            on_down=lambda eid: self.lifecycle.down(eid),
            on_round=self._on_round,
        )
        self.discoveries = [self._dns_discovery(i, dns) for i, dns in enumerate(config.discovery.names())]
        self._found: dict[int, frozenset[EndpointId]] = {}  # {discovery index: what it found last}
        self._pool_of: dict[EndpointId, DnsDiscoveryConfig] = {}  # discovered endpoint -> the name that found it
        self.schemes = SchemeResolver({m.name: m for m in config.models}, self.registry)
        self.occupancy = tenant_occupancy(config)
        observers: list[CacheObserver] = [self.hot_blocks]  # hot sets and occupancy follow the engines' caches
        observers += [] if self.occupancy is None else [self.occupancy]
        writes = ObservedWrites(self.indexes.writes, observers)
        self.feed = EventFeed(
            sources_from_config(config.endpoints), writes, self.approx, self._scheme_of, leases=self.indexes.leases,
            options=SubscriberOptions(paced=config.scrape.paced_kv_events),
        )  # fmt: skip
        shared = touches.publish_prediction if touches is not None and self.indexes.share_predictions else None
        self.calibration = TtftCalibration(self.metrics, cost_learning(config.scheduling), on_predicted=shared)
        forgets = [self.calibration.forget, self.hot_blocks.cleared]
        forgets += [] if self.occupancy is None else [self.occupancy.cleared]
        self.lifecycle = EndpointLifecycle(self.registry, self.scraper.set_targets, self.feed, self.indexes,
                                           self.inflight, forgets)  # fmt: skip
        self.metrics.registry.register(CountersCollector("router_kv", self._kv_counters))
        self.metrics.registry.register(
            PreciseGauge(lambda: len(self.feed.precise_endpoints() & self.registry.snapshot().keys()))
        )
        self.status = FleetStatus(Sources(self.registry, self.inflight, self.feed.status, self.feed.precise_endpoints,
                                          self.feed.block_totals, self.indexes.sizes, self.tap,
                                          stale_after_s=config.scrape.stale_after_s))  # fmt: skip
        self.metrics.registry.register(self.status.collector())
        if self.occupancy is not None:
            occupancy = self.occupancy
            self.metrics.registry.register(TenantCacheCollector(occupancy))
            self.status.sections.append(lambda _view: render_tenant_cache(occupancy))
        self.front = build_front(config, self._base, self.metrics, self.schemes)
        self.preparer = self.front.preparer
        self.diagnostics = self.front.diagnostics
        if self.diagnostics is not None and not config.workers.fronts:  # with fronts: their router_prefix_* metrics
            detector = self.diagnostics.detector
            self.status.sections.append(lambda _view: render_section(detector.reports()))
        settings = router_settings(config)
        self.decider = LocalDecider(self._decider_deps(), settings.decider)
        # the load answers in by a request's headers are read while Envoy sends its body, off the decision's path
        self.router = Router(self.front.deps, self.decider, settings, ahead_of_body=self.scraper.collect_answers)
        self._server: ExtProcServer | None = None
        self._authz: asyncio.Server | None = None
        self.authz_port: int | None = None  # the bound ext_authz port once started, when listen.authz_port is set
        self.workers: FrontWorkers | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.grpc_port = 0
        self.metrics_port = 0

    def _dns_discovery(self, index: int, dns: DnsDiscoveryConfig) -> DnsDiscovery:
        if dns.nameserver:
            host, _, port = dns.nameserver.rpartition(":")
            nameserver = (host.strip("[]"), int(port))
        else:
            nameserver = system_nameserver()
        resolver = DnsResolver(nameserver, timeout_s=dns.timeout_s)
        on_change = functools.partial(self._discovered, index)
        return DnsDiscovery(resolver, dns.name, dns.port, interval_s=dns.interval_s, on_change=on_change)

    def _discovered(self, index: int, found: frozenset[EndpointId]) -> None:
        """Discovery ``index`` changed its set: static endpoints plus every name's finds
        (``EndpointLifecycle.discovered``), each with the role of the name that found it (the first name, where
        two find the same address); its KV events are followed when that name's ``kv_events`` names them."""
        self._found[index] = found
        names = self.config.discovery.names()
        self._pool_of = {eid: names[i] for i in sorted(self._found, reverse=True) for eid in self._found[i]}
        static = {EndpointId(e.address): frozenset(e.models) for e in self.config.endpoints}
        roles = {eid: Role(dns.role) for eid, dns in self._pool_of.items()}
        self.lifecycle.discovered(static, frozenset(self._pool_of), self._discovered_events, roles=roles)

    def _discovered_events(self, eid: EndpointId) -> EventSource | None:
        dns = self._pool_of.get(eid)
        kv = dns.kv_events_for(eid.rpartition(":")[0]) if dns else None
        return None if kv is None else EventSource(eid, kv.endpoint, kv.replay_endpoint, topic=kv.topic)

    def _on_round(self) -> None:
        """In each scrape round's wake-up (one timer for all of them): the KV events that arrived since the last
        round are read, and the decisions queued for the ceiling estimate reach it."""
        self.feed.subscriber.pace()
        self.status.tick()

    def _kv_counters(self) -> list[tuple[str, object]]:
        """The write path's counters, exported as ``router_kv_<group>_<field>``."""
        return [*self.feed.counters(), *self.indexes.counters]

    def _scheme_of(self, eid: EndpointId) -> HashScheme | None:
        """The hash scheme an endpoint's engine should use: that of the (first) model it serves."""
        state = self.registry.snapshot().get(eid)
        models = sorted(state.endpoint.models) if state and state.endpoint.models else []
        return self.schemes(models[0] if models else self.config.models[0].name)

    def _kv_blocks(self, eid: EndpointId) -> int | None:
        state = self.registry.snapshot().get(eid)
        return state.endpoint.num_gpu_blocks if state else None

    def _approx_capacity(self, eid: EndpointId) -> int:
        state = self.registry.snapshot().get(eid)
        known = state.endpoint.num_gpu_blocks if state else None
        return known or self.config.index.approx_capacity_blocks

    def _decider_deps(self) -> DeciderDeps:
        return DeciderDeps(
            scheme_for=self.schemes,
            tenant_for=TenantResolver(self.config.tenants),
            registry=self.registry,
            inflight=self.inflight,
            precise=self.precise,
            approx=self.approx,
            precise_endpoints=self.feed.precise_endpoints,
            profile=build_profile(self.config.scheduling, self.config.tenants),
            pd=build_pd(self.config.scheduling),
            metrics=self.metrics,
            shared_load=self.shared_load,
            has_live_events=self.feed.has_live_events,
            lookups_wait_on_io=self.config.index.backend == "redis",
            occupancy=self.occupancy,
            hot_blocks=self.hot_blocks,
            calibration=self.calibration,
            estimator=estimator_params(self.config.scheduling),
            fresh_load=self.scraper.collect_answers,
            on_due_call=self._due_calls_told(),
        )

    def _due_calls_told(self) -> Callable[[DueCall], None] | None:
        """Where the decider tells the calls it routed: the other replicas, when they share them."""
        touches = self.indexes.touches
        return touches.publish_due_call if touches is not None and self.indexes.share_due_calls else None

    async def start(self) -> None:
        """Start scraping, serve gRPC (readiness NOT_SERVING until the first scrape round), serve metrics.
        With ``workers.fronts`` > 0 the front processes serve gRPC instead, started once the first scrape is in.
        Raises ``RuntimeError`` if a front does not come up."""
        listen = self.config.listen
        for discovery in self.discoveries:
            await discovery.start()
        await self.scraper.start()
        self.feed.start()
        if self.indexes.touches is not None:
            self.indexes.touches.follow(
                self.hot_blocks.heard if self.indexes.share_hot_sets else None,
                self.calibration.heard if self.indexes.share_predictions else None,
                self.decider.heard_due_call if self.indexes.share_due_calls else None,
            )
        if self.config.workers.fronts:
            self.workers = FrontWorkers(self.config, self._base, self.decider, self.metrics.registry)
        else:
            await self._start_server()
        if listen.metrics_port is not None:
            await self._serve_metrics(listen.host, listen.metrics_port)
        await self._wait_first_scrape(timeout_s=2.0)
        if listen.authz_port is not None:
            await self._start_authz(listen.host, listen.authz_port)
        if self._before_ready is not None:
            self._before_ready()
        if self.workers is not None:
            await self.workers.start()
            self.grpc_port = self.workers.port
        elif self._server is not None:
            await self._server.set_ready(True)
        log.info(
            "extproc: serving ext_proc on %s:%d (%s), metrics on %s",
            listen.host,
            self.grpc_port,
            f"{self.config.workers.fronts} front workers" if self.workers else "one process",
            self.metrics_port or "off",
        )

    async def _start_server(self) -> None:
        await warm_up(self.front, [m.name for m in self.config.models])
        listen = self.config.listen
        self._server = await start_ext_proc(
            self.router, kind=listen.grpc_server, host=listen.host, port=listen.grpc_port,
            options=processor_options(self.config), ready=False,
        )  # fmt: skip
        self.grpc_port = self._server.port

    async def _start_authz(self, host: str, port: int) -> None:
        """Serve ext_authz checks from this process's router (after the first scrape: no readiness probe there)."""
        if self.workers is not None:  # the fronts warm their own tokenizers; this process's router serves authz
            await warm_up(self.front, [m.name for m in self.config.models])
        options = AuthzOptions.like(processor_options(self.config))
        self._authz = await start_authz_server(self.router, host=host, port=port, options=options)
        self.authz_port = int(self._authz.sockets[0].getsockname()[1])

    async def _wait_first_scrape(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            self.scraper.collect_answers()
            if all(s.metrics is not None or s.failures for s in self.registry.snapshot().values()):
                return
            await asyncio.sleep(0.02)

    async def _serve_metrics(self, host: str, port: int) -> None:
        async def handle(_: web.Request) -> web.Response:
            self.scraper.collect_answers()  # the load gauges as fresh as a decision would see them
            for eid, state in self.registry.snapshot().items():
                self.metrics.endpoint_healthy.labels(eid).set(1 if state.endpoint.healthy else 0)
            body = generate_latest(self.workers.metrics if self.workers else self.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def status(_: web.Request) -> web.Response:
            return web.Response(text=self.status.page(), content_type="text/html")

        app = web.Application()
        app.router.add_get("/metrics", handle)
        app.router.add_get("/status", status)
        self._metrics_runner = web.AppRunner(app, access_log=None)
        await self._metrics_runner.setup()
        site = web.TCPSite(self._metrics_runner, host, port)
        await site.start()
        addresses = self._metrics_runner.addresses
        self.metrics_port = int(addresses[0][1]) if addresses else port

    async def stop(self) -> None:
        """Take the service down in reverse: no new requests or endpoints, then drain the background writes
        (the router's, the lifecycle's cleanups), stop the event feed, close the indexes."""
        for discovery in self.discoveries:
            await discovery.stop()
        if self._server:
            await self._server.stop(grace_s=1.0)
        if self._authz is not None:
            self._authz.close()
            await self._authz.wait_closed()
        if self.workers is not None:
            await self.workers.stop()
        if self._metrics_runner:
            await self._metrics_runner.cleanup()
        await self.scraper.stop()
        await self.router.drain()
        await self.lifecycle.stop()
        await self.feed.stop()
        await self.indexes.close()
        self.front.shutdown()


def cost_learning(scheduling: SchedulingConfig) -> CostLearning:
    """``scheduling.cost_model`` as the calibration's learning settings, starting from the configured estimate."""
    params = estimator_params(scheduling)
    return CostLearning(
        **scheduling.cost_model.model_dump(),
        prior=configured_cost(params),
        prefill_tokens_per_s=params.prefill_tokens_per_s,
    )
