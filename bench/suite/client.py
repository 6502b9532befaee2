"""One asyncio load generator: replays a ``Plan`` against a router URL and times every request.

Requests are streamed ``/v1/completions`` with the prompt as text (every router sees text, as it would from
an application; the words are token-exact, see ``words``). TTFT is the time from send to the first SSE
chunk that carries text; usage (prompt, completion and cached tokens) comes from the final usage chunk,
which the backend sends with ``stream_options.include_usage``. Concurrency is bounded (a semaphore; a
request that waits for a slot is timed from its planned send time, so queueing in the client counts) and
every request has a deadline; the whole cell has one too, after which unfinished requests count as failed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from bench.stack_config import MODEL
from bench.suite.words import render
from bench.suite.workloads import Call, Plan, Session
from extproc.wire import REQUEST_ID_HEADER, TENANT_HEADER


@dataclass(slots=True)
class Result:
    rid: str
    ok: bool
    start_s: float  # from the cell's start
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    expected_prompt_tokens: int = 0
    error: str = ""
    response_id: str = ""  # the backend's completion id (the simulator's ``GET /sim/requests`` key)


async def _one(http: aiohttp.ClientSession, url: str, call: Call, t0: float, planned: float,
               timeout_s: float) -> Result:  # fmt: skip
    body = {"model": MODEL, "prompt": render(call.ids), "max_tokens": call.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    res = Result(call.rid, False, planned, expected_prompt_tokens=len(call.ids))
    sent = t0 + planned
    try:
        headers = {REQUEST_ID_HEADER: call.rid}  # the picker's decision line names the plan's request
        if call.tenant:
            headers[TENANT_HEADER] = call.tenant
        async with http.post(f"{url}/v1/completions", json=body, headers=headers,
                             timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:  # fmt: skip
            if resp.status != 200:
                res.error = f"http {resp.status}: {(await resp.text())[:200]}"
                return res
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                res.response_id = res.response_id or str(chunk.get("id") or "")
                if res.ttft_s is None and any(c.get("text") for c in chunk.get("choices") or ()):
                    res.ttft_s = time.perf_counter() - sent
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    res.cached_tokens = int(details.get("cached_tokens") or 0)
        res.e2e_s = time.perf_counter() - sent
        res.ok = res.ttft_s is not None and res.completion_tokens > 0
        if not res.ok:
            res.error = "no text or no usage in the stream"
    except TimeoutError:
        res.error = "timeout"
    except (aiohttp.ClientError, json.JSONDecodeError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
    return res


async def _session(http: aiohttp.ClientSession, url: str, s: Session, t0: float, slots: asyncio.Semaphore,
                   timeout_s: float, out: list[Result]) -> None:  # fmt: skip
    await asyncio.sleep(max(0.0, t0 + s.start_s - time.perf_counter()))
    for call in s.calls:
        planned = time.perf_counter() - t0  # a chain's next call is "planned" when the previous one ended
        async with slots:
            res = await _one(http, url, call, t0, planned, timeout_s)
        out.append(res)
        if not res.ok:
            for rest in s.calls[s.calls.index(call) + 1 :]:  # a broken chain: the rest are failures too
                out.append(Result(rest.rid, False, planned, error="chain broken",
                                  expected_prompt_tokens=len(rest.ids)))  # fmt: skip
            return


async def replay(url: str, plan: Plan, *, concurrency: int, request_timeout_s: float,
                 cell_timeout_s: float) -> tuple[list[Result], float]:  # fmt: skip
    """Send ``plan`` to ``url``; returns every call's result and the wall time from first send to last end."""
    out: list[Result] = []
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:
        t0 = time.perf_counter() + 0.05
        tasks = [asyncio.create_task(_session(http, url, s, t0, slots, request_timeout_s, out))
                 for s in plan.sessions]  # fmt: skip
        _done, pending = await asyncio.wait(tasks, timeout=cell_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    finished = {r.rid for r in out}
    for call in plan.calls:
        if call.rid not in finished:
            out.append(Result(call.rid, False, 0.0, error="cell deadline", expected_prompt_tokens=len(call.ids)))
    return out, wall
