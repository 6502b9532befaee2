"""``/metrics`` slow, garbage or missing: the endpoint's load is *unknown*, never taken as idle.

Real HTTP model-server stand-ins serve ``/metrics`` in a mode the test switches; the router's real scraper
reads them on a short interval. For every fault: the endpoint stays eligible (only a refused connection
makes it unhealthy), its load turns unknown within ``stale_after_s``, and the router prefers a busy endpoint
whose load it can read over the unknown one. When the page heals, the load is known again, without a restart.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bench.stack_config import MODEL
from extproc import wire
from extproc.app import App
from extproc.types import EndpointId, HttpRequest, Route
from tests.support.config import router_config
from tests.support.polling import until

GOOD = """# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="%(m)s"} %(running)s
vllm:num_requests_waiting{model_name="%(m)s"} %(waiting)s
vllm:kv_cache_usage_perc{model_name="%(m)s"} 0.2
"""
FAULTS = {
    "slow": None,  # answers after the scrape timeout
    "garbage-text": "<html>502 Bad Gateway</html>",
    "binary": "\udcff\udcfe",
    "empty": "",
    "missing-404": None,
    "server-error-500": None,
    "truncated": GOOD.split("\n", 2)[0] + "\nvllm:num_requests_running{model_name=",
    "nan-gauges": GOOD % {"m": MODEL, "running": "NaN", "waiting": "NaN"},
    "inf-gauges": GOOD % {"m": MODEL, "running": "+Inf", "waiting": "+Inf"},
    "negative-gauges": GOOD % {"m": MODEL, "running": "-50", "waiting": "-50"},
    "no-load-gauges": '# only other metrics\nvllm:prompt_tokens_total{model_name="x"} 5\n',
    "drop-connection": None,
}


class Backend:
    """A model-server stand-in on 127.0.0.1: ``/metrics`` per ``mode``, ``/v1/models`` always fine."""

    def __init__(self, running: int, waiting: int) -> None:
        self.mode = "good"
        self.running, self.waiting = running, waiting
        self.port = 0
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)

    @property
    def endpoint(self) -> EndpointId:
        return EndpointId(f"127.0.0.1:{self.port}")

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)  # a restart keeps the port
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        await self._runner.cleanup()
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)  # ready to start again

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        mode = self.mode
        if mode == "good":
            return web.Response(text=GOOD % {"m": MODEL, "running": self.running, "waiting": self.waiting})
        if mode == "slow":
            await asyncio.sleep(2.0)
            return web.Response(text=GOOD % {"m": MODEL, "running": 0, "waiting": 0})
        if mode == "missing-404":
            raise web.HTTPNotFound()
        if mode == "server-error-500":
            raise web.HTTPInternalServerError()
        if mode == "binary":
            return web.Response(body=b"\xff\xfe\x00garbage\xc3", content_type="text/plain")
        if mode == "drop-connection":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.Response(text=FAULTS[mode])


@pytest.fixture
async def rig() -> AsyncIterator[tuple[App, Backend, Backend]]:
    faulty, busy = Backend(0, 0), Backend(running=12, waiting=3)
    await faulty.start()
    await busy.start()
    config = router_config(
        [faulty.endpoint, busy.endpoint],
        scrape={"interval_s": 0.05, "timeout_s": 0.2, "stale_after_s": 0.4, "discover_interval_s": 1.0},
    )
    app = App(config)
    await app.start()
    yield app, faulty, busy
    await app.stop()
    await faulty.stop()
    await busy.stop()


def chat(i: int) -> HttpRequest:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"question {i} " * 30}]}).encode()
    headers = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    return HttpRequest("POST", "/v1/chat/completions", headers, body, f"r{i}")


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.realtime(
    race="staleness is timed against stale_after_s + 1 s of wall clock; a starved scrape ticker runs late"
)
async def test_bad_metrics_mean_unknown_load_not_idle(rig: tuple[App, Backend, Backend], fault: str) -> None:
    app, faulty, busy = rig
    state = lambda e: app.registry.snapshot()[e]  # noqa: E731
    known = lambda e: state(e).load_known(time.monotonic(), app.config.scrape.stale_after_s)  # noqa: E731
    await until(lambda: known(faulty.endpoint) and known(busy.endpoint))
    first = await app.router.route(chat(0))
    assert isinstance(first, Route) and first.endpoints[0] == faulty.endpoint, "idle and readable: it wins"

    faulty.mode = fault
    took = await until(lambda: not known(faulty.endpoint))
    assert took < app.config.scrape.stale_after_s + 1.0
    if fault == "drop-connection":  # a server that hangs up on every scrape counts as going away
        assert not state(faulty.endpoint).endpoint.healthy
    else:
        assert state(faulty.endpoint).endpoint.healthy, "bad metrics are not a refusal: still eligible"
        assert state(faulty.endpoint).failures > 0, "the failure is counted (and logged once), not raised"
    picks = [await app.router.route(chat(i)) for i in range(1, 6)]
    assert all(isinstance(p, Route) and p.endpoints[0] == busy.endpoint for p in picks), (
        "an endpoint whose load is unknown must not look idle"
    )

    faulty.mode = "good"
    await until(lambda: known(faulty.endpoint), timeout_s=3.0)


async def test_refused_metrics_make_the_endpoint_unhealthy(rig: tuple[App, Backend, Backend]) -> None:
    app, faulty, busy = rig
    await until(lambda: app.registry.snapshot()[faulty.endpoint].metrics is not None)
    await faulty.stop()  # connection refused from now on
    await until(lambda: not app.registry.snapshot()[faulty.endpoint].endpoint.healthy, timeout_s=2.0)
    picks = [await app.router.route(chat(i)) for i in range(5)]
    assert all(isinstance(p, Route) and p.endpoints == (busy.endpoint,) for p in picks)


async def test_a_backend_that_went_down_and_came_back_has_no_phantom_cache(rig: tuple[App, Backend, Backend]) -> None:
    """Without KV events, only our own guesses say what an engine caches. An engine that refused its scrapes
    (died, restarting) comes back empty, so the guesses about it must be gone: no cache is predicted on it."""
    app, faulty, busy = rig
    await until(lambda: app.registry.snapshot()[faulty.endpoint].metrics is not None)
    first = await app.router.route(chat(0))
    assert isinstance(first, Route) and first.endpoints[0] == faulty.endpoint
    await asyncio.sleep(0.05)  # the approximate write is fire-and-forget
    again = await app.router.route(chat(0))
    assert isinstance(again, Route) and int(again.headers[wire.CACHED_TOKENS_HEADER]) > 0, "warm before the restart"
    await faulty.stop()
    await until(lambda: not app.registry.snapshot()[faulty.endpoint].endpoint.healthy)
    await faulty.start()
    await until(lambda: app.registry.snapshot()[faulty.endpoint].endpoint.healthy)
    after = await app.router.route(chat(0))
    assert isinstance(after, Route)
    assert int(after.headers[wire.CACHED_TOKENS_HEADER]) == 0, ("phantom cache predicted after a restart", after)
