"""A backend killed mid-stream, through real Envoy and the picker, with KV events on.

What the clients see: streams on the killed backend end promptly with a transport error (Envoy resets the
response: no hang, no silently truncated success); streams elsewhere finish with ``[DONE]``. Requests sent
right after the kill all succeed (Envoy retries a refused connection on the picker's fallback endpoints), and
within a few scrape intervals the picker stops naming the dead backend at all. The backend restarted on the
same port is purged from the index (its sequence restarts; no phantom cache is predicted) and serves again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

import aiohttp
import pytest

from bench.stack_config import MODEL
from tests.faults.load import one
from tests.support.stacks import StackFactory

pytestmark = [pytest.mark.envoy, pytest.mark.slow]
DOC = "The quarterly report of the lighthouse keepers' guild. " * 40


@dataclass
class Stream:
    done: bool = False  # saw data: [DONE]
    chunks: int = 0
    error: str | None = None
    seconds: float = 0.0


async def stream(session: aiohttp.ClientSession, url: str, n: int) -> Stream:
    """A long stream on the document: the first follows its cache to the warm backend, so some stream is there
    when it dies (unique prompts are placed away from a backend's hot traffic, so none would be)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": DOC + f"Story {n}: " + "tell me more " * 10}],
            "max_tokens": 80, "stream": True, "ignore_eos": True}  # fmt: skip
    out, t0 = Stream(), time.monotonic()
    try:
        async with session.post(url, json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    out.done = True
                elif line.startswith(b"data: "):
                    out.chunks += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error = type(exc).__name__
    out.seconds = time.monotonic() - t0
    return out


async def ask(session: aiohttp.ClientSession, url: str, question: str) -> tuple[int | None, int]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": DOC + question}], "max_tokens": 2}
    async with session.post(url, json=body) as resp:
        data = await resp.json(content_type=None)
        details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
        return resp.status, int(details.get("cached_tokens") or 0)


async def test_backend_killed_mid_stream_then_restarted(make_stack: StackFactory) -> None:
    stack = make_stack(2, kv_events=True, sim_args=["--sim-decode-step-s", "0.03"])
    url = stack.envoy.url("/v1/chat/completions")
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        assert (await ask(session, url, "Summarize."))[0] == 200
        warm = stack.envoy.wait_for_access_log(1)[0].upstream  # the document's KV blocks live here now
        live = next(b for b in stack.backends if b != warm)

        streams = [asyncio.create_task(stream(session, url, i)) for i in range(6)]
        await asyncio.sleep(0.8)  # every stream is producing tokens
        pid = stack.backend_process(warm).pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        right_after = [await one(session, url, {"model": MODEL, "max_tokens": 2,
                                               "messages": [{"role": "user", "content": f"Now {i}?"}]})
                       for i in range(8)]  # fmt: skip
        results = await asyncio.gather(*streams)
        await asyncio.sleep(max(0.0, killed_at + 0.6 - time.monotonic()))  # > a few scrape intervals (0.1 s)
        before_later = len(stack.envoy.wait_for_access_log(1 + len(streams) + len(right_after)))
        later = [await one(session, url, {"model": MODEL, "max_tokens": 2,
                                         "messages": [{"role": "user", "content": f"Later {i}?"}]})
                 for i in range(6)]  # fmt: skip

        # Streams: every one ended, promptly; the dead backend's with an error, never a fake [DONE].
        assert all(r.seconds < 10 for r in results), results
        assert all(r.done != (r.error is not None) for r in results), results
        died = [r for r in results if r.error]
        assert died, f"no stream was on the killed backend {warm}: {results}"
        assert all(r.chunks < 80 for r in died)
        # New requests right after the kill: retried on the fallback when the connection is refused. The one
        # exception (a known gap, RELIABILITY.md): a request Envoy writes, within a few ms of the death, onto
        # the idle keep-alive connection the dead backend just closed gets 503 UC: our retry policy leaves out
        # `reset` on purpose (a prompt is never run twice).
        lost = [o for o in right_after if o.status != 200]
        assert len(lost) <= 1, right_after
        assert all(o.status == 503 and o.started - killed_at < 0.1 and "connection termination" in o.body
                   for o in lost), lost  # fmt: skip
        # Later (a few scrape intervals on): no failure, and the dead backend is no longer named at all.
        assert [o.status for o in later] == [200] * len(later), later
        log = stack.envoy.wait_for_access_log(before_later + 6)
        assert all(e.upstream == live and e.attempts == 1 and warm not in e.dest for e in log[before_later:])

        # Restart on the same port: an empty engine, its sequence numbers from 0 again.
        await asyncio.to_thread(stack.restart_backend, warm)
        await asyncio.sleep(0.5)  # a few scrape intervals: healthy again
        count = len(stack.envoy.wait_for_access_log(before_later + len(later)))
        status, cached = await ask(session, url, "And the conclusion?")  # the document `warm` held (streams may
        # have copied it to `live` too: either way the prediction must match what the serving engine reports)
        entry = stack.envoy.wait_for_access_log(count + 1)[-1]
        assert status == 200
        # Purged: no phantom cache predicted anywhere (it would have sent us to the restarted, empty engine).
        assert int(entry.cached or 0) <= cached + 16, (entry, cached)
        assert entry.reason != "cache" or entry.upstream != warm, entry
        # The restarted backend takes traffic again: the document (its cache purged, placed cold on the endpoint
        # with the fewest hot blocks, which is the emptied one unless the streams copied it to `live`), or else
        # new prompts placed away from the hot traffic there.
        served = [entry.upstream]
        for i in range(20):
            out = await one(
                session,
                url,
                {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"Fresh {i}?"}]},
            )
            assert out.status == 200, out
            served.append(stack.envoy.wait_for_access_log(count + 2 + i)[-1].upstream)
            if warm in served:
                break
        assert warm in served, "the restarted backend never served again"
