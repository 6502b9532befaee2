"""ZMQ transport for KV events, framed as vLLM ≥ 0.26's ``ZmqEventPublisher``.

* PUB frames: ``[topic utf-8, seq (8-byte big-endian, from 0 per publisher), payload]``.
* Replay (vLLM >= 0.26): a ROUTER socket (always bound) answers ``[identity, b"", start_seq8]`` with one
  ``[identity, b"", topic, seq8, payload]`` per buffered batch with ``seq >= start``, then the end marker
  ``[identity, b"", b"", ff*8, b""]``. Only the last ``buffer_steps`` batches are kept. With ``legacy_replay``
  (vLLM <= 0.25) the topic frame is absent from both.
* The PUB socket binds when the endpoint contains ``*`` or ``::`` or is ``ipc://``/``inproc://``, else connects.

Encoding is delegated to :class:`vllm_sim.events.EventEncoder`; this module knows frames and sockets only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from vllm_sim.config import KVEventsConfig
from vllm_sim.events import EventEncoder, EventRecord

log = logging.getLogger(__name__)
END_SEQ = b"\xff" * 8


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule for whether the PUB socket binds (else it connects)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """PUB + optional ROUTER replay for one server. Call :meth:`start` inside the event loop, :meth:`close` after."""

    def __init__(
        self,
        cfg: KVEventsConfig,
        encoder: EventEncoder,
        ctx: zmq.asyncio.Context,
        force_bind: bool = False,
        legacy_replay: bool = False,
    ) -> None:
        self.cfg = cfg
        self._force_bind = force_bind
        # vLLM <= 0.25 replied [b"", seq, payload] and ended with [b"", ff*8, b""] (no topic frame)
        self._reply_prefix: tuple[bytes, ...] = () if legacy_replay else (self._topic_bytes(cfg),)
        self._encoder = encoder
        self._ctx = ctx
        self._topic = cfg.topic.encode("utf-8")
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.endpoint = cfg.endpoint
        self.replay_endpoint = cfg.replay_endpoint

    @staticmethod
    def _topic_bytes(cfg: KVEventsConfig) -> bytes:
        return cfg.topic.encode("utf-8")

    def start(self) -> None:
        """Open the sockets (binding or connecting) and start serving replay requests."""
        pub = self._ctx.socket(zmq.PUB)
        pub.set_hwm(self.cfg.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        if self._force_bind or is_bind_endpoint(self.cfg.endpoint):
            pub.bind(self.cfg.endpoint)
            self.endpoint = _resolved(pub, self.cfg.endpoint)
        else:
            pub.connect(self.cfg.endpoint)
        self._pub = pub
        if self.cfg.replay_endpoint:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.SNDHWM, 2 * (self.cfg.buffer_steps + 1))
            router.bind(self.cfg.replay_endpoint)
            self.replay_endpoint = _resolved(router, self.cfg.replay_endpoint)
            self._router = router
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, records: list[EventRecord]) -> None:
        """Encode one step's records as a batch and send it (never blocks: PUB drops beyond HWM)."""
        if self._pub is None or not records:
            return
        payload = self._encoder.encode(records, time.time(), 0)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            log.debug("PUB queue full; batch %d dropped (replay still has it)", seq)

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("ignoring malformed replay request with %d frames", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    reply = (identity, b"", *self._reply_prefix, seq.to_bytes(8, "big"), payload)
                    await self._router.send_multipart(reply)
            end = (b"",) if self._reply_prefix else ()
            await self._router.send_multipart((identity, b"", *end, END_SEQ, b""))

    async def close(self) -> None:
        """Stop replay and close both sockets."""
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None


def _resolved(sock: zmq.asyncio.Socket, endpoint: str) -> str:
    """The endpoint with an OS-chosen port (``:0``) replaced by the bound one."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        port = (last.decode() if isinstance(last, bytes) else str(last)).rpartition(":")[2]
        return f"{endpoint[:-2]}:{port}"
    return endpoint
