"""The write path against real vLLM: metrics, eviction, reset, and restarts of the picker and of an engine.

Runs after test_exact.py on the same session fleet; the engine restart is last (it costs one engine start-up).
Each test still checks every request it routes (prediction == the engine's cached tokens, served == picked).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

import pytest

from bench.vllm_cpu import MODEL
from extproc.backends.vllm_metrics import narrow_url, parse_metrics
from extproc.config import MemoryIndexConfig
from tests.real_vllm.checks import Checked, Tally, checked, post_json
from tests.real_vllm.fleet import BLOCK_SIZE, NUM_GPU_BLOCKS, Fleet
from tests.real_vllm.prompts import ask, chat, completion, document

pytestmark = [pytest.mark.real_vllm, pytest.mark.envoy, pytest.mark.slow]

CHAT = "/v1/chat/completions"


def engine_index(fleet: Fleet, address: str) -> int:
    return next(i for i, e in enumerate(fleet.engines) if e.address == address)


def scrape(fleet: Fleet, index: int, *, narrowed: bool = False) -> str:
    url = fleet.engine_url(index, "/metrics")
    with urllib.request.urlopen(narrow_url(url) or url if narrowed else url, timeout=5) as resp:
        return str(resp.read().decode())


def wait_for(fleet: Fleet, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until true; on timeout fail with the picker's router_kv / precise counters."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=5) as resp:
        lines = [ln for ln in resp.read().decode().splitlines() if ln.startswith(("router_kv", "router_precise"))]
    raise AssertionError(f"not within {timeout_s}s: {what}\n" + "\n".join(lines))


def test_metrics_parse_with_the_real_label_set(fleet: Fleet) -> None:
    """The one metrics parser reads block size, hash algorithm, capacity and load from real vLLM's page."""
    long_decode = completion("Count:", max_tokens=120)  # decoding a few seconds: long enough to be seen running
    worker = threading.Thread(target=post_json, args=(fleet.engine_url(0, "/v1/completions"), long_decode))
    worker.start()
    seen_running = 0
    deadline = time.monotonic() + 20
    while worker.is_alive() and time.monotonic() < deadline and not seen_running:
        seen_running = parse_metrics(scrape(fleet, 0)).running
        time.sleep(0.05)
    worker.join(timeout=60)
    assert seen_running == 1, "a decoding request must show in vllm:num_requests_running"
    for i in range(len(fleet.engines)):
        text = scrape(fleet, i)
        metrics = parse_metrics(text)
        assert (metrics.block_size, metrics.hash_algo) == (BLOCK_SIZE, fleet.hash_algo)
        assert (metrics.prefix_caching, metrics.num_gpu_blocks, metrics.models) == (
            True,
            NUM_GPU_BLOCKS,
            frozenset({MODEL}),
        )
        assert 'engine="0"' in text and "vllm:num_requests_waiting_by_reason{" in text
        # what the picker reads by default (scrape.narrow_pages): only the samples it parses, the same values
        narrow = scrape(fleet, i, narrowed=True)
        assert len(narrow) * 8 < len(text) and parse_metrics(narrow) == metrics


def evict_after_warm(fleet: Fleet, tally: Tally, name: str, doc: str) -> tuple[Checked, Checked]:
    """Warm ``doc`` through the picker, then fill the engine that took it past capacity with 4 prompts of ~3K
    tokens sent to it directly (~22 blocks each: 88 > 63 blocks), wait out the picker's burst mark, probe."""
    warm_at = time.monotonic()
    warm = checked(fleet, tally, f"{name}/warm", CHAT, chat(ask(doc, "Summarise it.")))
    target = engine_index(fleet, warm.served)
    removed = fleet.picker_counter("router_kv_ingest_blocks_removed_total")
    for seed in (31, 32, 33, 34):
        status, _ = post_json(fleet.engine_url(target, "/v1/completions"), completion(document(seed, sections=90)))
        assert status == 200
    # One more engine step, then a longer quiet window: on a loaded box the last fill's BlockRemoved batch
    # reached the picker after a 0.3 s lull and the probe was predicted on blocks already evicted (CI, 1 run).
    fleet.flush_events(target)
    fleet.wait_ingest_quiet(quiet_s=1.0)
    assert fleet.picker_counter("router_kv_ingest_blocks_removed_total") > removed
    # The picker's burst mark for what it routed (trusted for burst_mark_ttl_s until the engine's events catch
    # up) would outlive a faster eviction: wait it out; the BlockRemoved events must decide after that.
    time.sleep(max(0.0, warm_at + MemoryIndexConfig().burst_mark_ttl_s + 0.2 - time.monotonic()))
    return warm, checked(fleet, tally, f"{name}/probe", CHAT, chat(ask(doc, "Conclusion?")))


def test_block_removed_reaches_the_index(fleet: Fleet, tally: Tally) -> None:
    """A small KV cache (63 usable blocks) filled past capacity evicts the first document: the picker sees the
    BlockRemoved events and does not predict the evicted blocks. Both engines are primed first (one store
    each), so neither is cold when the warm request is routed."""
    fleet.reset_prefix_caches()
    for i in range(len(fleet.engines)):
        post_json(fleet.engine_url(i, "/v1/completions"), completion(document(50 + i)))
    fleet.wait_ingest_quiet()
    warm, probe = evict_after_warm(fleet, tally, "eviction", document(21))
    assert probe.reported < warm.prompt_tokens - BLOCK_SIZE


def test_eviction_of_a_request_routed_while_cold(fleet: Fleet, tally: Tally) -> None:
    """As above without priming: right after the reset both engines are cold when the warm request is routed."""
    fleet.reset_prefix_caches()
    warm, probe = evict_after_warm(fleet, tally, "eviction_cold", document(25))
    assert probe.reported < warm.prompt_tokens - BLOCK_SIZE


def warm_fresh(fleet: Fleet, tally: Tally, name: str, seed: int) -> tuple[str, Checked, int]:
    """Empty caches, then one document through the picker: (the document, its check, the engine index)."""
    fleet.reset_prefix_caches()
    doc = document(seed)
    warm = checked(fleet, tally, f"{name}/warm", CHAT, chat(ask(doc, "Summarise it.")))
    return doc, warm, engine_index(fleet, warm.served)


def test_reset_prefix_cache_clears_the_index(fleet: Fleet, tally: Tally) -> None:
    """``/reset_prefix_cache`` → ``AllBlocksCleared``, which vLLM publishes with its next step only."""
    doc, _, target = warm_fresh(fleet, tally, "reset", 22)
    clears = fleet.picker_counter("router_kv_ingest_clears_total")
    fleet.reset_prefix_cache(target, flush=False)
    fleet.wait_ingest_quiet()
    assert fleet.picker_counter("router_kv_ingest_clears_total") == clears, "an idle engine publishes nothing"
    fleet.flush_events(target)
    assert fleet.picker_counter("router_kv_ingest_clears_total") == clears + 1
    probe = checked(fleet, tally, "reset/probe", CHAT, chat(ask(doc, "Conclusion?")))
    assert probe.reported == 0


def test_picker_restart_rebuilds_the_index_by_replay(fleet: Fleet, tally: Tally) -> None:
    """A new picker process, engines keeping their caches: the replay bootstrap restores what they hold."""
    doc, warm, _ = warm_fresh(fleet, tally, "picker_restart", 23)
    fleet.restart_picker()
    wait_for(fleet, lambda: fleet.picker_counter("router_precise_endpoints") == len(fleet.engines), 20, "precise again")
    wait_for(fleet, lambda: fleet.picker_counter("router_kv_stream_bootstraps_total") >= len(fleet.engines), 20,
             "bootstrap replays")  # fmt: skip
    fleet.wait_ingest_quiet()
    probe = checked(fleet, tally, "picker_restart/probe", CHAT, chat(ask(doc, "Conclusion?")))
    assert probe.reported > 0 and probe.served == warm.served and probe.reason == "cache"
    assert fleet.picker_counter("router_kv_ingest_selfcheck_mismatches_total") == 0


def test_engine_restart_purges_its_old_cache(fleet: Fleet, tally: Tally) -> None:
    """A real engine restart (empty cache, seq 0, no AllBlocksCleared): nothing is predicted on the old cache."""
    doc, _, target = warm_fresh(fleet, tally, "engine_restart", 24)
    purges = fleet.picker_counter("router_kv_ingest_purges_total")
    fleet.restart_engine(target)
    wait_for(fleet, lambda: fleet.picker_counter("router_kv_ingest_purges_total") > purges, 30, "a purge")
    fleet.wait_ingest_quiet()
    probe = checked(fleet, tally, "engine_restart/probe", CHAT, chat(ask(doc, "Conclusion?")))
    assert probe.predicted == 0 == probe.reported
