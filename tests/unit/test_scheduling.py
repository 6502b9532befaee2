"""Table tests for the pure decision: estimates, filters and profiles.

The profiles run on the config's defaults (``build_profile(SchedulingConfig())``), the ones the product ships;
a test that needs another value replaces that one field.
"""

import random
from dataclasses import replace

import pytest

from extproc.config import SchedulingConfig, WeightedProfileConfig
from extproc.errors import NoEndpoint, Overloaded
from extproc.scheduling.build import build_profile
from extproc.scheduling.estimate import cached_tokens, estimate_ttft_s, imposed_s
from extproc.scheduling.filters import eligible
from extproc.scheduling.profiles import TtftProfile, WeightedProfile
from extproc.types import (
    BlockHash,
    Candidate,
    Endpoint,
    EndpointId,
    LoadSnapshot,
    LoraAdapter,
    Reason,
    RoutingRequest,
    Tenant,
)

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
DEFAULT = build_profile(SchedulingConfig())
assert isinstance(DEFAULT, TtftProfile)
# Round numbers for the estimate's arithmetic (10,000 tokens/s, no batch or queue overheads).
PARAMS = replace(DEFAULT.params, prefill_tokens_per_s=10000.0, decode_slowdown_per_running=0.0, request_overhead_s=0.0)


def cand(
    eid: EndpointId,
    cached: int = 0,
    queued: float = 0.0,
    *,
    known: bool = True,
    kv: float = 0.0,
    waiting: int = 0,
    capacity: int | None = None,
    hot: int | None = None,
) -> Candidate:
    load = LoadSnapshot(known=known, queued_prefill_tokens=queued, kv_usage=kv, waiting=waiting)
    endpoint = Endpoint(eid, num_gpu_blocks=capacity)
    return Candidate(endpoint, load, cached_blocks=cached, precise=True, hot_blocks=hot)


def req(tokens: int = 1600, tenant: Tenant | None = None) -> RoutingRequest:
    blocks = [BlockHash(i) for i in range(tokens // 16)]
    return RoutingRequest("r1", "m", "m", None, tokens, blocks, 16, tenant or Tenant())


@pytest.mark.parametrize(
    ("prompt", "cached_blocks", "expected"),
    [(1600, 100, 1584), (1600, 50, 800), (1601, 100, 1600), (0, 5, 0), (16, 1, 0)],
    ids=["all-cached-minus-last-block", "half", "last-token-recomputed", "no-tokens", "single-block"],
)
def test_cached_tokens_never_covers_the_last_prompt_token(prompt: int, cached_blocks: int, expected: int) -> None:
    assert cached_tokens(cand(A, cached_blocks), prompt, 16) == expected


def test_estimate_counts_only_uncached_tokens_and_the_queue_ahead() -> None:
    cold = estimate_ttft_s(cand(A, 0), 1600, 16, PARAMS)
    warm = estimate_ttft_s(cand(A, 99), 1600, 16, PARAMS)
    queued = estimate_ttft_s(cand(A, 0, queued=10000), 1600, 16, PARAMS)
    assert cold == pytest.approx(0.16)
    assert warm == pytest.approx(0.0016)
    assert queued == pytest.approx(1.16)


def test_unknown_load_is_not_idle() -> None:
    assert estimate_ttft_s(cand(A, known=False), 1600, 16, PARAMS) > estimate_ttft_s(cand(A), 1600, 16, PARAMS)


def test_kv_pressure_adds_delay_only_when_switched_on() -> None:
    on = replace(PARAMS, kv_pressure_threshold=0.9)
    assert estimate_ttft_s(cand(A, kv=0.99), 1600, 16, on) > estimate_ttft_s(cand(A, kv=0.5), 1600, 16, on)
    assert estimate_ttft_s(cand(A, kv=0.99), 1600, 16, PARAMS) == estimate_ttft_s(cand(A, kv=0.5), 1600, 16, PARAMS)


def test_a_request_delays_the_ones_waiting_where_it_goes_by_its_own_prefill() -> None:
    """Each request there before its first token (the page's waiting, ours routed since) joins the step this
    request's prefill lengthens: delayed by that prefill (1,600 uncached tokens at 10,000 tokens/s), not by the
    queue ahead of it."""
    load = LoadSnapshot(known=True, queued_prefill_tokens=5000, waiting=2, inflight_requests=2, queued_requests=1)
    assert imposed_s(replace(cand(A, 0), load=load), 1600, 16, PARAMS) == pytest.approx(3 * 0.16)
    assert imposed_s(cand(A, 99, waiting=2), 1600, 16, PARAMS) == pytest.approx(2 * 0.0016)  # warm: little to add
    assert imposed_s(cand(A, 0, queued=5000), 1600, 16, PARAMS) == 0.0  # nobody waits there


TABLE = [
    # id, candidates, expected pick, expected reason
    ("warm-and-idle-wins", [cand(A, 99), cand(B, 0)], A, Reason.CACHE),
    ("no-prefix-anywhere-least-loaded", [cand(A, 0, queued=5000), cand(B, 0)], B, Reason.LOAD),
    # The case the project exists for: A holds the prefix but has a long queue; B is idle and cold.
    ("warm-but-swamped-spills-to-cold", [cand(A, 99, queued=50000), cand(B, 0)], B, Reason.SPILL),
    ("warm-with-short-queue-still-wins", [cand(A, 99, queued=800), cand(B, 0)], A, Reason.CACHE),
    # ~0.12 s worse than cold: within the shipped stickiness (0.2 s), so it stays warm (at 0.05 s it spilled).
    ("warm-within-stickiness-stays", [cand(A, 99, queued=3000), cand(B, 0)], A, Reason.CACHE),
    ("longest-prefix-wins-among-warm", [cand(A, 20), cand(B, 99), cand(C, 50)], B, Reason.CACHE),
    # The leading-space edit: only the system prompt's block matches; that is cold, so load decides.
    ("system-prompt-only-is-cold", [cand(A, 1, queued=500), cand(B, 0)], B, Reason.LOAD),
    # B is the least busy, but not idle: the copy's prefill would be a backlog its later requests wait behind.
    ("spill-needs-an-idle-target", [cand(A, 99, queued=50000), cand(B, 0, queued=3000)], A, Reason.HOLD),
    ("spill-skips-the-busy-endpoint",
     [cand(A, 99, queued=50000), cand(B, 0, queued=3000), cand(C, 0, waiting=0)], C, Reason.SPILL),
    # A new prefix goes where the least hot traffic lives, within the stickiness of the best estimate.
    ("cold-prefix-placed-by-hot-traffic",
     [cand(A, 0, capacity=600, hot=400), cand(B, 0, queued=1000, capacity=600, hot=100)], B, Reason.LOAD),
    ("cold-prefix-not-placed-on-a-swamped-endpoint",
     [cand(A, 0, capacity=600, hot=400), cand(B, 0, queued=9000, capacity=600, hot=100)], A, Reason.LOAD),
    # Mooncake at 16 req/s (bench/results/placement-window): B serves the least hot traffic and is within the
    # stickiness (0.167 s worse), but by more than the prompt's own prefill (1,600 tokens, 0.133 s): a queue of
    # its own, not a difference of one placement. By estimate.
    ("cold-prefix-not-placed-past-its-own-work",
     [cand(A, 0, capacity=600, hot=400), cand(B, 0, queued=2000, capacity=600, hot=100)], A, Reason.LOAD),
    # Issue 13's last cascade (bench/results/issue13-cascade): the 16th of 16 groups on 4 backends. B has the best
    # estimate (by 0.07 s) but already homes 4 groups (432 hot blocks); C homes 3. A fifth home on B overloads it
    # for the rest of the run (every later request of its groups holds there), so C.
    ("cold-prefix-not-a-fifth-home",
     [cand(A, 0, queued=1700, capacity=600, hot=432), cand(B, 0, capacity=600, hot=432),
      cand(C, 0, queued=840, capacity=600, hot=324)], C, Reason.LOAD),
    # What the cascading runs saw: hot sets left over from before the caches were reset read full (600 of 600)
    # everywhere, so placement fell back to the estimate and put that fifth group on B.
    ("full-hot-sets-leave-placement-to-the-estimate",
     [cand(A, 0, queued=1700, capacity=600, hot=600), cand(B, 0, capacity=600, hot=600),
      cand(C, 0, queued=840, capacity=600, hot=600)], B, Reason.LOAD),
    # The spill cascade's first step, refused: B's cache is full (600 of 600), the copy would evict a prefix.
    ("busy-warm-holds-when-no-cache-has-room",
     [cand(A, 99, queued=50000, capacity=600, hot=600), cand(B, 0, capacity=600, hot=600)], A, Reason.HOLD),
    # B's hot set leaves room for the 99 new blocks (500 + 99 <= 600): the copy evicts only dead weight.
    ("busy-warm-spills-where-the-copy-fits",
     [cand(A, 99, queued=50000, capacity=600, hot=600), cand(B, 0, capacity=600, hot=500)], B, Reason.SPILL),
    # Only C has room: the spill goes there, not to the equally idle but full B.
    ("spill-skips-the-full-endpoint",
     [cand(A, 99, queued=50000), cand(B, 0, capacity=600, hot=600), cand(C, 0, waiting=0)], C, Reason.SPILL),
    # Two full copies: the less busy one is the warm pick; idle C would need an eviction, so it holds there.
    ("two-copies-hold-on-the-less-busy-one",
     [cand(A, 99, queued=50000, capacity=600, hot=600), cand(B, 99, queued=40000, capacity=600, hot=600),
      cand(C, 0, capacity=600, hot=600)], B, Reason.HOLD),
    # Capacity known, hot set not tracked: no bound known, the spill goes ahead as before.
    # 400 hot + 99 new fit in 600, but running requests hold another 30% (180 blocks): no room.
    ("blocks-in-use-leave-no-room",
     [cand(A, 99, queued=50000, capacity=600, hot=600), cand(B, 0, capacity=600, hot=400, kv=0.3)], A, Reason.HOLD),
    ("untracked-hot-set-does-not-hold",
     [cand(A, 99, queued=50000, capacity=600), cand(B, 0, capacity=600)], B, Reason.SPILL),
]  # fmt: skip


@pytest.mark.parametrize(("candidates", "pick", "reason"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_ttft_profile_table(candidates: list[Candidate], pick: EndpointId, reason: Reason) -> None:
    decision = DEFAULT.decide(req(), candidates, random.Random(0))
    assert decision.endpoints[0] == pick
    assert decision.reason == reason
    assert len(decision.endpoints) == len(set(decision.endpoints))


@pytest.mark.parametrize(
    ("followers", "pick"),
    [(1.0, B), (3.0, B), (0.5, B), (0.3, A), (0.0, A)],
    ids=["one-each", "more-than-one", "window-halved-still-holds-it", "window-too-narrow", "none-follow"],
)
def test_cold_placement_window_follows_the_measured_followers(followers: float, pick: EndpointId) -> None:
    # B is 0.08 s worse by estimate but serves the least hot traffic: worth it while new prefixes are
    # followed (the window is stickiness_s, 0.2 s, times the followers, at most one); by estimate when not.
    candidates = [cand(A, 0, capacity=600, hot=400), cand(B, 0, queued=800, capacity=600, hot=100)]
    request = replace(req(), prefix_followers=followers)
    decision = DEFAULT.decide(request, candidates, random.Random(0))
    assert (decision.endpoints[0], decision.reason) == (pick, Reason.LOAD)


@pytest.mark.parametrize(
    ("waiting", "hot_b", "pick"),
    [(1, 100, B), (0, 100, A), (1, 200, A)],
    ids=["not-beside-a-waiting-request", "nobody-waits", "hot-traffic-decides-first"],
)
def test_cold_placement_minds_the_requests_waiting_there(waiting: int, hot_b: int, pick: EndpointId) -> None:
    # A has the better estimate (B has 400 tokens queued). With a request waiting on A, this cold prefill would
    # join its step and hold its first token back by the whole prefill (0.133 s): among the endpoints as cold
    # in hot traffic, B costs less in all. A momentary queue does not override the hot traffic (A holds less).
    candidates = [cand(A, 0, waiting=waiting, capacity=600, hot=100), cand(B, 0, queued=400, capacity=600, hot=hot_b)]
    request = replace(req(), prefix_followers=1.0)
    decision = DEFAULT.decide(request, candidates, random.Random(0))
    assert (decision.endpoints[0], decision.reason) == (pick, Reason.LOAD)


def test_tenant_ttft_target_bounds_the_wait_for_a_warm_endpoint() -> None:
    candidates = [cand(A, 99, queued=15000), cand(B, 0)]  # warm ~1.5 s, cold ~0.16 s
    patient = req(tenant=Tenant("batch", ttft_target_s=3.0))
    hurried = req(tenant=Tenant("chat", ttft_target_s=0.5))
    profile = DEFAULT
    assert profile.decide(patient, candidates, random.Random(0)).endpoints[0] == A
    assert profile.decide(hurried, candidates, random.Random(0)).endpoints[0] == B


def test_ties_are_spread() -> None:
    candidates = [cand(A), cand(B), cand(C)]
    rng = random.Random(1)
    picks = {DEFAULT.decide(req(), candidates, rng).endpoints[0] for _ in range(60)}
    assert picks == {A, B, C}


def test_fallbacks_follow_the_pick_in_estimate_order() -> None:
    candidates = [cand(A, 0, queued=3000), cand(B, 99), cand(C, 0, queued=1000)]
    decision = replace(DEFAULT, fallbacks=2).decide(req(), candidates, random.Random(0))
    assert decision.endpoints == (B, C, A)


def test_no_candidates_is_no_endpoint() -> None:
    with pytest.raises(NoEndpoint):
        DEFAULT.decide(req(), [], random.Random(0))


def test_sheddable_tenant_is_refused_when_everything_is_swamped() -> None:
    candidates = [cand(A, queued=10**6), cand(B, queued=10**6)]
    profile = replace(DEFAULT, shed_ttft_s=5.0)
    with pytest.raises(Overloaded):
        profile.decide(req(tenant=Tenant("bulk", priority=-1)), candidates, random.Random(0))
    assert profile.decide(req(tenant=Tenant("vip", priority=1)), candidates, random.Random(0)).endpoints


def test_copy_into_full_kv_restores_the_old_spill() -> None:
    candidates = [cand(A, 99, queued=50000, capacity=600, hot=600), cand(B, 0, capacity=600, hot=600)]
    decision = replace(DEFAULT, copy_into_full_kv=True).decide(req(), candidates, random.Random(0))
    assert (decision.endpoints[0], decision.reason) == (B, Reason.SPILL)


def test_a_held_sheddable_request_is_shed_rather_than_copied() -> None:
    candidates = [cand(A, 99, queued=60000, capacity=600, hot=600), cand(B, 0, capacity=600, hot=600)]
    profile = replace(DEFAULT, shed_ttft_s=5.0)  # A ~6 s (held), B idle but full
    with pytest.raises(Overloaded):
        profile.decide(req(tenant=Tenant("bulk", priority=-1)), candidates, random.Random(0))
    assert profile.decide(req(tenant=Tenant("vip", priority=1)), candidates, random.Random(0)).reason == Reason.HOLD


def test_no_tokens_routes_by_load() -> None:
    decision = DEFAULT.decide(req(0), [cand(A, queued=9000), cand(B)], random.Random(0))
    assert (decision.endpoints[0], decision.reason) == (B, Reason.NO_TOKENS)


def test_weighted_profile_prefers_prefix_then_queue() -> None:
    profile = build_profile(SchedulingConfig(profile=WeightedProfileConfig(type="weighted")))
    assert isinstance(profile, WeightedProfile)
    d = profile.decide(req(), [cand(A, 99, waiting=1), cand(B, 0, waiting=0)], random.Random(0))
    assert (d.endpoints[0], d.reason) == (A, Reason.CACHE)
    d = profile.decide(req(), [cand(A, 0, waiting=5), cand(B, 0, waiting=0)], random.Random(0))
    assert (d.endpoints[0], d.reason) == (B, Reason.LOAD)


FILTER_TABLE = [
    ("healthy-only", [Endpoint(A), Endpoint(B, healthy=False)], None, None, {A}),
    (
        "model-served",
        [Endpoint(A, models=frozenset({"m"})), Endpoint(B, models=frozenset({"x"}))],
        None,
        None,
        {A},
    ),
    ("undiscovered-counts", [Endpoint(A), Endpoint(B, models=frozenset({"x"}))], None, None, {A}),
    (
        "adapter-served",
        [
            Endpoint(A, models=frozenset({"m"}), adapters=frozenset({"lo"})),
            Endpoint(B, models=frozenset({"m"}), adapters=frozenset({"other"})),
        ],
        LoraAdapter("lo", "/p"),
        None,
        {A},
    ),
    ("subset-hint", [Endpoint(A), Endpoint(B)], None, frozenset({B}), {B}),
    ("empty-subset", [Endpoint(A), Endpoint(B)], None, frozenset(), set()),
]


@pytest.mark.parametrize(
    ("endpoints", "lora", "subset", "expected"),
    [t[1:] for t in FILTER_TABLE],
    ids=[t[0] for t in FILTER_TABLE],
)
def test_filters(
    endpoints: list[Endpoint],
    lora: LoraAdapter | None,
    subset: frozenset[EndpointId] | None,
    expected: set[EndpointId],
) -> None:
    assert {e.id for e in eligible(endpoints, "m", lora, subset)} == expected


def test_decision_names_its_numbers_by_what_they_mean() -> None:
    candidates = [cand(A, 99), cand(B, 0)]
    ttft = DEFAULT.decide(req(), candidates, random.Random(0))
    assert set(ttft.estimates_s) == {A, B} and ttft.scores == {}
    assert ttft.estimates_s[A] < ttft.estimates_s[B], "seconds to first token: lower is better"
    weighted = build_profile(SchedulingConfig(profile=WeightedProfileConfig(type="weighted")))
    blend = weighted.decide(req(), candidates, random.Random(0))
    assert set(blend.scores) == {A, B} and blend.estimates_s == {}
    assert blend.scores[A] > blend.scores[B], "scorer totals: higher is better"
