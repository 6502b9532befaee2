"""Table tests for prefill/decode disaggregation (``extproc.scheduling.pd``) and the header the decider writes."""

import json
import logging
import random
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from extproc import wire
from extproc.app import App, cost_learning
from extproc.backends.calibration import TtftCalibration
from extproc.backends.registry import EndpointRegistry
from extproc.backends.vllm_metrics import EngineMetrics, PhaseTotals
from extproc.config import EndpointConfig, SchedulingConfig
from extproc.observability import RouterMetrics
from extproc.scheduling.build import build_pd, build_profile
from extproc.scheduling.estimate import CostTerms, ttft_s
from extproc.scheduling.pd import PdPolicy, PdReason, decide, split_roles
from extproc.types import BlockHash, Candidate, Endpoint, EndpointId, LoadSnapshot, Role, Route, RoutingRequest
from tests.support.config import router_config
from tests.support.router_fakes import make_router, post

D1, D2 = EndpointId("10.0.1.1:8000"), EndpointId("10.0.1.2:8000")
P1, P2 = EndpointId("10.0.2.1:8000"), EndpointId("10.0.2.2:8000")
DEFAULT = build_pd(SchedulingConfig())
# Round numbers: 10,000 prompt tokens/s, no batch or queue overheads, 10 us per transferred token, no setup.
PARAMS = replace(DEFAULT.params, prefill_tokens_per_s=10000.0, decode_slowdown_per_running=0.0, request_overhead_s=0.0)
POLICY = PdPolicy(PARAMS, non_cached_tokens=256, max_extra_ttft_s=0.25, kv_transfer_s_per_token=1e-5,
                  kv_transfer_setup_s=0.0)  # fmt: skip


def cand(eid: EndpointId, role: Role, cached: int = 0, queued: float = 0.0) -> Candidate:
    load = LoadSnapshot(known=True, queued_prefill_tokens=queued)
    return Candidate(Endpoint(eid, role=role), load, cached_blocks=cached, precise=True)


def req(tokens: int) -> RoutingRequest:
    return RoutingRequest("r1", "m", "m", None, tokens, [BlockHash(i) for i in range(tokens // 16)], 16)


@pytest.mark.parametrize(
    ("tokens", "decode_cached", "prefills", "policy", "expected", "reason"),
    [
        (16000, 0, [(P1, 0, 0.0)], POLICY, P1, PdReason.DISAGG),
        (1600, 0, [(P1, 0, 0.0)], POLICY, P1, PdReason.DISAGG),
        (240, 0, [(P1, 0, 0.0)], POLICY, None, PdReason.SHORT),
        (16000, 990, [(P1, 0, 0.0)], POLICY, None, PdReason.SHORT),
        (16000, 0, [(P1, 0, 0.0), (P2, 900, 0.0)], POLICY, P2, PdReason.DISAGG),
        (16000, 0, [(P1, 0, 40000.0), (P2, 0, 0.0)], POLICY, P2, PdReason.DISAGG),
        (16000, 0, [(P1, 0, 30000.0), (P2, 0, 40000.0)], POLICY, None, PdReason.SATURATED),
        (16000, 0, [(P1, 0, 0.0)], replace(POLICY, max_extra_ttft_s=0.0), None, PdReason.SATURATED),
        (16000, 0, [(P1, 500, 0.0)], replace(POLICY, max_extra_ttft_s=0.0), P1, PdReason.DISAGG),
        (16000, 0, [], POLICY, None, PdReason.NO_PREFILL),
        (16000, 0, [(P1, 0, 0.0)], replace(POLICY, non_cached_tokens=0), None, PdReason.SHORT),
        (0, 0, [(P1, 0, 0.0)], POLICY, None, PdReason.SHORT),
    ],
    ids=[
        "long-uncached-disaggregates",
        "threshold-counts-uncached-tokens",
        "short-prompt-runs-locally",
        "cached-on-decode-runs-locally",
        "prefill-pick-by-its-cached-prefix",
        "prefill-pick-by-its-queue",
        "saturated-prefill-pool-runs-locally",
        "transfer-cost-tips-a-tie-to-local",
        "prefill-cache-outweighs-the-transfer",
        "no-prefill-endpoint",
        "zero-threshold-never-disaggregates",
        "no-tokens",
    ],
)
def test_choose(
    tokens: int,
    decode_cached: int,
    prefills: list[tuple[EndpointId, int, float]],
    policy: PdPolicy,
    expected: EndpointId | None,
    reason: PdReason,
) -> None:
    decode = cand(D1, Role.DECODE, decode_cached)
    pool = [cand(e, Role.PREFILL, c, q) for e, c, q in prefills]
    choice = policy.choose(req(tokens), decode, pool)
    assert (choice.prefill, choice.reason) == (expected, reason)


def test_the_transfer_is_what_the_decode_endpoint_lacks() -> None:
    choice = POLICY.choose(req(16000), cand(D1, Role.DECODE, 500), [cand(P1, Role.PREFILL)])
    assert choice.uncached_tokens == 16000 - 500 * 16
    assert choice.transfer_s == pytest.approx(8000 * 1e-5)
    assert choice.disagg_s == pytest.approx(1.6 + 0.08)  # P1 prefills all 16,000 tokens, then the transfer


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        ([Role.BOTH, Role.BOTH], None),
        ([Role.DECODE, Role.DECODE], None),
        ([Role.DECODE, Role.PREFILL], ([D1], [D2])),
        ([Role.BOTH, Role.PREFILL], ([D1], [D1, D2])),
        ([Role.PREFILL, Role.PREFILL], ([D1, D2], [D1, D2])),
    ],
    ids=["aggregated-fleet-no-pd", "decode-only-no-pd", "pools", "both-serves-either", "prefill-only-still-routes"],
)
def test_split_roles(roles: list[Role], expected: tuple[list[EndpointId], list[EndpointId]] | None) -> None:
    split = split_roles([cand(D1, roles[0]), cand(D2, roles[1])])
    ids = None if split is None else tuple([c.endpoint.id for c in pool] for pool in split)
    assert ids == expected


def test_a_prefill_endpoint_is_never_the_decode_pick() -> None:
    profile = build_profile(SchedulingConfig())
    # the prefill endpoint is idle and warm; the decode endpoint is busy: decode still goes to the decode role
    candidates = [cand(P1, Role.PREFILL, cached=900), cand(D1, Role.DECODE, queued=50000.0)]
    decision, choice = decide(profile, POLICY, req(16000), candidates, random.Random(0))
    assert decision.endpoints[0] == D1
    assert choice is not None and choice.prefill == P1


def test_without_a_policy_or_prefill_roles_the_profile_alone_decides() -> None:
    profile = build_profile(SchedulingConfig())
    both = [cand(D1, Role.BOTH), cand(D2, Role.BOTH)]
    assert decide(profile, POLICY, req(16000), both, random.Random(0))[1] is None
    assert (
        decide(profile, None, req(16000), [cand(D1, Role.DECODE), cand(P1, Role.PREFILL)], random.Random(0))[1] is None
    )


@pytest.mark.parametrize("spelling", ["prefill-decode", "both"])
def test_llm_ds_prefill_decode_role_is_both(spelling: str) -> None:
    assert EndpointConfig(address="10.0.0.1:8000", role=spelling).role == "both"  # type: ignore[arg-type]


@pytest.mark.parametrize(("tokens", "header"), [(4000, P1), (100, None)], ids=["long-disaggregated", "short-local"])
async def test_the_decider_names_the_prefill_pod_in_llm_ds_header(tokens: int, header: EndpointId | None) -> None:
    registry = EndpointRegistry([Endpoint(D1, role=Role.DECODE), Endpoint(P1, role=Role.PREFILL)])
    router, _, inflight = make_router(list(range(tokens)), registry=registry, pd=POLICY)
    route = await router.route(post())
    assert isinstance(route, Route)
    assert route.endpoints[0] == D1
    assert route.headers.get(wire.PREFILLER_HEADER) == header
    # the prefill leg is load on the prefill endpoint; the decode endpoint only receives the KV
    assert (inflight.queued_tokens(P1) > 0, inflight.queued_tokens(D1) > 0) == (header is not None, header is None)


async def test_each_discovery_pool_gives_its_endpoints_its_role() -> None:
    pools = [{"name": "decode.llm.svc", "port": 8000, "role": "decode", "nameserver": "127.0.0.1:53"},
             {"name": "prefill.llm.svc", "port": 8000, "role": "prefill", "nameserver": "127.0.0.1:53"}]  # fmt: skip
    app = App(router_config([], discovery={"dns": pools[0], "pools": pools[1:]}))
    try:
        assert len(app.discoveries) == 2
        app._discovered(0, frozenset({D1, D2}))
        app._discovered(1, frozenset({P1}))
        roles = {e: r.endpoint.role for e, r in app.registry.snapshot().items()}
        assert roles == {D1: Role.DECODE, D2: Role.DECODE, P1: Role.PREFILL}
        app._discovered(0, frozenset({D1}))  # D2 is gone; the prefill pool is untouched
        assert set(app.registry.snapshot()) == {D1, P1}
        await app.lifecycle.stop()  # the gone endpoint's cleanups
    finally:
        app.front.shutdown()


async def test_a_short_request_learned_mid_decision_does_not_read_as_a_saturated_prefill_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The CI flake of tests/deploy/test_pd_shapes.py, pinned: an 11-token request served on D2 closes D2's first
    TTFT interval just before a long prompt. That one interval used to move D2's prefill scale to its 4x bound,
    and since the intervals closed while the candidates were priced, D1 (before D2) kept the configured model
    while D2 and the prefill pod (after it, untaught: the fleet's mean) were priced 4x, so the split read as
    saturated. Now every candidate is priced by one learned state, and a short prompt teaches the fixed cost."""
    registry = EndpointRegistry([Endpoint(D1, role=Role.DECODE), Endpoint(D2, role=Role.DECODE),
                                 Endpoint(P1, role=Role.PREFILL)])  # fmt: skip
    calibration = TtftCalibration(RouterMetrics(CollectorRegistry()), cost_learning(SchedulingConfig()))
    tokens = list(range(11))
    router, _, _ = make_router(tokens, registry=registry, pd=POLICY, calibration=calibration)

    def scrape(eid: EndpointId, ttft: PhaseTotals) -> None:
        registry.scraped(eid, EngineMetrics(running=0, waiting=0, kv_usage=0.1, models=frozenset({"m"}), ttft=ttft))

    for eid in (D1, D2, P1):
        scrape(eid, PhaseTotals(0.0, 0))
    short = await router.route(post())
    assert isinstance(short, Route) and wire.PREFILLER_HEADER not in short.headers
    scrape(short.endpoints[0], PhaseTotals(0.05, 1))  # it took 50 ms: the engine's fixed cost, mostly
    tokens[:] = range(4898)
    with caplog.at_level(logging.INFO, logger="extproc.decision"):
        long = await router.route(post())
    assert isinstance(long, Route) and long.headers.get(wire.PREFILLER_HEADER) == P1
    line = json.loads(caplog.records[-1].getMessage())
    assert line["pd"]["reason"] == "disagg"
    learned = calibration.cost(D1)
    assert learned is not None and learned == calibration.cost(D2) == calibration.cost(P1)
    terms = CostTerms(work_s=4898 / 10000.0, running=0, queue_s=0.0, fixed_s=0.0)
    assert line["estimates_s"][D1] == round(ttft_s(terms, learned), 4), "D1 priced by the model D2 just learned"
