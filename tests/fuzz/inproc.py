"""The real router, in process: ``App`` built from a real config (real parser, real Qwen3 tokenizer, real
hashing and indexes), with endpoint load set by hand instead of scraped. Shared by the fuzz and security tests.
The config: ``tests/support/config.router_config``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.stack_config import MODEL
from extproc.app import App
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.types import EndpointId
from tests.support.config import ENDPOINTS, router_config


def mark_scraped(app: App, *, running: int = 0, waiting: int = 0, kv_usage: float = 0.1) -> None:
    """Every endpoint scraped just now: healthy, serving Qwen3, with this load."""
    for eid in app.registry.snapshot():
        metrics = EngineMetrics(running=running, waiting=waiting, kv_usage=kv_usage, models=frozenset({MODEL}))
        app.registry.scraped(EndpointId(eid), metrics)


async def ready_app(endpoints: Sequence[str] = ENDPOINTS, **overrides: Any) -> App:
    """An ``App`` whose router is usable at once (tokenizer loaded, endpoints scraped); nothing listens.

    Call ``await app.stop()`` when done (it closes the indexes and the executor).
    """
    app = App(router_config(endpoints, **overrides))
    failed = await app.preparer.warm_up()
    assert not failed, failed
    mark_scraped(app)
    return app
