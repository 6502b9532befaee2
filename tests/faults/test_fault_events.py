"""KV-event stream faults, seen through the real router: the picker in process (real parser, tokenizer,
hashing, indexes, subscriber, ingest) follows a stand-in vLLM publisher (PUB + replay ROUTER) for endpoint A;
endpoint B has no events. Whatever the stream does, the subscriber survives and the router's answer for the
golden document is what the stream's state says it should be:

* garbage frames, truncated or undecodable payloads, an unknown event type: skipped and counted; A stays
  precise and the document still routes to A's cache;
* a stalled publisher (silence): nothing purged, nothing wrong;
* a sequence gap the engine can replay: replayed, the index reflects the missed events;
* a gap it cannot replay: A is purged and turns cold; an engine restart (sequence back to 0): A is purged
  (and, its history replayed from 0, known to be empty). Either way the router stops crediting A's old
  cache, until new events refill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from bench.stack_config import MODEL
from extproc import wire
from extproc.app import App
from extproc.config import RouterConfig
from extproc.types import EndpointId, HttpRequest, Route
from tests.fuzz.inproc import mark_scraped
from tests.kvcache.vllm_pub import HASHES, FakePublisher, FutureEvent, batch, removed, stored
from tests.support.config import router_config
from tests.support.golden import golden_case
from tests.support.polling import until

A, B = EndpointId("127.0.0.1:18001"), EndpointId("127.0.0.1:18002")
N = len(HASHES)


def doc_request() -> HttpRequest:
    messages = golden_case("doc_summary")["messages"]
    body = json.dumps({"model": MODEL, "messages": messages}).encode()
    headers = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    return HttpRequest("POST", "/v1/chat/completions", headers, body, "doc")


class Rig:
    def __init__(self, app: App, pub: FakePublisher) -> None:
        self.app, self.pub = app, pub
        self.sub = app.feed.subscriber

    def status(self):  # type: ignore[no-untyped-def]
        return self.sub.status(A)

    async def settle(self) -> None:
        await until(lambda: (s := self.status()) is not None and s.last_seq == self.pub.seq - 1, what="settle")

    async def held(self) -> int:
        return int((await self.app.precise.match([*map(int, HASHES)], [A])).get(A, 0))  # type: ignore[list-item]

    async def cached_on_a(self) -> int:
        """Cached tokens the router predicts on A for the golden document (0 if it routes elsewhere)."""
        route = await self.app.router.route(doc_request())
        assert isinstance(route, Route)
        await self.app.approx.clear(A)  # judge the precise path only: forget our own guess from this pick
        await self.app.approx.clear(B)
        return int(route.headers[wire.CACHED_TOKENS_HEADER]) if route.endpoints[0] == A else 0


@contextlib.asynccontextmanager
async def rig() -> AsyncIterator[Rig]:
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx)
    pub.start()
    raw = router_config([A, B]).model_dump()
    raw["endpoints"][0]["kv_events"] = {"endpoint": pub.pub_address, "replay_endpoint": pub.replay_address}
    config = RouterConfig.model_validate(raw)
    app = App(config)
    assert not await app.preparer.warm_up()
    mark_scraped(app)
    app.feed.start()
    r = Rig(app, pub)
    try:
        for _ in range(300):  # ZMQ's slow joiner: publish empty batches until the subscription is live
            await pub.publish(batch())
            await asyncio.sleep(0.02)
            if (s := r.status()) is not None and s.last_seq is not None:
                break
        await r.settle()
        yield r
    finally:
        await app.stop()
        await pub.close()
        ctx.destroy(linger=0)


async def fill(r: Rig) -> None:
    await r.pub.publish(batch(stored(0, N)))
    await r.settle()
    await until(lambda: r.app.feed.is_precise(A), what="A precise")
    assert await r.cached_on_a() >= (N - 1) * 16


async def test_garbage_truncated_unknown_and_stalled_streams_are_survived() -> None:
    async with rig() as r:
        await fill(r)
        await r.pub.send_raw([b"", b"\x00" * 8])  # too few frames
        await r.pub.send_raw([b"", b"\x00" * 3, b"x"])  # short sequence number
        await r.pub.send_raw([b""] * 7)  # too many frames
        await r.pub.publish(b"\x93\xcb\x00")  # truncated msgpack (consumes a sequence number)
        await r.pub.publish(b"\xc1 not msgpack at all")
        await r.pub.publish(json.dumps({"events": "wrong shape"}).encode())
        await r.pub.publish(batch(FutureEvent(), removed(N - 1)))  # an unknown event type beside a known one
        await r.settle()
        counters = r.sub.counters
        assert counters.bad_frames >= 2 and counters.decode_errors >= 2 and counters.loop_errors == 0
        assert r.app.feed.ingest.counters.unknown_events >= 1
        assert r.app.feed.is_precise(A) and await r.held() == N - 1, "the known event was still applied"
        assert await r.cached_on_a() >= (N - 2) * 16

        await asyncio.sleep(1.5)  # the publisher stalls (3 poll intervals of silence): nothing is purged
        assert r.app.feed.is_precise(A) and await r.held() == N - 1
        await r.pub.publish(batch(stored(N - 1, 1)))
        await r.settle()
        assert await r.held() == N and r.status().connected  # type: ignore[union-attr]


async def test_gaps_are_replayed_or_purged_and_a_restart_purges() -> None:
    async with rig() as r:
        await fill(r)
        # A gap the engine's replay buffer still holds: replayed, the missed removal is applied.
        r.pub.drop(batch(removed(N - 1)))
        await r.pub.publish(batch())
        await r.settle()
        assert r.sub.counters.replays >= 1 and await r.held() == N - 1
        assert r.app.feed.is_precise(A)

        # A gap it no longer holds: A is purged and cold; the router stops crediting its old cache.
        lost = r.pub.drop(batch(stored(N - 1, 1)))
        r.pub.forget(lost)
        await r.pub.publish(batch())
        await r.settle()
        await until(lambda: not r.app.feed.is_precise(A), what="A cold after an unreplayable gap")
        assert await r.held() == 0 and await r.cached_on_a() == 0
        await fill(r)  # new events refill it: precise again

        # The engine restarts: its sequence counts from 0 again. Purged, then refilled by new events.
        r.pub.restart_counter()
        await r.pub.publish(batch())
        await until(lambda: r.sub.counters.restarts >= 1, what="restart noticed")
        await r.settle()
        # Purged. (It may be precise again at once: the replay from seq 0 proves the new engine holds nothing.)
        assert r.app.feed.ingest.counters.purges >= 2
        assert await r.held() == 0 and await r.cached_on_a() == 0
        await fill(r)
