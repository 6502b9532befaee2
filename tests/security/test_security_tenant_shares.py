"""Tenant cache shares in the real router (``App`` in process): the bookkeeping is built only when classes are
configured, a routed request is attributed to the class its header names, and the status page and /metrics
carry the per-class view. (cache_salt is untouched: the class is never hashed; test_security_tenants.py.)"""

from __future__ import annotations

import json

from prometheus_client import generate_latest

from bench.stack_config import MODEL
from extproc import wire
from extproc.app import App
from extproc.types import HttpRequest, Route
from tests.fuzz.inproc import ready_app

TENANTS = {"classes": {"premium": {"priority": 1, "protect_hot_prefixes": True, "cache_share": 0.25}}}


def chat(tenant: str, salt: str | None = None) -> HttpRequest:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "The tenant's private contract. " * 60}],
    }
    if salt is not None:
        body["cache_salt"] = salt
    headers = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
               wire.TENANT_HEADER: tenant}  # fmt: skip
    return HttpRequest("POST", "/v1/chat/completions", headers, json.dumps(body).encode(), "r")


async def test_without_classes_there_is_no_bookkeeping() -> None:
    app: App = await ready_app()
    try:
        assert app.occupancy is None
        assert isinstance(await app.router.route(chat("premium")), Route)
    finally:
        await app.stop()


async def test_a_routed_request_is_attributed_to_its_class_and_shown() -> None:
    app: App = await ready_app(tenants=TENANTS)
    try:
        route = await app.router.route(chat("premium", salt="s1"))
        other = await app.router.route(chat("someone", salt="s2"))
        assert isinstance(route, Route) and isinstance(other, Route)
        assert app.occupancy is not None
        assert app.occupancy.view(route.endpoints[0]).inflight_uncached.get("premium", 0) > 0
        assert app.occupancy.view(other.endpoints[0]).inflight_uncached.get("default", 0) > 0
        assert "router_tenant_cache_blocks" in generate_latest(app.metrics.registry).decode()
        assert any('id="tenant-cache"' in section(app.status.view()) for section in app.status.sections)
    finally:
        await app.stop()
