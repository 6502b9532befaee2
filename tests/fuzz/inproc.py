"""The real router, in process: ``App`` built from a real config (real parser, real Qwen3 tokenizer, real
hashing and indexes), with endpoint load set by hand instead of scraped. Shared by the fuzz and security tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extproc.app import App
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.config import RouterConfig
from extproc.types import EndpointId

REPO = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-0.6B"
ENDPOINTS = ("127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003")


def router_config(endpoints: Sequence[str] = ENDPOINTS, **overrides: Any) -> RouterConfig:
    """A config for ``endpoints`` serving Qwen3, listening on free loopback ports, metrics off."""
    raw: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "grpc_port": 0, "metrics_port": None},
        "models": [{"name": MODEL}],
        "endpoints": [{"address": e} for e in endpoints],
        "tokenizer_cache_dir": str(REPO / "tokenizer_cache"),
        "limits": {"tokenize_timeout_s": 10.0},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return RouterConfig.model_validate(raw)


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
