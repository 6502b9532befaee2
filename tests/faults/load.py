"""A small closed-loop client load for fault tests: every request's outcome is kept, none is lost.

``Load(url, workers)`` sends chat requests back to back from ``workers`` tasks until ``stop()``; each outcome
records the status (or the exception), when it started and how long it took. A request that never gets an
answer shows up as a client timeout (``error="TimeoutError"``), so "none hangs" is an assertion on outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.stack_config import MODEL


@dataclass
class Outcome:
    started: float
    seconds: float
    status: int | None = None
    error: str | None = None
    body: str = ""


@dataclass
class Load:
    url: str
    workers: int = 4
    timeout_s: float = 20.0
    max_tokens: int = 2
    stream: bool = False
    think_s: float = 0.01  # pause between one worker's requests (keeps the 2-core box responsive)
    outcomes: list[Outcome] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _session: aiohttp.ClientSession | None = None

    async def start(self) -> Load:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]
        return self

    async def stop(self) -> list[Outcome]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._session is not None:
            await self._session.close()
        return self.outcomes

    def body(self, worker: int, n: int) -> dict[str, Any]:
        text = f"Worker {worker} shares this document. " * 20 + f"Question {n}?"
        return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": self.max_tokens,
                "stream": self.stream}  # fmt: skip

    async def _worker(self, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            self.outcomes.append(await one(self._session, self.url, self.body(worker, n)))  # type: ignore[arg-type]
            await asyncio.sleep(self.think_s)


async def one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Outcome:
    """One request, read to the end; any failure is recorded, not raised."""
    t0 = time.monotonic()
    out = Outcome(started=t0, seconds=0.0)
    try:
        async with session.post(url, json=body) as resp:
            out.status = resp.status
            out.body = (await resp.read()).decode(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error = type(exc).__name__
    out.seconds = time.monotonic() - t0
    return out


@contextlib.asynccontextmanager
async def running(load: Load):  # type: ignore[no-untyped-def]
    await load.start()
    try:
        yield load
    finally:
        await load.stop()


def summary(outcomes: list[Outcome]) -> str:
    codes: dict[str, int] = {}
    for o in outcomes:
        key = str(o.status) if o.error is None else o.error
        codes[key] = codes.get(key, 0) + 1
    slowest = max((o.seconds for o in outcomes), default=0.0)
    return f"{len(outcomes)} requests {codes}, slowest {slowest:.2f}s"
