"""Table tests for the tenant cache-share placement rule (``scheduling/tenant_shares.py``) and its profile hook.

The fleet: endpoints of 1,000 blocks; a premium class (protected) and a batch class; requests of 1,600 tokens
(100 blocks of 16). ``shares(used, premium, batch)`` is one endpoint's cache as the bookkeeping saw it.
"""

import random

import pytest

from extproc.config import SchedulingConfig, TenantClass, TenantsConfig
from extproc.errors import Overloaded
from extproc.scheduling.build import build_profile, share_policy
from extproc.scheduling.profiles import TtftProfile
from extproc.scheduling.tenant_shares import narrowed
from extproc.types import (
    BlockHash,
    Candidate,
    Endpoint,
    EndpointId,
    EndpointShares,
    LoadSnapshot,
    Reason,
    RoutingRequest,
    Tenant,
)

A, B, C = EndpointId("a:1"), EndpointId("b:1"), EndpointId("c:1")
CAPACITY = 1000
PREMIUM = TenantClass(priority=1, protect_hot_prefixes=True, cache_share=0.5)
BATCH = TenantClass(priority=0, uncached_tokens_per_endpoint=3200)
TENANTS = TenantsConfig(classes={"premium": PREMIUM, "batch": BATCH})
POLICY = share_policy(TENANTS)


def shares(used: int = 1000, premium: int = 0, batch: int = 0, inflight_batch: float = 0.0) -> EndpointShares:
    by_class = {k: v for k, v in (("premium", premium), ("batch", batch)) if v}
    return EndpointShares(used, by_class, {"batch": inflight_batch} if inflight_batch else {})


def cand(
    eid: EndpointId, s: EndpointShares | None, cached: int = 0, queued: float = 0.0, running: int = 0
) -> Candidate:
    load = LoadSnapshot(running=running, known=True, queued_prefill_tokens=queued)
    return Candidate(Endpoint(eid, num_gpu_blocks=CAPACITY), load, cached, precise=True, shares=s)


def req(cls: str, tokens: int = 1600, priority: int = 0, budget: int | None = None) -> RoutingRequest:
    tenant = Tenant(cls, priority=priority, cls=cls, uncached_tokens_per_endpoint=budget)
    return RoutingRequest("r", "m", "m", None, tokens, [BlockHash(i) for i in range(tokens // 16)], 16, tenant)


def batch(priority: int = 0, budget: int | None = 3200) -> RoutingRequest:
    return req("batch", priority=priority, budget=budget)


@pytest.mark.parametrize(
    ("request_", "candidates", "expected"),
    [
        (batch(budget=None), [cand(A, shares(premium=300, batch=700)), cand(B, shares(batch=1000))], [B]),
        (batch(), [cand(A, shares(used=800, premium=300, batch=500)), cand(B, shares(batch=1000))], [A, B]),
        (batch(budget=None), [cand(A, shares(premium=300, batch=700)), cand(B, shares(premium=10, batch=990))], [B]),
        (batch(), [cand(A, shares(premium=300, batch=700)), cand(B, shares(premium=10, batch=990))], [A, B]),
        (
            batch(),
            [cand(A, shares(premium=300, batch=700, inflight_batch=2000)), cand(B, shares(premium=10, batch=990))],
            [B],
        ),
        (req("premium"), [cand(A, shares(premium=300, batch=700)), cand(B, shares(batch=1000))], [A]),
        (req("premium"), [cand(A, shares(premium=950, batch=50)), cand(B, shares(batch=1000))], [A, B]),
        (req("premium"), [cand(A, shares(premium=950, batch=50), cached=90), cand(B, shares(batch=1000))], [A]),
        (req("premium"), [cand(A, shares(batch=1000)), cand(B, shares(batch=1000))], [A, B]),
        (req("premium"), [cand(A, shares(premium=9)), cand(B, shares(premium=9))], [A, B]),
        (batch(budget=None), [cand(A, None), cand(B, shares(premium=300, batch=700))], [A]),
        (batch(), [cand(A, shares(premium=300, batch=700), cached=100), cand(B, shares(batch=1000))], [A, B]),
        (req("other"), [cand(A, shares(premium=300, batch=700)), cand(B, shares(batch=1000))], [B]),
    ],
    ids=[
        "over-share-batch-goes-where-no-protected-blocks",
        "fits-in-free-blocks-evicts-nobody",
        "no-budget-everywhere-protected-least-harm",
        "within-budget-on-protected-endpoints",
        "budget-spent-on-one-endpoint",
        "the-protected-class-goes-home",
        "home-full-at-its-share-a-cold-prompt-anywhere",
        "home-full-a-warm-prompt-stays-home",
        "no-home-yet-anywhere",
        "home-everywhere",
        "unknown-shares-left-alone",
        "fully-cached-prompt-stores-nothing",
        "default-class-is-kept-off-too",
    ],
)
def test_placement_rule(request_: RoutingRequest, candidates: list[Candidate], expected: list[EndpointId]) -> None:
    assert [c.endpoint.id for c in narrowed(request_, candidates, POLICY)] == expected


def test_sheddable_class_is_refused_when_it_could_only_evict_protected_blocks() -> None:
    everywhere = [cand(A, shares(premium=300, batch=700)), cand(B, shares(premium=50, batch=950))]
    with pytest.raises(Overloaded):
        narrowed(batch(priority=-1, budget=None), everywhere, POLICY)


@pytest.mark.parametrize(
    ("share", "of", "held", "narrowed_"),
    [(0.5, "fleet", 800, False), (0.5, "fleet", 950, True), (0.5, "endpoint", 300, False),
     (0.5, "endpoint", 700, True)],
    ids=["under-fleet-share-never-penalised", "over-fleet-share", "under-endpoint-share", "over-endpoint-share"],
)  # fmt: skip
def test_a_class_under_its_share_is_never_penalised(share: float, of: str, held: int, narrowed_: bool) -> None:
    policy = share_policy(
        TenantsConfig(classes={"premium": PREMIUM, "batch": TenantClass(cache_share=share, cache_share_of=of)})
    )  # type: ignore[arg-type]
    # Two endpoints (2,000 blocks): A holds premium's 300 and batch's `held`; B holds nobody's we know.
    candidates = [cand(A, shares(premium=300, batch=held)), cand(B, shares())]
    out = narrowed(req("batch"), candidates, policy)
    assert (out is not candidates) == narrowed_


def test_protection_lapses_beyond_the_protected_class_share() -> None:
    """Premium's cache_share of each endpoint is 0.2: beyond 200 blocks its excess is fair game, so 300 blocks on
    A weigh as much as 200 on B (without the cap, B alone would be the least harm)."""
    policy = share_policy(TenantsConfig(classes={
        "premium": TenantClass(protect_hot_prefixes=True, cache_share=0.2, cache_share_of="endpoint")}))  # fmt: skip
    two = [cand(A, shares(premium=300, batch=700)), cand(B, shares(premium=200, batch=800))]
    assert [c.endpoint.id for c in narrowed(batch(budget=None), two, policy)] == [A, B]
    uncapped = share_policy(TenantsConfig(classes={"premium": TenantClass(protect_hot_prefixes=True)}))
    assert [c.endpoint.id for c in narrowed(batch(budget=None), two, uncapped)] == [B]


def test_defaults_change_nothing() -> None:
    """No protected class (every default; a single-tenant fleet): the candidates come back as they are."""
    policy = share_policy(TenantsConfig(classes={"batch": TenantClass(priority=-1)}))
    candidates = [cand(A, shares(premium=300, batch=700)), cand(B, shares(batch=1000))]
    assert narrowed(batch(priority=-1), candidates, policy) is candidates
    profile = build_profile(SchedulingConfig())
    assert isinstance(profile, TtftProfile) and not profile.shares.active


def test_nothing_narrowed_is_the_same_list() -> None:
    """The profile labels a decision ``share`` only when the rule really narrowed (an identity check)."""
    everywhere = [cand(A, shares(premium=9)), cand(B, shares(premium=9))]
    assert narrowed(req("premium"), everywhere, POLICY) is everywhere


def test_the_profile_says_share_when_it_narrowed() -> None:
    profile = build_profile(SchedulingConfig(), TENANTS)
    candidates = [cand(A, shares(premium=300, batch=700)), cand(B, shares(batch=1000), queued=50000.0)]
    decision = profile.decide(batch(budget=None), candidates, random.Random(0))
    assert decision.endpoints[0] == B and decision.reason is Reason.SHARE
    candidates = [cand(A, shares(premium=300, batch=700), queued=9000.0), cand(B, shares(batch=1000))]
    warm = [cand(A, shares(premium=300, batch=700), cached=90, queued=9000.0), cand(B, shares(batch=1000))]
    alone = profile.decide(req("premium"), warm, random.Random(0))
    assert alone.endpoints[0] == A  # a warm prompt goes home, past the idler B
    cold = profile.decide(req("premium"), candidates, random.Random(0))
    assert cold.endpoints[0] == B and cold.reason is Reason.SHARE  # a cold one does not queue at a busy home


def pending(used: int = 0, premium: int = 0, batch: int = 0) -> EndpointShares:
    by_class = {k: v for k, v in (("premium", premium), ("batch", batch)) if v}
    return EndpointShares(used, {}, {}, by_class)


HOME_BUSY = 800.0  # half the request's own prefill queued there


@pytest.mark.parametrize(
    ("request_", "candidates", "expected"),
    [
        (batch(budget=None), [cand(A, shares(used=100, premium=100)), cand(B, shares(batch=1000))], [B]),
        (batch(budget=None), [cand(A, pending(premium=60)), cand(B, shares(batch=1000))], [B]),
        (
            batch(budget=None),
            [
                cand(A, shares(used=800, premium=300, batch=500)),
                cand(B, shares(premium=700, batch=300)),
                cand(C, shares(premium=500, batch=500)),
            ],
            [A],
        ),
        (
            batch(budget=None),
            [
                cand(A, shares(used=800, premium=300, batch=500)),
                cand(B, shares(premium=550, batch=450)),
                cand(C, shares(batch=1000)),
            ],
            [C],
        ),
        (
            req("premium"),
            [
                cand(A, shares(premium=300), queued=HOME_BUSY),
                cand(B, shares(batch=1000)),
                cand(C, shares(batch=1000), running=1),
            ],
            [A, B],
        ),
        (req("premium"), [cand(A, pending(premium=60), queued=HOME_BUSY), cand(B, shares())], [A, B]),
        (req("premium"), [cand(A, shares(premium=300), queued=HOME_BUSY, cached=90), cand(B, shares())], [A]),
        (req("premium"), [cand(A, shares(premium=300), queued=HOME_BUSY - 1), cand(B, shares())], [A]),
        (
            req("premium"),
            [
                cand(A, shares(premium=300), queued=HOME_BUSY),
                cand(B, shares(), queued=48.0),
                cand(C, shares(used=1000, premium=0, batch=1000), running=2),
            ],
            [A],
        ),
    ],
    ids=[
        "batch-kept-off-a-filling-home",
        "pending-blocks-make-a-home",
        "room-left-where-premium-is-at-its-share",
        "room-reserved-while-premium-is-under-it",
        "cold-premium-may-open-a-home-on-an-idle-endpoint",
        "a-pending-home-counts-too",
        "warm-premium-stays-home",
        "home-not-busy-stays-home",
        "no-idle-endpoint-under-a-flood",
    ],
)
def test_homes_and_room(request_: RoutingRequest, candidates: list[Candidate], expected: list[EndpointId]) -> None:
    """Issue 14's second round: homes exist from the first routed request, keep the room their class may still
    fill, and a cold prompt of a protected class does not queue behind a busy home while an endpoint idles."""
    assert [c.endpoint.id for c in narrowed(request_, candidates, POLICY)] == expected
