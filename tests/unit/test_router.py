"""Router.route() with hand-written fakes: what it routes, what it records, how it degrades."""

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

from extproc import wire
from extproc.backends.hot_blocks import HotBlocks
from extproc.backends.registry import EndpointRegistry
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.decider import DeciderSettings
from extproc.errors import BadRequest, NoEndpoint
from extproc.router import Router, RouterSettings
from extproc.types import (
    Candidate,
    Decision,
    DueCall,
    Endpoint,
    EndpointId,
    HttpRequest,
    PassThrough,
    Reason,
    Route,
    RoutingRequest,
)
from tests.support.router_fakes import A, B, DictIndex, make_router, post

T = TypeVar("T")


async def test_non_llm_requests_pass_through() -> None:
    router, _, _ = make_router()
    assert isinstance(await router.route(HttpRequest("GET", "/v1/models", {}, b"", "r")), PassThrough)
    assert isinstance(await router.route(post(path="/metrics")), PassThrough)


@pytest.mark.parametrize(
    ("path", "routed"),
    [("/v1/chat/completions", True), ("/v1/completions?stream=1", True), ("/v1/completions/", False)],
    ids=["chat", "query-string", "trailing-slash-is-vllms-307"],
)
async def test_the_parsers_paths_are_the_routers(path: str, routed: bool) -> None:
    """One classification (``kind_for_path``): vLLM redirects a trailing slash (307) and serves nothing there,
    so the router passes it through, as the parser would not parse it."""
    router, _, _ = make_router()
    assert isinstance(await router.route(post(path=path)), Route if routed else PassThrough)


async def test_second_request_follows_the_first_through_the_approximate_index() -> None:
    """Back to back, with no turn of the event loop between them (a burst): the first pick is recorded before
    the second is decided."""
    router, approx, inflight = make_router()
    first = await router.route(post())
    second = await router.route(post())
    assert isinstance(first, Route) and isinstance(second, Route)
    assert second.endpoints[0] == first.endpoints[0]
    assert second.headers["x-router-reason"] == "cache"
    assert int(second.headers["x-router-cached-tokens"]) == 992  # 62 full blocks of 16, last token excluded
    assert set(second.endpoints) == {A, B}


async def test_a_burst_spreads_because_routed_work_counts_as_load() -> None:
    router, _, _ = make_router()
    picks = []
    for i in range(4):
        router._deps.preparer.tokens = [i * 10000 + t for t in range(1000)]  # type: ignore[attr-defined]
        result = await router.route(post())
        assert isinstance(result, Route)
        picks.append(result.endpoints[0])
    assert picks.count(A) == 2 and picks.count(B) == 2


@pytest.mark.parametrize("index", [DictIndex(fail=True), DictIndex(delay_s=0.2)], ids=["down", "slow"])
async def test_index_failure_routes_by_load(index: DictIndex) -> None:
    router, _, _ = make_router(approx=index, settings=RouterSettings(decider=DeciderSettings(lookup_deadline_s=0.01)))
    result = await router.route(post())
    assert isinstance(result, Route) and result.headers["x-router-reason"] == "load"


async def test_a_lookup_past_its_deadline_is_logged_at_info_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    router, _, _ = make_router(
        precise=DictIndex(delay_s=0.2),
        precise_endpoints=lambda: frozenset({A, B}),
        settings=RouterSettings(decider=DeciderSettings(lookup_deadline_s=0.01)),
    )
    with caplog.at_level(logging.INFO, logger="extproc.decider"):
        for _ in range(3):
            await router.route(post())
    lines = [r for r in caplog.records if r.name == "extproc.decider" and "lookup failed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, lines  # three misses, one line
    assert "precise" in lines[0].getMessage() and "no answer within 0.01s" in lines[0].getMessage()


async def test_which_endpoints_are_precise_is_asked_once_per_request() -> None:
    asked: list[int] = []

    def precise_endpoints() -> frozenset[EndpointId]:
        asked.append(1)
        return frozenset({A})

    precise = DictIndex()
    router, _, _ = make_router(precise=precise, precise_endpoints=precise_endpoints)
    result = await router.route(post())
    assert isinstance(result, Route) and len(asked) == 1


async def test_tokenizer_failure_routes_by_load() -> None:
    router, _, _ = make_router()
    router._deps.preparer.tokens = None  # type: ignore[attr-defined]
    result = await router.route(post())
    assert isinstance(result, Route) and result.headers["x-router-reason"] == "no_tokens"


async def test_bad_input_raises_the_typed_error() -> None:
    router, _, _ = make_router()
    with pytest.raises(BadRequest):
        await router.route(post(b"bad"))


async def test_subset_hint_restricts_and_empty_subset_is_no_endpoint() -> None:
    router, _, _ = make_router()
    result = await router.route(post(subset=(B,)))
    assert isinstance(result, Route) and result.endpoints == (B,)
    with pytest.raises(NoEndpoint):
        await router.route(post(subset=()))


async def test_unhealthy_endpoints_are_skipped() -> None:
    registry = EndpointRegistry([Endpoint(A), Endpoint(B)])
    router, _, _ = make_router(registry=registry)
    registry.failed(A, unreachable=True)
    registry.failed(A, unreachable=True)
    for _ in range(3):
        result = await router.route(post())
        assert isinstance(result, Route) and result.endpoints == (B,)


async def test_a_decision_applies_the_load_answers_in_before_reading_the_registry() -> None:
    # the scraper's deferred reads: an answer that arrived since the last round counts for this decision
    registry = EndpointRegistry([Endpoint(A), Endpoint(B)])
    arrived = [(A, EngineMetrics(running=8, waiting=40, kv_usage=0.9, models=frozenset({"m"})))]

    def fresh_load() -> None:
        while arrived:
            registry.scraped(*arrived.pop())

    router, _, _ = make_router(registry=registry, fresh_load=fresh_load, tokens=[])
    result = await router.route(post())
    assert isinstance(result, Route) and result.endpoints[0] == B and not arrived


async def test_the_load_answers_in_by_the_headers_are_read_before_the_body_comes() -> None:
    # the round trip to Envoy between the headers reply and the body is the picker's: the answers that arrived
    # are applied then, and the decision finds them applied (nothing left on its own path)
    registry = EndpointRegistry([Endpoint(A), Endpoint(B)])
    arrived = [(A, EngineMetrics(running=8, waiting=40, kv_usage=0.9, models=frozenset({"m"})))]
    applied: list[int] = []

    def fresh_load() -> None:
        applied.append(len(arrived))
        while arrived:
            registry.scraped(*arrived.pop())

    router, _, _ = make_router(registry=registry, fresh_load=fresh_load, tokens=[])
    router.body_coming()
    assert not arrived and applied == [1]
    result = await router.route(post())
    assert isinstance(result, Route) and result.endpoints[0] == B and applied == [1, 0]


async def test_load_only_mode_never_hashes_or_looks_up() -> None:
    approx = DictIndex(fail=True)  # would count a failure if it were asked
    router, _, _ = make_router(approx=approx, settings=RouterSettings(use_index=False))
    first = await router.route(post())
    second = await router.route(post())
    assert isinstance(first, Route) and isinstance(second, Route)
    assert second.headers["x-router-reason"] == "load"
    assert router._deps.metrics.index_failures.labels("approx")._value.get() == 0


async def test_prompt_text_is_logged_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="extproc.decision")
    quiet, _, _ = make_router()
    await quiet.route(post(b'{"secret prompt": 1}'))
    assert "secret prompt" not in caplog.text
    loud, _, _ = make_router(settings=RouterSettings(decider=DeciderSettings(log_prompts=True)))
    await loud.route(post(b'{"secret prompt": 1}'))
    assert "secret prompt" in caplog.text


async def test_the_decision_line_names_its_numbers(caplog: pytest.LogCaptureFixture) -> None:
    """The TTFT profile's estimates are seconds (lower is better), never printed as "scores"."""
    caplog.set_level("INFO", logger="extproc.decision")
    router, _, _ = make_router()
    await router.route(post())
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "extproc.decision"]
    assert set(line["estimates_s"]) == {A, B} and line["scores"] == {}


async def test_a_late_request_is_routed_by_load_without_tokenizing() -> None:
    router, _, _ = make_router(settings=RouterSettings(answer_budget_s=0.5))
    preparer = router._deps.preparer
    now = time.monotonic()
    fresh = HttpRequest("POST", "/v1/chat/completions", {}, b"{}", "r1", received_at_s=now)
    route = await router.route(fresh)
    assert isinstance(route, Route) and route.headers[wire.REASON_HEADER] != Reason.NO_TOKENS.value
    assert 0.4 < preparer.budgets[-1] <= 0.5  # the rest of the budget
    late = HttpRequest("POST", "/v1/chat/completions", {}, b"{}", "r2", received_at_s=now - 0.6)
    route = await router.route(late)
    assert isinstance(route, Route) and route.headers[wire.REASON_HEADER] == Reason.NO_TOKENS.value
    assert preparer.budgets[-1] <= 0
    assert router._deps.metrics.late_requests._value.get() == 1
    untimed = HttpRequest("POST", "/v1/chat/completions", {}, b"{}", "r3")
    await router.route(untimed)
    assert preparer.budgets[-1] is None  # no arrival time: the tokenizer's own timeout applies


@pytest.mark.parametrize(
    ("live", "expected_ttl_s"),
    [(True, 2.0), (False, 600.0)],
    ids=["event-fed-but-cold: a burst mark", "no-events: a guess"],
)
async def test_the_record_of_a_pick_lives_only_until_events_can_report_it(live: bool, expected_ttl_s: float) -> None:
    """An event-fed endpoint that is cold (just purged or reset: not precise yet) gets a short burst mark, not a
    600 s guess, so the engine's later BlockRemoved is not outlived by our own record (found on real vLLM)."""
    router, approx, _ = make_router(
        settings=RouterSettings(decider=DeciderSettings(burst_mark_ttl_s=2.0, approx_ttl_s=600.0))
    )
    decider = router.decider
    decider._deps = dataclasses.replace(decider._deps, has_live_events=lambda e: live)  # type: ignore[attr-defined]
    route = await router.route(post())
    assert isinstance(route, Route)
    await asyncio.sleep(0)  # the record is a background write
    await asyncio.sleep(0)
    assert approx.ttls == [(route.endpoints[0], expected_ttl_s)]


async def test_every_decision_reaches_the_status_tap() -> None:
    """``_observe`` hands the tap the request and its decision (the tap does the counting: tests/unit/test_status_tap.py)."""
    router, _, _ = make_router()
    seen: list[tuple[str, str, int]] = []

    class Tap:
        def decided(self, routing: RoutingRequest, decision: Decision) -> None:
            seen.append((routing.request_id, decision.endpoints[0], decision.cached_tokens))

    router._deps.metrics.tap = Tap()
    route = await router.route(post())
    assert isinstance(route, Route)
    assert seen == [("req-1", route.endpoints[0], int(route.headers[wire.CACHED_TOKENS_HEADER]))]


def spy_on_decisions(router: Router, read: Callable[[RoutingRequest, Sequence[Candidate]], T]) -> list[T]:
    """What ``read`` takes from each request the router's profile decides and its candidates, in order (the
    profile unchanged)."""
    seen: list[T] = []
    real = router.decider._deps.profile  # type: ignore[attr-defined]

    class Spy:
        def decide(self, request: RoutingRequest, candidates: Sequence[Candidate], rng: random.Random) -> Decision:
            seen.append(read(request, candidates))
            return real.decide(request, candidates, rng)  # type: ignore[no-any-return]

    router.decider._deps = dataclasses.replace(router.decider._deps, profile=Spy())  # type: ignore[attr-defined]
    return seen


def spy_on_requests(router: Router, read: Callable[[RoutingRequest], float]) -> list[float]:
    """What ``read`` takes from each request the router's profile decides, in order (the profile unchanged)."""
    return spy_on_decisions(router, lambda request, _: read(request))


async def test_the_decisions_tell_the_next_how_often_new_prefixes_were_followed() -> None:
    """Each decision's reason feeds ``PrefixReuse``; the next request carries the ratio to the profile: cold
    placements nobody followed narrow the placement window, a request that finds its prefix widens it again."""
    router, _, _ = make_router()
    seen = spy_on_requests(router, lambda request: request.prefix_followers)
    for i in range(4):
        router._deps.preparer.tokens = [i * 10000 + t for t in range(1000)]  # type: ignore[attr-defined]
        assert (await router.route(post())).headers["x-router-reason"] == "load"  # type: ignore[union-attr]
    assert (await router.route(post())).headers["x-router-reason"] == "cache"  # type: ignore[union-attr]
    await router.route(post())
    # the prior (one of each) fades by 1/64 per decision: (warm + p) / (cold + p), p = 1 - n/64
    p = [1 - n / 64 for n in range(6)]
    expected = [
        1.0,
        p[1] / (1 + p[1]),
        p[2] / (2 + p[2]),
        p[3] / (3 + p[3]),
        p[4] / (4 + p[4]),
        (1 + p[5]) / (4 + p[5]),
    ]
    assert seen == pytest.approx(expected)


async def test_the_decisions_tell_the_next_how_long_chains_run() -> None:
    """A warm decision continues an earlier request's own context when its cached prefix ends in blocks one
    earlier request stored and nobody hit or placed since, or where a recent prompt ended (a chain's second call
    after a first call placed cold); one that ends in a shared placed prefix (a second question about a
    document) starts something. Each continuation's time since the call it continued is the chain's gap:
    while the window fills, starts younger than the mean gap are not counted against the continuations
    (``PrefixReuse.chain_followers``)."""
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    router, _, _ = make_router(hot_blocks=HotBlocks(lambda endpoint: 1024, clock=clock), clock=clock)
    seen = spy_on_requests(router, lambda request: request.chain_followers)
    document = list(range(320))  # 20 blocks
    first = document + list(range(1000, 1200))  # placed cold (32 full blocks)
    second = first + list(range(2000, 2200))  # ends where the first's prompt ended: continues it
    question = document + list(range(5000, 5200))  # ends in the placed document: starts something
    follow_up = question + list(range(3000, 3200))  # continues the question
    new = list(range(90000, 90400))  # shares nothing
    reasons = []
    for at, tokens in [(0.0, first), (1.0, second), (2.0, question), (2.5, follow_up), (3.0, new)]:
        now[0] = at
        router._deps.preparer.tokens = tokens  # type: ignore[attr-defined]
        reasons.append((await router.route(post())).headers["x-router-reason"])  # type: ignore[union-attr]
    # the question stays on the document's endpoint though the second call's continuation is due there by then
    # (``scheduling.due_calls``): the two calls routed there are past their predicted first tokens and no longer
    # queue ahead of it (``InflightLoad.queued_since_scrape``); a move would count the same
    assert reasons == ["load", "cache", "cache", "cache", "load"]

    def blend(seen: int, continued: int, old_starts: int) -> float:
        # the ratio (one start counted in advance, fading by 1/64 per decision) blended by how full the window
        # is with continued per start at least the mean gap old
        ratio = continued / max(seen - continued + (1 - seen / 64), 1)
        return seen / 64 * ratio + (1 - seen / 64) * continued / max(old_starts, 1)

    assert seen == pytest.approx([
        0.0, 0.0,  # no continuation yet
        blend(2, 1, 1),  # at 2.0 s, gaps [1.0]: the start at 0 s is old enough
        blend(3, 1, 1),  # at 2.5 s: the question (2.0 s) is younger than the gap, not counted yet
        blend(4, 2, 2),  # at 3.0 s, gaps [1.0, 0.5]: both starts count
    ])  # fmt: skip


async def test_each_candidate_carries_the_chains_calls_due_on_it(caplog: pytest.LogCaptureFixture) -> None:
    """A chain's call is due on the endpoint its last call went to, the measured time after that call's predicted
    first token (``scheduling.due_calls``); the chain's own next call is not due beside itself. What going
    where a call is due would cost it is in the decision line."""
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    router, _, _ = make_router(hot_blocks=HotBlocks(lambda endpoint: 1024, clock=clock), clock=clock)
    real = router.decider._deps.profile  # type: ignore[attr-defined]
    seen: list[tuple[dict[EndpointId, tuple[float, ...]], Decision]] = []

    class Spy:
        def decide(self, request: RoutingRequest, candidates: Sequence[Candidate], rng: random.Random) -> Decision:
            decision = real.decide(request, candidates, rng)
            seen.append(({c.endpoint.id: c.load.calls_due_s for c in candidates}, decision))
            return decision  # type: ignore[no-any-return]

    router.decider._deps = dataclasses.replace(router.decider._deps, profile=Spy())  # type: ignore[attr-defined]
    first = list(range(320))  # placed cold at 0 s
    second = first + list(range(1000, 1200))  # continues it at 1 s
    third = second + list(range(2000, 2200))  # continues the second at 1.5 s
    for at, tokens in [(0.0, first), (1.0, second), (1.5, list(range(90000, 90400))), (1.5, third)]:
        now[0] = at
        router._deps.preparer.tokens = tokens  # type: ignore[attr-defined]
        await router.route(post())
    first_token = [decision.estimates_s[decision.endpoints[0]] for _, decision in seen]
    after_s = 1.0 - first_token[0]  # the first call's predicted first token to the second call
    home = seen[1][1].endpoints[0]
    assert seen[0][0] == {A: (), B: ()} and seen[1][0] == {A: (), B: ()}  # nothing measured yet
    # a request that shares nothing, at 1.5 s: the second call's continuation is due on its endpoint
    assert seen[2][0][home] == pytest.approx((1.0 + first_token[1] + after_s - 1.5,))
    assert seen[2][0][B if home == A else A] == ()
    # the second call's continuation at 1.5 s is not due beside itself; the request that shares nothing went to
    # the endpoint with no hot prefix, and its call is due there
    other = seen[2][1].endpoints[0]
    assert other != home
    assert seen[3][0] == {home: (), other: pytest.approx((first_token[2] + after_s,))}
    # a new request 10 ms before the third call's continuation is due on its endpoint (after the time the chain
    # itself last took): the decision line says what going there costs that call
    now[0] = 1.5 + first_token[3] + (1.5 - 1.0 - first_token[1]) - 0.01
    router._deps.preparer.tokens = list(range(70000, 70400))  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="extproc.decision"):
        await router.route(post())
    line = json.loads(caplog.records[-1].getMessage())
    assert line["due_s"][home] > 0


async def test_replicas_that_tell_each_other_their_routed_calls_know_each_others_calls_due() -> None:
    """Once chains are measured, each routed call is told (``on_due_call``): a chain's first call as not measured,
    its next one with the time its chain took and the call it continued. A replica that hears them expects the
    other's chains' next calls where they went (``index.share_due_calls``)."""
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    x, _, _ = make_router(hot_blocks=HotBlocks(lambda endpoint: 1024, clock=clock), clock=clock)
    y, _, _ = make_router(hot_blocks=HotBlocks(lambda endpoint: 1024, clock=clock), clock=clock)
    told: list[DueCall] = []

    def tell(call: DueCall) -> None:
        told.append(call)
        y.decider.heard_due_call(call)  # type: ignore[attr-defined]

    x.decider._deps = dataclasses.replace(x.decider._deps, on_due_call=tell)  # type: ignore[attr-defined]
    due = spy_on_decisions(y, lambda _, candidates: {c.endpoint.id: c.load.calls_due_s for c in candidates})
    # each replica's own chain first (placed cold, then continued), then x's second chain
    own, first, other = list(range(320)), list(range(20000, 20320)), list(range(40000, 40320))
    for at, router, tokens in [(0.0, y, own), (0.1, x, first), (1.0, y, own + list(range(1000, 1200))),
                               (1.1, x, first + list(range(1000, 1200))), (1.3, x, other),
                               (2.3, x, other + list(range(2000, 2200)))]:  # fmt: skip
        now[0] = at
        router._deps.preparer.tokens = tokens  # type: ignore[attr-defined]
        await router.route(post())
    # nothing told before x measured a chain; then the second chain's first call, and its next one
    assert [(c.blocks, c.after_s is None) for c in told] == [(20, True), (32, False)]
    assert (told[0].continues, told[1].continues) == (None, told[0].block)  # the first placed cold; continued
    now[0] = 2.5
    y._deps.preparer.tokens = list(range(90000, 90400))  # type: ignore[attr-defined]
    await y.route(post())
    # x's chain's next call, due the time it took after its second call's predicted first token (y's own chain's
    # next call is long past due by now)
    heard_due = 2.3 + told[1].first_token_in_s + (told[1].after_s or 0.0) - 2.5
    assert {e: d for e, d in due[-1].items() if d} == {told[1].endpoint: pytest.approx((heard_due,))}


async def test_each_candidate_carries_its_prefix_hits_and_their_gap_and_the_request_how_full_the_window_is() -> None:
    """The move rule's inputs (``sessions.lasting_hits``) as the decider hands them to the profile."""
    now = [0.0]
    router, _, _ = make_router(hot_blocks=HotBlocks(lambda endpoint: 1024, clock=lambda: now[0]))
    seen = spy_on_decisions(
        router,
        lambda request, candidates: (
            request.chains_measured,
            {c.endpoint.id: (c.prefix_hits, c.prefix_hit_gap_s) for c in candidates},
        ),
    )
    prefix = list(range(320))  # 20 blocks, placed cold at 0 s
    picks = []
    for at, question in [(0.0, 1000), (1.0, 2000), (4.0, 3000)]:
        now[0] = at
        router._deps.preparer.tokens = prefix + list(range(question, question + 200))  # type: ignore[attr-defined]
        picks.append((await router.route(post())).endpoints[0])  # type: ignore[union-attr]
    home = picks[0]
    other = B if home == A else A
    assert picks[1] == home  # (where the third goes is the profile's business)
    # the third request: the prefix placed at 0 s and hit once since (at 1 s), read at 4 s
    assert seen[2] == (2 / 64, {home: (1, 4.0), other: (0, None)})
    assert [measured for measured, _ in seen] == [0.0, 1 / 64, 2 / 64]
