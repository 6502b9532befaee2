"""P/D in the simulator: vLLM's NixlConnector legs and llm-d's decode sidecar (``vllm_sim.pd``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq.asyncio

from tests.sim.helpers import sim_config
from tests.sim.test_events_integration import Subscriber
from vllm_sim import pd
from vllm_sim.cluster import SimCluster
from vllm_sim.config import ServerConfig
from vllm_sim.tokenize import PromptTokenizer

NIXL = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
PROMPT = list(range(1000, 1000 + 16 * 20 + 5))  # 20 full blocks and a tail


def _config(tmp: Path, name: str, *flags: str) -> ServerConfig:
    kv = {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp}/{name}", "topic": f"kv@{name}"}
    return sim_config("--kv-events-config", msgspec.json.encode(kv).decode(), "--enable-prompt-tokens-details",
                      "--kv-transfer-config", NIXL, *flags)  # fmt: skip


async def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
        return answer


async def _stored(sub: Subscriber) -> list[int]:
    _, _, events = await sub.recv()
    return [h for e in events if e["type"] == "BlockStored" for h in e["block_hashes"]]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": "x", "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True}},
         {"prompt": "x", "max_tokens": 1, "stream": False}),
        ({"messages": [], "max_completion_tokens": 9, "min_tokens": 4},
         {"messages": [], "max_completion_tokens": 1, "min_tokens": 1, "max_tokens": 1, "stream": False}),
    ],
    ids=["completion-streamed", "chat-limits"],
)  # fmt: skip
def test_the_prefill_leg_is_one_token_not_streamed_asking_for_a_remote_decode(
    body: dict[str, Any], expected: dict[str, Any]
) -> None:
    out = pd.prefill_leg_body(body)
    params = out.pop("kv_transfer_params")
    assert out == expected
    assert params == {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                      "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


@pytest.mark.parametrize(
    ("params", "valid"),
    [
        ({"do_remote_prefill": True, "remote_block_ids": [0], "remote_engine_id": "e", "remote_request_id": "r",
          "remote_host": "h", "remote_port": 1}, True),
        ({"do_remote_prefill": True, "remote_block_ids": [0], "remote_engine_id": "e"}, False),
        ({"do_remote_decode": True}, False),
        (None, False),
    ],
    ids=["complete", "missing-remote-fields", "a-prefill-leg", "none"],
)  # fmt: skip
def test_decode_legs_need_every_remote_field(params: dict[str, Any] | None, valid: bool) -> None:
    assert (pd.remote_prefill({"kv_transfer_params": params}) is not None) == valid


def test_the_transfer_model_is_setup_plus_bytes_over_bandwidth() -> None:
    model = pd.TransferModel(gbps=25.0, bytes_per_token=131_072, setup_s=0.001)
    assert model.seconds(0, 16) == 0.0
    assert model.seconds(1024, 16) == pytest.approx(0.001 + 1024 * 16 * 131_072 / 25e9)  # 16K tokens: ~87 ms


async def test_the_sidecar_prefills_remotely_then_decodes_with_the_transferred_blocks(
    tokenizer: PromptTokenizer, tmp_path: Path
) -> None:
    ctx = zmq.asyncio.Context()
    psub, dsub = Subscriber(ctx, f"ipc://{tmp_path}/p"), Subscriber(ctx, f"ipc://{tmp_path}/d")
    prefill_cfg = _config(tmp_path, "p")
    # a slow link (0.05 GB/s) so that the transfer shows in the decode leg's time: 20 blocks -> ~0.84 s
    decode_cfg = _config(tmp_path, "d", "--sim-pd-sidecar", "--sim-kv-transfer-gbps", "0.05")
    try:
        async with SimCluster(prefill_cfg, tokenizer=tokenizer) as p, SimCluster(decode_cfg, tokenizer=tokenizer) as d:
            await psub.connected()
            await dsub.connected()
            prefill_url, decode_url = p.urls[0], d.urls[0]
            # the prefill instance already holds the first 8 blocks: the sidecar reports its cached tokens
            await _post(prefill_url, {"prompt": PROMPT[: 16 * 8 + 1], "max_tokens": 1})
            warm = await _stored(psub)
            assert len(warm) == 8
            header = {pd.PREFILLER_HEADER: prefill_url.removeprefix("http://")}
            started = time.monotonic()
            answer = await _post(decode_url, {"prompt": PROMPT, "max_tokens": 5}, header)
            elapsed = time.monotonic() - started
            assert answer["usage"]["completion_tokens"] == 5
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 8 * 16  # the prefiller's
            assert elapsed >= 20 * 16 * 131_072 / 0.05e9  # the pull of 20 blocks was waited for
            # the prefill instance computed and keeps blocks 9..20; the decode instance stored all 20 it pulled
            prefilled = await _stored(psub)
            assert len(prefilled) == 12
            assert await _stored(dsub) == [*warm, *prefilled]
            # the prefill leg produced one token; the decode leg did the rest from its cache
            prefill_server, decode_server = p.servers[0], d.servers[0]
            assert prefill_server.engine.scheduler.stats.prefix_cache_hits == 8 * 16
            assert decode_server.engine.scheduler.stats.prefix_cache_hits == 20 * 16
    finally:
        await psub.close()
        await dsub.close()


async def test_a_prefill_leg_answers_with_the_producer_params(tokenizer: PromptTokenizer, tmp_path: Path) -> None:
    async with SimCluster(_config(tmp_path, "p"), tokenizer=tokenizer) as p:
        answer = await _post(p.urls[0], pd.prefill_leg_body({"prompt": PROMPT, "max_tokens": 50}))
        params = answer["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert len(params["remote_block_ids"]) == 20 and params["remote_request_id"] == answer["id"]
        assert pd.remote_prefill({"kv_transfer_params": params}) is not None
        # without the header the same server runs a request locally, and a plain answer carries no params
        plain = await _post(p.urls[0], {"prompt": PROMPT, "max_tokens": 2})
        assert plain["kv_transfer_params"] is None
