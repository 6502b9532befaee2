"""``index``: a union on ``backend`` (memory | redis), the old flat spellings still read with a warning."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from extproc.config import MemoryIndexConfig, RedisIndexConfig, RouterConfig

BASE: dict[str, Any] = {"models": [{"name": "m"}], "endpoints": [{"address": "10.0.0.1:8000"}]}
URL = "redis://10.0.0.9:6379/0"


def index(raw: dict[str, Any] | None) -> MemoryIndexConfig | RedisIndexConfig:
    return RouterConfig.model_validate(BASE if raw is None else {**BASE, "index": raw}).index


def test_the_backend_defaults_to_memory() -> None:
    assert isinstance(index(None), MemoryIndexConfig) and isinstance(index({"max_blocks": 9}), MemoryIndexConfig)


def test_redis_takes_its_own_fields() -> None:
    cfg = index({"backend": "redis", "url": URL, "namespace": "pool", "leases": {"ttl_s": 3.0}})
    assert isinstance(cfg, RedisIndexConfig)
    assert (cfg.url, cfg.namespace, cfg.timeout_s, cfg.leases.enabled, cfg.leases.ttl_s) == (
        URL,
        "pool",
        0.05,
        True,
        3.0,
    )


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"backend": "redis"}, id="redis-without-url"),
        pytest.param({"backend": "memory", "url": URL}, id="memory-with-a-redis-field"),
        pytest.param({"backend": "redis", "url": "redis+cluster://h:1/2"}, id="cluster-db"),
        pytest.param({"backend": "disk"}, id="unknown-backend"),
        pytest.param({"backend": "redis", "url": URL, "leases": {"ttl_s": 0.1}}, id="ttl-too-short"),
    ],
)
def test_bad_index_configs_are_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        index(raw)


def _warned(caplog: pytest.LogCaptureFixture) -> str:
    """What the config logged as deprecated (a WARNING on ``extproc.config``, as scheduling's old spelling)."""
    return " ".join(r.getMessage() for r in caplog.records if r.name == "extproc.config" and r.levelname == "WARNING")


def test_the_old_flat_spellings_are_read_with_a_warning_naming_the_new_one(caplog: pytest.LogCaptureFixture) -> None:
    old = {
        "backend": "redis",
        "redis_url": URL,
        "redis_namespace": "pool",
        "redis_timeout_s": 0.2,
        "event_leases": False,
        "event_lease_ttl_s": 4.0,
    }
    with caplog.at_level("WARNING", logger="extproc.config"):
        cfg = index(old)
    assert cfg == index(
        {
            "backend": "redis",
            "url": URL,
            "namespace": "pool",
            "timeout_s": 0.2,
            "leases": {"enabled": False, "ttl_s": 4.0},
        }
    )
    said = _warned(caplog)
    for new in ("index.url", "index.namespace", "index.timeout_s", "index.leases.enabled", "index.leases.ttl_s"):
        assert f"write {new}" in said, said


def test_old_redis_fields_without_the_redis_backend_are_ignored_as_before(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="extproc.config"):
        assert isinstance(index({"redis_url": URL}), MemoryIndexConfig)
    assert "ignored" in _warned(caplog)


def test_every_index_field_has_a_description() -> None:
    from extproc.config import LeasesConfig

    for model in (MemoryIndexConfig, RedisIndexConfig, LeasesConfig):
        missing = [name for name, f in model.model_fields.items() if not f.description]
        assert not missing, (model.__name__, missing)
