"""The per-class cache bookkeeping (``kvcache/occupancy.py``): attribution from routing, confirmed by events."""

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from extproc import wire
from extproc.config import TenantClass, TenantsConfig
from extproc.kvcache.gate import ObservedWrites
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.occupancy import UNATTRIBUTED, Occupancy
from extproc.resolvers import TenantResolver
from extproc.status.tenant_cache import TenantCacheCollector, render_section
from extproc.types import BlockHash, EndpointId, HttpRequest, Route
from tests.support.router_fakes import make_router

A, B = EndpointId("a:1"), EndpointId("b:1")
H = [BlockHash(i) for i in range(10)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def occupancy(clock: Clock | None = None) -> Occupancy:
    return Occupancy(1000.0, {"premium"}.__contains__, pending_ttl_s=30.0, clock=clock or Clock())


def test_routed_blocks_are_owned_once_the_engine_stores_them() -> None:
    occ = occupancy()
    occ.routed(A, "premium", H[:4], cached_blocks=0, uncached_tokens=64)
    assert occ.view(A).by_class == {}  # routed, not yet confirmed
    occ.stored(A, H[:6])  # two more than we routed: someone else's (another replica, say)
    view = occ.view(A)
    assert view.used_blocks == 6 and view.by_class == {"premium": 4, UNATTRIBUTED: 2}
    assert occ.view(B).by_class == {}  # attribution is per endpoint


def test_pending_blocks_are_counted_by_class_until_stored_expired_or_cleared() -> None:
    clock = Clock()
    occ = occupancy(clock)
    occ.routed(A, "premium", H[:4], cached_blocks=0, uncached_tokens=64)
    occ.routed(A, "batch", H[2:6], cached_blocks=0, uncached_tokens=64)  # re-routed blocks move to batch
    view = occ.view(A)
    assert view.pending_by_class == {"premium": 2, "batch": 4} and view.held("premium") == 2
    occ.stored(A, H[:3])
    view = occ.view(A)
    assert view.by_class == {"premium": 2, "batch": 1} and view.pending_by_class == {"batch": 3}
    assert view.held("batch") == 4
    clock.now = 31.0
    occ.routed(B, "premium", H[:1], 0, 16)
    occ.routed(A, "premium", H[8:9], 0, 16)  # expires the 31-second-old pending blocks
    assert occ.view(A).pending_by_class == {"premium": 1}
    occ.cleared(A)
    assert occ.view(A).pending_by_class == {} and occ.view(B).pending_by_class == {"premium": 1}


def test_a_removal_counts_the_owner_and_the_likeliest_cause() -> None:
    occ = occupancy()
    occ.routed(A, "premium", H[:4], 0, 64)
    occ.stored(A, H[:4])
    occ.routed(A, "batch", H[4:8], 0, 64)
    occ.removed(A, H[:2])
    occ.stored(A, H[4:8])
    counters = {(cls, ep): c for cls, ep, c in occ.counters()}
    assert counters[("premium", A)].blocks_evicted == 2
    assert counters[("batch", A)].evictions_caused == 2
    assert occ.view(A).by_class == {"premium": 2, "batch": 4}


def test_protected_hits_and_the_class_queue_drains_at_the_prefill_rate() -> None:
    clock = Clock()
    occ = occupancy(clock)
    occ.routed(A, "premium", H[:4], 0, 2000)
    occ.stored(A, H[:4])
    occ.routed(A, "premium", H[:4], 4, 0)
    assert {(cls, ep): c.protected_hits for cls, ep, c in occ.counters()}[("premium", A)] == 1
    assert occ.view(A).inflight_uncached == {"premium": 2000.0}
    clock.now = 1.5  # 1,000 tokens/s
    assert occ.view(A).inflight_uncached == {"premium": 500.0}


def test_pending_attribution_expires() -> None:
    clock = Clock()
    occ = occupancy(clock)
    occ.routed(A, "batch", H[:4], 0, 64)
    clock.now = 31.0
    occ.routed(A, "batch", H[8:9], 0, 16)  # expiry runs on the next routed request
    occ.stored(A, H[:4])
    assert occ.view(A).by_class == {UNATTRIBUTED: 4}


def test_the_tee_tells_occupancy_and_writes_the_index() -> None:
    index = MemoryPrefixIndex()
    occ = occupancy()
    writes = ObservedWrites(index, [occ])
    occ.routed(A, "batch", H[:3], 0, 48)

    async def go() -> None:
        await writes.store(A, H[:3])
        assert (await index.match(H[:3], [A]))[A] == 3
        await writes.remove(A, H[2:3])
        assert occ.view(A).by_class == {"batch": 2}
        await writes.clear(A)

    asyncio.run(go())
    assert occ.view(A).used_blocks == 0


async def test_the_decider_attributes_what_it_routes_to_the_tenants_class() -> None:
    occ = occupancy()
    resolve = TenantResolver(TenantsConfig(classes={"premium": TenantClass(protect_hot_prefixes=True)}))
    router, _approx, _ = make_router(occupancy=occ, tenant_for=resolve)
    request = HttpRequest("POST", "/v1/chat/completions", {wire.TENANT_HEADER: "premium"}, b"{}", "r1")
    route = await router.route(request)
    assert isinstance(route, Route)
    pick = route.endpoints[0]
    assert occ.view(pick).inflight_uncached["premium"] > 0
    tokens = list(range(1000))  # the fake preparer's prompt; the fake hasher hashes each block's whole prefix
    occ.stored(pick, [BlockHash(hash(tuple(tokens[: (i + 1) * 16]))) for i in range(3)])  # the engine's events
    assert occ.view(pick).by_class == {"premium": 3}


def test_the_collector_exports_occupancy_and_counters_per_class_and_endpoint() -> None:
    occ = occupancy()
    occ.routed(A, "premium", H[:4], 0, 64)
    occ.stored(A, H[:4])
    occ.routed(A, "batch", H[4:6], 0, 32)
    occ.removed(A, H[:1])
    registry = CollectorRegistry()
    registry.register(TenantCacheCollector(occ))
    text = generate_latest(registry).decode()
    assert 'router_tenant_cache_blocks{endpoint="a:1",tenant_class="premium"} 3.0' in text
    assert 'router_tenant_evictions_caused_total{endpoint="a:1",tenant_class="batch"} 1.0' in text
    assert 'router_tenant_blocks_evicted_total{endpoint="a:1",tenant_class="premium"} 1.0' in text
    html = render_section(occ)
    assert html.startswith('<section id="tenant-cache">')
    assert "<td>a:1</td><td>premium</td><td>3</td><td>0</td><td>1</td><td>0</td>" in html
    assert "no attributed blocks yet" in render_section(occupancy())
