"""Router.route() with hand-written fakes: what it routes, what it records, how it degrades."""

import asyncio
import dataclasses
import time

import pytest

from extproc.backends.registry import EndpointRegistry
from extproc.errors import BadRequest, NoEndpoint
from extproc.router import HEADER_REASON, RouterSettings
from extproc.types import (
    Endpoint,
    HttpRequest,
    PassThrough,
    Reason,
    Route,
)
from tests.support.router_fakes import A, B, DictIndex, make_router, post


async def test_non_llm_requests_pass_through() -> None:
    router, _, _ = make_router()
    assert isinstance(await router.route(HttpRequest("GET", "/v1/models", {}, b"", "r")), PassThrough)
    assert isinstance(await router.route(post(path="/metrics")), PassThrough)


async def test_second_request_follows_the_first_through_the_approximate_index() -> None:
    router, approx, inflight = make_router()
    first = await router.route(post())
    await asyncio.sleep(0)  # let the approximate-index write land
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
        router._d.preparer.tokens = [i * 10000 + t for t in range(1000)]  # type: ignore[attr-defined]
        result = await router.route(post())
        assert isinstance(result, Route)
        picks.append(result.endpoints[0])
    assert picks.count(A) == 2 and picks.count(B) == 2


@pytest.mark.parametrize("index", [DictIndex(fail=True), DictIndex(delay_s=0.2)], ids=["down", "slow"])
async def test_index_failure_routes_by_load(index: DictIndex) -> None:
    router, _, _ = make_router(approx=index, settings=RouterSettings(lookup_deadline_s=0.01))
    result = await router.route(post())
    assert isinstance(result, Route) and result.headers["x-router-reason"] == "load"


async def test_tokenizer_failure_routes_by_load() -> None:
    router, _, _ = make_router()
    router._d.preparer.tokens = None  # type: ignore[attr-defined]
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


async def test_load_only_mode_never_hashes_or_looks_up() -> None:
    approx = DictIndex(fail=True)  # would count a failure if it were asked
    router, _, _ = make_router(approx=approx, settings=RouterSettings(use_index=False))
    first = await router.route(post())
    second = await router.route(post())
    assert isinstance(first, Route) and isinstance(second, Route)
    assert second.headers["x-router-reason"] == "load"
    assert router._d.metrics.index_failures.labels("approx")._value.get() == 0


async def test_prompt_text_is_logged_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="extproc.decision")
    quiet, _, _ = make_router()
    await quiet.route(post(b'{"secret prompt": 1}'))
    assert "secret prompt" not in caplog.text
    loud, _, _ = make_router(settings=RouterSettings(log_prompts=True))
    await loud.route(post(b'{"secret prompt": 1}'))
    assert "secret prompt" in caplog.text


async def test_a_late_request_is_routed_by_load_without_tokenizing() -> None:
    router, _, _ = make_router(settings=RouterSettings(answer_budget_s=0.5))
    preparer = router._d.preparer
    now = time.monotonic()
    fresh = HttpRequest("POST", "/v1/chat/completions", {}, b"{}", "r1", received_at_s=now)
    route = await router.route(fresh)
    assert isinstance(route, Route) and route.headers[HEADER_REASON] != Reason.NO_TOKENS.value
    assert 0.4 < preparer.budgets[-1] <= 0.5  # the rest of the budget
    late = HttpRequest("POST", "/v1/chat/completions", {}, b"{}", "r2", received_at_s=now - 0.6)
    route = await router.route(late)
    assert isinstance(route, Route) and route.headers[HEADER_REASON] == Reason.NO_TOKENS.value
    assert preparer.budgets[-1] <= 0
    assert router._d.metrics.late_requests._value.get() == 1
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
    router, approx, _ = make_router(settings=RouterSettings(burst_mark_ttl_s=2.0, approx_ttl_s=600.0))
    router._d = dataclasses.replace(router._d, has_live_events=lambda e: live)
    route = await router.route(post())
    assert isinstance(route, Route)
    await asyncio.sleep(0)  # the record is a background write
    await asyncio.sleep(0)
    assert approx.ttls == [(route.endpoints[0], expected_ttl_s)]
