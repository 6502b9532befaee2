"""``Router.on_served``: the GIE "destination endpoint served" report, with the router's own fakes."""

import asyncio

from extproc.decider import DeciderSettings
from extproc.router import RouterSettings
from extproc.types import Route
from tests.support.router_fakes import A, B, make_router, post


def _served(router: object, outcome: str) -> float:
    metrics = router._deps.metrics  # type: ignore[attr-defined]
    return float(metrics.served.labels(outcome)._value.get())


async def test_a_fallback_is_counted_and_its_blocks_recorded_on_the_endpoint_that_served() -> None:
    router, approx, _ = make_router(settings=RouterSettings(decider=DeciderSettings(track_served=True)))
    route = await router.route(post())
    assert isinstance(route, Route)
    pick = route.endpoints[0]
    other = B if pick == A else A
    router.on_served("req-1", other)
    await asyncio.sleep(0)  # the approximate-index write is a background task
    assert _served(router, "fallback") == 1 and _served(router, "picked") == 0
    assert approx.held.get(other), "the served endpoint now holds the prompt's blocks"


async def test_the_primary_pick_is_counted_once_and_unknown_ids_are_ignored() -> None:
    router, _, _ = make_router(settings=RouterSettings(decider=DeciderSettings(track_served=True)))
    route = await router.route(post())
    assert isinstance(route, Route)
    router.on_served("req-1", route.endpoints[0])
    router.on_served("req-1", route.endpoints[0])  # reported twice: the second finds nothing
    router.on_served("never-routed", A)
    assert _served(router, "picked") == 1 and _served(router, "fallback") == 0


async def test_picks_are_not_remembered_unless_tracking_is_on() -> None:
    router, _, _ = make_router()
    route = await router.route(post())
    assert isinstance(route, Route)
    router.on_served("req-1", route.endpoints[0])
    assert _served(router, "picked") == 0
