"""The fleet metrics (``extproc/status/collector.py``): every ``router_endpoint_*`` / ``router_model_*`` /
``router_index_*`` / ``router_ceiling_*`` series, read from one small fleet (``tests/support/fleet.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from extproc.backends.vllm_metrics import PhaseTotals
from extproc.kvcache.subscriber import StreamStatus
from extproc.status.collector import FleetCollector
from extproc.status.tap import CEILING_QUEUE
from extproc.status.view import gather
from extproc.types import BlockHash
from tests.support.fleet import A, B, Fleet, decide, make_fleet


def _registry(fleet: Fleet) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: gather(fleet.sources)))
    return registry


@pytest.fixture
def fleet() -> Fleet:
    f = make_fleet()
    f.scrape(
        A,
        running=2,
        waiting=3,
        kv_usage=0.5,
        num_gpu_blocks=100,
        prefix_cache_hits=100.0,
        prefix_cache_queries=400.0,
        prefill_time=PhaseTotals(2.0, 4),
        decode_time=PhaseTotals(8.0, 4),
    )
    f.scrape(B, num_gpu_blocks=200)  # fmt: skip
    f.inflight.add(A, 156)
    f.precise.store_sync(A, [BlockHash(h) for h in range(20)])
    f.approx.store_sync(B, [BlockHash(h) for h in range(100, 110)])
    f.streams[A] = StreamStatus(connected=True, trusted=True, cold=False, last_seq=41, last_event_s=f.clock.now - 2)
    f.blocks[A] = (30, 5)
    decide(f.tap, A, 100, 48, hashes=range(1, 7))
    decide(f.tap, A, 200, 96, hashes=range(1, 13))  # its first 6 blocks were seen: the ceiling hits 96
    decide(f.tap, B, 50, 0, tenant="gold")
    f.tap.drain_ceiling(1000)
    return f


ROWS = [
    ("router_endpoint_running_requests", {"endpoint": A}, 2),
    ("router_endpoint_waiting_requests", {"endpoint": A}, 3),
    ("router_endpoint_kv_usage_ratio", {"endpoint": A}, 0.5),
    ("router_endpoint_load_known", {"endpoint": A}, 1),
    ("router_endpoint_queued_prefill_tokens", {"endpoint": A}, 156),
    ("router_endpoint_cache_occupancy_ratio", {"endpoint": A}, 0.2),  # precise entries: its events are followed
    ("router_endpoint_cache_occupancy_ratio", {"endpoint": B}, 0.05),  # the router's guesses
    ("router_endpoint_routed_requests_total", {"endpoint": A}, 2),
    ("router_endpoint_routed_prompt_tokens_total", {"endpoint": A}, 300),
    ("router_endpoint_predicted_cached_tokens_total", {"endpoint": A}, 144),
    ("router_endpoint_engine_cached_tokens_total", {"endpoint": A}, 100),
    ("router_endpoint_engine_queried_tokens_total", {"endpoint": A}, 400),
    ("router_endpoint_kv_blocks_stored_total", {"endpoint": A}, 30),
    ("router_endpoint_kv_blocks_removed_total", {"endpoint": A}, 5),
    ("router_endpoint_kv_blocks_stored_total", {"endpoint": B}, None),  # not followed: no series
    ("router_endpoint_kv_stream_connected", {"endpoint": A}, 1),
    ("router_endpoint_kv_stream_precise", {"endpoint": A}, 1),
    ("router_endpoint_kv_stream_precise", {"endpoint": B}, None),
    ("router_endpoint_kv_event_age_seconds", {"endpoint": A}, 2.0),
    ("router_endpoint_engine_prefill_seconds_sum", {"endpoint": A}, 2.0),
    ("router_endpoint_engine_prefill_seconds_count", {"endpoint": A}, 4),
    ("router_endpoint_engine_decode_seconds_sum", {"endpoint": A}, 8.0),
    ("router_endpoint_engine_queue_seconds_count", {"endpoint": A}, None),  # the engine exports no histogram
    ("router_endpoint_engine_prefill_seconds_count", {"endpoint": B}, None),
    ("router_endpoint_cached_tokens_actual_to_predicted_ratio", {"endpoint": A}, None),  # no window yet
    ("router_endpoint_index_blocks", {"endpoint": A, "index": "precise"}, 20),
    ("router_endpoint_index_blocks", {"endpoint": B, "index": "approx"}, 10),
    ("router_index_blocks", {"index": "precise"}, 20),
    ("router_index_blocks", {"index": "approx"}, 10),
    ("router_model_routed_requests_total", {"model": "m", "tenant_class": "default"}, 2),
    ("router_model_routed_requests_total", {"model": "m", "tenant_class": "gold"}, 1),
    ("router_model_routed_prompt_tokens_total", {"model": "m", "tenant_class": "default"}, 300),
    ("router_model_predicted_cached_tokens_total", {"model": "m", "tenant_class": "default"}, 144),
    ("router_model_predicted_hit_ratio", {"model": "m", "tenant_class": "default"}, 0.48),
    ("router_model_ceiling_prompt_tokens_total", {"model": "m", "tenant_class": "default"}, 300),
    ("router_model_ceiling_hit_tokens_total", {"model": "m", "tenant_class": "default"}, 96),
    ("router_model_cached_share_ceiling_ratio", {"model": "m", "tenant_class": "default"}, 0.32),
    ("router_model_cached_share_ceiling_ratio", {"model": "m", "tenant_class": "gold"}, 0.0),  # no blocks
    ("router_ceiling_dropped_requests_total", {}, 0),
    ("router_ceiling_queued_requests", {}, 0),
]


@pytest.mark.parametrize(("name", "labels", "expected"), ROWS,
                         ids=[f"{n}-{'-'.join(v.split(':')[0][-1:] for v in ls.values())}" for n, ls, _ in ROWS])  # fmt: skip
def test_each_fleet_metric(fleet: Fleet, name: str, labels: dict[str, str], expected: float | None) -> None:
    value = _registry(fleet).get_sample_value(name, labels)
    assert value == (None if expected is None else pytest.approx(expected))


def test_the_actual_to_predicted_ratio_is_over_the_window(fleet: Fleet) -> None:
    """Between two scrapes the engine reported 60 more cached tokens where the router predicted 120."""
    registry = _registry(fleet)
    assert registry.get_sample_value("router_endpoint_cached_tokens_actual_to_predicted_ratio", {"endpoint": A}) is None
    fleet.clock.now += 10
    fleet.scrape(A, prefix_cache_hits=160.0, prefix_cache_queries=700.0)
    decide(fleet.tap, A, 300, 120)
    view = gather(fleet.sources)
    a = next(e for e in view.endpoints if e.id == A)
    assert a.prediction_ratio == pytest.approx(0.5)
    assert a.engine_hit_ratio == pytest.approx(60 / 300)
    assert a.predicted_hit_ratio == pytest.approx(120 / 300)
    fleet.clock.now += 10
    assert registry.get_sample_value("router_endpoint_cached_tokens_actual_to_predicted_ratio",
                                     {"endpoint": A}) == pytest.approx(0.5)  # fmt: skip


def test_an_engine_restart_starts_its_window_over(fleet: Fleet) -> None:
    gather(fleet.sources)
    fleet.clock.now += 5
    fleet.scrape(A, prefix_cache_hits=10.0, prefix_cache_queries=20.0)  # counters went down: a new engine
    a = next(e for e in gather(fleet.sources).endpoints if e.id == A)
    assert a.engine_hit_ratio is None


def test_kv_stream_rates_come_from_the_event_counters(fleet: Fleet) -> None:
    gather(fleet.sources)
    fleet.clock.now += 4
    fleet.blocks[A] = (70, 13)
    stream = next(e for e in gather(fleet.sources).endpoints if e.id == A).stream
    assert stream is not None
    assert (stream.stored_per_s, stream.removed_per_s) == (pytest.approx(10.0), pytest.approx(2.0))


def test_ceiling_drops_are_counted_when_its_queue_is_full(fleet: Fleet) -> None:
    for _ in range(CEILING_QUEUE + 1):
        decide(fleet.tap, A, 10, 0)
    assert _registry(fleet).get_sample_value("router_ceiling_dropped_requests_total") == 1
    assert _registry(fleet).get_sample_value("router_ceiling_queued_requests") == CEILING_QUEUE


def test_no_engine_metric_name_is_re_exported(fleet: Fleet) -> None:
    text = generate_latest(_registry(fleet)).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert names and all(n.startswith("router_") for n in names)


def test_stale_load_is_absent_not_zero(fleet: Fleet) -> None:
    fleet.clock.now += 10  # past scrape.stale_after_s (2 s)
    registry = _registry(fleet)
    assert registry.get_sample_value("router_endpoint_load_known", {"endpoint": A}) == 0
    for name in ("router_endpoint_running_requests", "router_endpoint_waiting_requests",
                 "router_endpoint_kv_usage_ratio"):  # fmt: skip
        assert registry.get_sample_value(name, {"endpoint": A}) is None, name


def test_every_fleet_family_has_a_row(fleet: Fleet) -> None:
    """A new family in the collector needs its row in ROWS above (and in docs/observability.md)."""
    families = {f.name for f in _registry(fleet).collect()}
    tested = {name for name, _, _ in ROWS} | {"router_endpoint_cached_tokens_actual_to_predicted_ratio"}
    tested_bases = {re.sub(r"_(total|sum|count)$", "", n) for n in tested}
    assert families <= tested_bases, sorted(families - tested_bases)
    documented = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    missing = [f for f in families if f"`{f}" not in documented]
    assert not missing, missing
