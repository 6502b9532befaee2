"""The OpenAI-compatible HTTP API over real sockets on 127.0.0.1 (one in-process server per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from extproc.backends.vllm_metrics import narrow_url, parse_metrics
from tests.sim.helpers import sim_config
from vllm_sim.cluster import SimCluster
from vllm_sim.tokenize import PromptTokenizer

FLAGS = ("--enable-prompt-tokens-details", "--lora-modules", "adapter-x=/models/adapter-x", "--max-model-len",
         "2048", "--num-gpu-blocks-override", "1024", "--sim-output-len", "6")  # fmt: skip


@pytest.fixture
async def base(tokenizer: PromptTokenizer) -> AsyncIterator[str]:
    async with SimCluster(sim_config(*FLAGS), n=1, tokenizer=tokenizer) as cluster:
        yield cluster.urls[0]


async def _post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        data = raw if raw is not None else None
        async with s.post(url, json=None if raw is not None else body, data=data) as r:
            return r.status, await r.json(content_type=None)


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


async def _sse(url: str, body: dict[str, Any]) -> list[Any]:
    """The data lines of an SSE response (JSON-decoded, ``[DONE]`` kept as a string)."""
    import json

    out: list[Any] = []
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            text = line.decode().strip()
            if text.startswith("data: "):
                payload = text[6:]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))


async def test_second_identical_chat_reports_its_full_blocks_cached(base: str, golden_tokens: Any) -> None:
    case = golden_tokens["doc_summary"]
    body = {"messages": case["messages"], "max_tokens": 2}
    _, first = await _post(f"{base}/v1/chat/completions", body)
    _, second = await _post(f"{base}/v1/chat/completions", body)
    n = len(case["token_ids"])
    assert first["usage"]["prompt_tokens"] == n and _cached(first["usage"]) == 0
    assert _cached(second["usage"]) == (n - 1) // 16 * 16
    other = golden_tokens["doc_leading_space"]  # same system block, differs from token 20 (block 1) on
    _, third = await _post(f"{base}/v1/chat/completions", {"messages": other["messages"], "max_tokens": 2})
    assert third["usage"]["prompt_tokens"] == len(other["token_ids"]) and _cached(third["usage"]) == 16


async def test_prompt_differing_in_its_first_token_reports_no_cached_tokens(base: str) -> None:
    ids = list(range(1000, 1100))
    _, first = await _post(f"{base}/v1/completions", {"prompt": ids, "max_tokens": 1})
    _, same = await _post(f"{base}/v1/completions", {"prompt": ids, "max_tokens": 1})
    _, other = await _post(f"{base}/v1/completions", {"prompt": [7, *ids[1:]], "max_tokens": 1})
    assert _cached(same["usage"]) == 96
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # vLLM 0.32 reports the 0


async def test_completion_shapes_lengths_and_finish_reasons(base: str) -> None:
    url = f"{base}/v1/completions"
    _, default = await _post(url, {"prompt": "Hello"})
    assert default["object"] == "text_completion" and default["id"].startswith("cmpl-")
    assert default["choices"][0]["finish_reason"] == "stop"  # simulated EOS after --sim-output-len 6
    assert default["usage"]["completion_tokens"] == 6
    _, capped = await _post(url, {"prompt": "Hello", "max_tokens": 3})
    assert capped["choices"][0]["text"] == " The quick brown"
    assert capped["choices"][0]["finish_reason"] == "length"
    _, forced = await _post(url, {"prompt": [1, 2, 3], "max_tokens": 9, "ignore_eos": True})
    details = {"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None}  # as vLLM 0.32
    assert forced["usage"] == {"prompt_tokens": 3, "total_tokens": 12, "completion_tokens": 9,
                               "prompt_tokens_details": details, "completion_tokens_details": None}  # fmt: skip
    _, least = await _post(url, {"prompt": "Hello", "max_tokens": 20, "min_tokens": 10})
    assert least["usage"]["completion_tokens"] == 10 and least["choices"][0]["finish_reason"] == "stop"


async def test_streaming_chat_with_usage(base: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = await _sse(f"{base}/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-2])
    assert text == " The quick brown"
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 3


async def test_streaming_completion_without_usage(base: str) -> None:
    events = await _sse(f"{base}/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True})
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == " The quick"


@pytest.mark.parametrize(
    ("body", "raw", "status"),
    [
        (None, b"{not json", 400),
        ({"prompt": "x", "max_tokens": 0}, None, 400),
        ({"prompt": "x", "min_tokens": 5, "max_tokens": 2}, None, 400),
        ({"prompt": "x", "model": "nope"}, None, 404),
        ({"prompt": "word " * 3000}, None, 400),
        ({"prompt": []}, None, 400),
        ({"prompt": [10**9]}, None, 400),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, None, 400),
    ],
    ids=[
        "bad-json",
        "max-tokens-0",
        "min-gt-max",
        "unknown-model",
        "too-long",
        "empty",
        "oov-token",
        "stream-options-without-stream",
    ],
)
async def test_bad_input_gets_vllm_errors_and_server_keeps_serving(
    base: str, body: Any, raw: bytes | None, status: int
) -> None:
    got, err = await _post(f"{base}/v1/completions", body, raw)
    assert got == status
    assert err["error"]["code"] == status
    assert err["error"]["type"] in ("BadRequestError", "NotFoundError", "Bad Request")  # the last: pydantic's
    assert (await _get(f"{base}/health"))[0] == 200


def test_max_tokens_beyond_the_context_is_lowered_to_fit() -> None:
    """vLLM 0.32 serves a ``max_tokens`` that does not fit beside the prompt, generating what fits."""
    from vllm_sim.openai_api import check_prompt_len, parse_gen_params, resolve_output_len

    params = parse_gen_params({"prompt": "x", "max_tokens": 10**6, "ignore_eos": True}, "m", chat=False)
    check_prompt_len(1000, 1010)  # no error
    assert resolve_output_len(params, 1000, 1010, natural_len=6) == (10, False)


async def test_models_list_base_and_lora_with_path(base: str) -> None:
    import json

    _, text = await _get(f"{base}/v1/models")
    cards = {c["id"]: c for c in json.loads(text)["data"]}
    assert cards["Qwen/Qwen3-0.6B"]["max_model_len"] == 2048
    assert cards["adapter-x"]["root"] == "/models/adapter-x"
    assert cards["adapter-x"]["parent"] == "Qwen/Qwen3-0.6B"


async def test_lora_requests_have_their_own_cache_namespace(base: str, golden_tokens: Any) -> None:
    body = {"messages": golden_tokens["multi_turn"]["messages"], "max_tokens": 1}
    await _post(f"{base}/v1/chat/completions", body)
    _, lora = await _post(f"{base}/v1/chat/completions", {**body, "model": "adapter-x"})
    assert lora["model"] == "adapter-x" and _cached(lora["usage"]) == 0
    _, salted = await _post(f"{base}/v1/chat/completions", {**body, "cache_salt": "tenant-a"})
    assert _cached(salted["usage"]) == 0


async def test_tokenize_and_render_match_golden(base: str, golden_tokens: Any) -> None:
    chat, comp = golden_tokens["no_thinking"], golden_tokens["completion_unicode"]
    chat_body = {"messages": chat["messages"], "chat_template_kwargs": chat["template_kwargs"]}
    _, tok = await _post(f"{base}/tokenize", chat_body)
    assert tok["tokens"] == chat["token_ids"] and tok["count"] == len(chat["token_ids"])
    _, tok = await _post(f"{base}/tokenize", {"prompt": comp["prompt"]})
    assert tok["tokens"] == comp["token_ids"]
    _, rendered = await _post(f"{base}/v1/chat/completions/render", chat_body)
    assert rendered["token_ids"] == chat["token_ids"]
    _, rendered = await _post(f"{base}/v1/completions/render", {"prompt": comp["prompt"]})
    assert rendered[0]["token_ids"] == comp["token_ids"]


async def test_metrics_names_labels_and_counters(base: str) -> None:
    body = {"prompt": list(range(1000, 1040)), "max_tokens": 2}
    for _ in range(2):
        await _post(f"{base}/v1/completions", body)
    _, text = await _get(f"{base}/metrics")
    labels = '{engine="0",model_name="Qwen/Qwen3-0.6B"}'
    for line in (f"vllm:num_requests_running{labels} 0.0", f"vllm:num_requests_waiting{labels} 0.0",
                 f"vllm:prefix_cache_queries_total{labels} 80.0", f"vllm:prefix_cache_hits_total{labels} 32.0",
                 f"vllm:num_preemptions_total{labels} 0.0", f"vllm:time_to_first_token_seconds_count{labels} 2.0",
                 f"vllm:e2e_request_latency_seconds_count{labels} 2.0",
                 f"vllm:request_queue_time_seconds_count{labels} 2.0",
                 f"vllm:request_prefill_time_seconds_count{labels} 2.0",
                 f"vllm:request_decode_time_seconds_count{labels} 2.0"):  # fmt: skip
        assert line in text
    # what the router reads of them (extproc/backends/vllm_metrics.py): sum and count per phase
    phases = parse_metrics(text)
    assert phases.prefill_time is not None and phases.prefill_time.requests == 2.0
    assert phases.decode_time is not None and phases.decode_time.seconds > 0
    assert "vllm:kv_cache_usage_perc{" in text
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    for label in ('block_size="16"', 'prefix_caching_hash_algo="sha256"', 'enable_prefix_caching="True"',
                  'num_gpu_blocks="1024"', 'engine="0"'):  # fmt: skip
        assert label in info
    assert 'vllm:lora_requests_info{max_lora="1"' in text
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-0.6B"} 2.0' in text


async def test_metrics_below_the_mount_honour_name_filters_as_vllm_does(base: str) -> None:
    # vLLM 0.32 (bench/results/scrape-cost): GET /metrics?name[]=... is the instrumentator's route and answers the
    # whole page; GET /metrics/?name[]=... reaches prometheus_client's app and answers only the named samples.
    await _post(f"{base}/v1/completions", {"prompt": list(range(1000, 1040)), "max_tokens": 2})
    narrowed = narrow_url(f"{base}/metrics")
    assert narrowed is not None and narrowed.startswith(f"{base}/metrics/?name%5B%5D=vllm%3A")
    _, whole = await _get(f"{base}/metrics")
    _, ignored = await _get(narrowed.replace("/metrics/?", "/metrics?"))
    _, narrow = await _get(narrowed)
    assert len(ignored.splitlines()) == len(whole.splitlines())
    assert len(narrow) * 4 < len(whole)
    assert "_bucket" not in narrow and "vllm:e2e_request_latency" not in narrow
    assert parse_metrics(narrow) == parse_metrics(whole)
    _, below = await _get(f"{base}/metrics/")  # no filter: the whole page
    assert len(below.splitlines()) == len(whole.splitlines())


async def test_sim_requests_reports_the_model_ttft(base: str) -> None:
    import json

    _, out = await _post(f"{base}/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    _, text = await _get(f"{base}/sim/requests?ids={out['id']},unknown")
    record = json.loads(text)[out["id"]]
    assert record["output_tokens"] == 2 and 0 < record["model_ttft_s"] <= record["model_e2e_s"]
    assert set(json.loads(text)) == {out["id"]}


async def test_kv_event_sources_disabled_by_default(base: str) -> None:
    import json

    _, text = await _get(f"{base}/kv_event_sources")
    assert json.loads(text)["0"]["enable_kv_cache_events"] is False


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
async def test_client_disconnect_aborts_the_request_and_frees_its_blocks(
    tokenizer: PromptTokenizer, stream: bool
) -> None:
    import asyncio

    cfg = sim_config("--sim-decode-step-s", "0.01")
    async with SimCluster(cfg, tokenizer=tokenizer) as cluster:
        engine = cluster.servers[0].engine
        body = {"prompt": list(range(1000, 1100)), "max_tokens": 1000, "ignore_eos": True, "stream": stream}

        async def call(s: aiohttp.ClientSession) -> None:
            async with s.post(f"{cluster.urls[0]}/v1/completions", json=body) as r:
                await r.read()

        async with aiohttp.ClientSession() as s:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(call(s), timeout=0.3)
        for _ in range(100):
            if not engine.scheduler.running:
                break
            await asyncio.sleep(0.02)
        assert not engine.scheduler.running and engine.pool.usage() == 0.0


async def test_stream_interval_sends_first_token_alone_then_groups(tokenizer: PromptTokenizer) -> None:
    async with SimCluster(sim_config("--stream-interval", "4"), tokenizer=tokenizer) as cluster:
        events = await _sse(f"{cluster.urls[0]}/v1/completions", {"prompt": "Hi", "max_tokens": 9, "stream": True})
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert texts[0] == " The" and len(texts) <= 3
    assert "".join(texts) == " The quick brown fox jumps over the lazy dog"


async def test_an_engine_failure_answers_500_instead_of_hanging(tokenizer: PromptTokenizer) -> None:
    async with SimCluster(sim_config(), tokenizer=tokenizer) as cluster:
        engine = cluster.servers[0].engine

        def broken_step() -> None:
            raise RuntimeError("injected")

        engine.scheduler.schedule = broken_step  # type: ignore[method-assign,assignment]
        for _ in range(2):  # the request in flight, then one sent to the failed engine
            status, err = await _post(f"{cluster.urls[0]}/v1/completions", {"prompt": "Hi"})
            assert status == 500 and err["error"]["type"] == "InternalServerError"
        assert (await _get(f"{cluster.urls[0]}/health"))[0] == 500


async def test_several_prompts_give_one_choice_each_with_summed_usage(base: str) -> None:
    body = {"prompt": ["Hello", [1, 2, 3]], "max_tokens": 3}
    _, out = await _post(f"{base}/v1/completions", body)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert all(c["text"] == " The quick brown" for c in out["choices"])
    assert out["usage"]["prompt_tokens"] == 1 + 3 and out["usage"]["completion_tokens"] == 6
    events = await _sse(f"{base}/v1/completions", {**body, "stream": True})
    by_index: dict[int, str] = {0: "", 1: ""}
    for e in events[:-1]:
        by_index[e["choices"][0]["index"]] += e["choices"][0]["text"]
    assert by_index == {0: " The quick brown", 1: " The quick brown"}
    finished = [e["choices"][0]["index"] for e in events[:-1] if e["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1]


async def test_truncate_prompt_tokens_keeps_the_tail_by_default(base: str) -> None:
    ids = list(range(1000, 1100))
    _, tok = await _post(f"{base}/v1/completions/render", {"prompt": ids, "truncate_prompt_tokens": 10})
    assert tok[0]["token_ids"] == ids[-10:]
    body = {"prompt": ids, "truncate_prompt_tokens": 10, "truncation_side": "right"}
    _, tok = await _post(f"{base}/v1/completions/render", body)
    assert tok[0]["token_ids"] == ids[:10]
    _, out = await _post(f"{base}/v1/completions", {"prompt": ids, "truncate_prompt_tokens": 10, "max_tokens": 1})
    assert out["usage"]["prompt_tokens"] == 10


@pytest.mark.parametrize("salt", ["", "a/b", "a@b", "x" * 129], ids=["empty", "slash", "at", "too-long"])
async def test_invalid_cache_salt_is_400(base: str, salt: str) -> None:
    status, _ = await _post(f"{base}/v1/completions", {"prompt": "Hi", "cache_salt": salt})
    assert status == 400


async def test_reset_prefix_cache_waits_for_idle_unless_running_requests_are_reset(tokenizer: PromptTokenizer) -> None:
    import asyncio

    async with SimCluster(sim_config("--sim-decode-step-s", "0.01"), tokenizer=tokenizer) as cluster:
        base, engine = cluster.urls[0], cluster.servers[0].engine
        body = {"prompt": list(range(1000, 1040)), "max_tokens": 30, "ignore_eos": True}
        task = asyncio.create_task(_post(f"{base}/v1/completions", body))
        while not engine.scheduler.running:
            await asyncio.sleep(0.005)
        first_block = engine.scheduler.running[0].block_hashes[0]
        await _post(f"{base}/reset_prefix_cache", {})
        assert engine.pool.cached_block(first_block) is not None  # refused: blocks in use
        assert engine.reset_prefix_cache(reset_running_requests=True)  # what ?reset_running_requests=true does
        assert engine.scheduler.stats.num_preemptions == 1
        status, out = await task
        assert status == 200 and out["usage"]["completion_tokens"] == 30
