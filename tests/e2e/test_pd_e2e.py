"""P/D through real Envoy: the picker names a prefill pod in ``x-prefiller-host-port`` for a long prompt, the
decode-role simulator (llm-d's sidecar, simulated) runs the prefill leg there, pulls the KV and decodes; a short
prompt runs locally. Both publish their KV events to the picker, so the decode pod's transferred blocks count.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from bench.stack import Stack, StackSpec
from extproc import wire
from tests.support.chat import cached, chat

pytestmark = [pytest.mark.envoy, pytest.mark.slow]

LONG = [{"role": "user", "content": " ".join(f"word{i}" for i in range(1200))}]  # ~3.6K tokens
SHORT = [{"role": "user", "content": "Hello there."}]


def _prompt_tokens(backend: str) -> float:
    """The backend's ``vllm:prompt_tokens_total``: how much it has prefilled."""
    with urllib.request.urlopen(f"http://{backend}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total")
    )


async def test_a_long_prompt_is_disaggregated_and_a_short_one_runs_locally(tmp_path: Path) -> None:
    spec = StackSpec(backends=1, prefill_backends=1, backends_per_sim=1, kv_events=True, sim_profile="fast",
                     picker_log_level=None)  # fmt: skip
    with Stack(spec, tmp_path) as stack:
        (decode,), (prefill,) = stack.backends, stack.prefill_backends
        url = stack.envoy.url("/v1/chat/completions")
        async with aiohttp.ClientSession() as session:
            # a client's own header is removed: only the picker names a prefill pod
            status, short = await chat(session, url, SHORT, headers={wire.PREFILLER_HEADER: prefill})
            assert status == 200
            assert _prompt_tokens(prefill) == 0, "a short prompt runs on the decode pod alone"

            status, first = await chat(session, url, LONG, max_tokens=8)
            assert status == 200 and first["usage"]["completion_tokens"] == 8
            prompt = first["usage"]["prompt_tokens"]
            assert _prompt_tokens(prefill) == prompt, "the prefill pod ran the prefill leg"
            assert cached(first) == 0, "the sidecar reports the prefiller's cached tokens (none yet)"

            # the decode pod stored the transferred blocks and said so in its KV events: the same prompt now
            # has its prefix cached there, so it runs locally and the prefill pod sees nothing new
            await asyncio.sleep(0.5)
            status, again = await chat(session, url, LONG, max_tokens=8)
            assert status == 200 and cached(again) >= prompt - 2 * 16
            assert _prompt_tokens(prefill) == prompt
        log = stack.envoy.wait_for_access_log(3)
        assert {entry.upstream for entry in log} == {decode}, "Envoy only ever sends to the decode pod"
        assert _pd_decisions(stack) == [("short", None), ("disagg", prefill), ("short", None)]


def _pd_decisions(stack: Stack) -> list[tuple[str, str | None]]:
    """``(reason, prefill pod)`` of each decision line, in order."""
    assert stack.picker is not None
    lines = [json.loads(line[line.index("{") :]) for line in stack.picker.log_text().splitlines() if '"pd": ' in line]
    return [(d["pd"]["reason"], d["pd"]["prefill"]) for d in lines]
