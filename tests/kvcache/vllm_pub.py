"""A hand-written stand-in for vLLM's ZmqEventPublisher (PUB + replay ROUTER) and map-form event encoding.

Frames and replay replies follow ``shared/vllm/SPEC.md`` §1.8-1.9; payloads are encoded with the simulator's
copies of vLLM 0.33's event structs (``vllm_sim.events``: map events, array batch; it imports nothing of
extproc, so it is an independent encoder), or taken verbatim from the golden file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import msgspec
import zmq
import zmq.asyncio

from tests.support.golden import golden_case, golden_event_batch, golden_event_hashes
from vllm_sim.events import BlockRemoved, BlockStored, KVCacheEvent

GOLDEN_PAYLOAD = golden_event_batch()
TOKENS: list[int] = golden_case("doc_summary")["token_ids"]
HASHES: list[int] = golden_event_hashes("doc_summary")
END = b"\xff" * 8


class FutureEvent(KVCacheEvent):  # a tag from some future release: must be skipped
    something: int = 1


def stored(first: int, n: int, *, hashes: list[int] | None = None) -> BlockStored:
    """doc_summary blocks [first, first+n) as vLLM 0.33 announces them (parent = block first-1)."""
    return BlockStored(
        block_hashes=list(hashes if hashes is not None else HASHES[first : first + n]),
        parent_block_hash=HASHES[first - 1] if first else None,
        token_ids=TOKENS[first * 16 : (first + n) * 16],
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None] * n,
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )


def removed(block: int) -> BlockRemoved:
    return BlockRemoved([HASHES[block]], "GPU", 0)


def batch(*events: KVCacheEvent, ts: float = 1.0, rank: int = 0) -> bytes:
    return msgspec.msgpack.encode([ts, list(events), rank])


class FakePublisher:
    """PUB (bound, or connected for the subscriber's bind mode) + ROUTER replay service on 127.0.0.1."""

    def __init__(self, ctx: zmq.asyncio.Context, *, topic: str = "", replay_with_topic: bool = True) -> None:
        self.ctx, self.topic, self.replay_with_topic = ctx, topic.encode(), replay_with_topic
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=10_000)
        self.replay_requests: list[int] = []
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.pub_address = ""
        self.replay_address = ""
        self._task: asyncio.Task[None] | None = None

    def start(self, *, connect_to: str | None = None, pub_port: int | None = None) -> None:
        if connect_to is not None:
            self.pub.connect(connect_to)
            self.pub_address = connect_to
        elif pub_port is not None:
            self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
            self.pub_address = f"tcp://127.0.0.1:{pub_port}"
        else:
            port = self.pub.bind_to_random_port("tcp://127.0.0.1")
            self.pub_address = f"tcp://127.0.0.1:{port}"
        rport = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_address = f"tcp://127.0.0.1:{rport}"
        self._task = asyncio.create_task(self._serve_replay())

    async def publish(self, payload: bytes) -> int:
        """Send one batch with the next sequence number (kept for replay, like vLLM's buffer)."""
        seq = self._next(payload)
        await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def drop(self, payload: bytes) -> int:
        """A batch the subscriber never sees live (as if PUB dropped it past HWM); replay still has it."""
        return self._next(payload)

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    def forget(self, seq: int) -> None:
        """The replay buffer no longer holds ``seq`` (it rolled over)."""
        self.buffer = deque(((s, p) for s, p in self.buffer if s != seq), maxlen=10_000)

    def restart_counter(self) -> None:
        """An engine restart as the sequence shows it: counting from 0 again, an empty buffer."""
        self.seq = 0
        self.buffer.clear()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        self.router.close(linger=0)

    def _next(self, payload: bytes) -> int:
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        return seq

    async def _serve_replay(self) -> None:
        while True:
            identity, empty, start8 = await self.router.recv_multipart()
            assert empty == b"" and len(start8) == 8
            start = int.from_bytes(start8, "big")
            self.replay_requests.append(start)
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await self.router.send_multipart(self._reply(identity, seq.to_bytes(8, "big"), payload))
            await self.router.send_multipart(self._reply(identity, END, b"", end=True))

    def _reply(self, identity: bytes, seq8: bytes, payload: bytes, *, end: bool = False) -> list[bytes]:
        if self.replay_with_topic:  # vLLM >= 0.26
            return [identity, b"", b"" if end else self.topic, seq8, payload]
        return [identity, b"", seq8, payload]  # vLLM <= 0.25
