"""KV events over real ZMQ sockets: a scripted run, eviction, reset, replay, restart, connect mode."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from tests.sim.helpers import sim_config
from vllm_sim.cluster import SimCluster
from vllm_sim.config import ServerConfig
from vllm_sim.tokenize import PromptTokenizer

TOPIC = "kv@test@Qwen/Qwen3-0.6B"
SPEC_HASHES = [7322446309363477352, 17027874615116373601]  # SPEC §2.3: tokens 1000..1039, sha256, seed unset


def _config(endpoint: str, replay: str | None, env: dict[str, str] | None = None) -> ServerConfig:
    kv = {"enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": replay, "topic": TOPIC}
    flags = [
        "--num-gpu-blocks-override",
        "9",
        "--max-model-len",
        "128",
        "--kv-events-config",
        msgspec.json.encode(kv).decode(),
    ]
    return sim_config(*flags, env=env)


async def _complete(base: str, prompt: list[int], max_tokens: int = 1) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens}
    async with aiohttp.ClientSession() as s, s.post(f"{base}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()


class Subscriber:
    """A SUB socket drained continuously by a task (ZMQ only attaches new peers and sends the subscription
    while the owning socket is being used, so a SUB that sits idle misses the first batches)."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, bind: bool = False) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.port = self.sock.bind_to_random_port(endpoint) if bind else 0
        if not bind:
            self.sock.connect(endpoint)
        self._queue: asyncio.Queue[list[bytes]] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while True:
            self._queue.put_nowait(await self.sock.recv_multipart())

    async def connected(self, publishers: int = 1) -> None:
        """Wait (bounded) for ZMTP handshakes with ``publishers`` peers, then a moment for the subscription."""
        for _ in range(publishers):
            await asyncio.wait_for(self._monitor.recv_multipart(), timeout=10)
        await asyncio.sleep(0.05)

    async def recv(self) -> tuple[bytes, int, list[Any]]:
        topic, seq, payload = await asyncio.wait_for(self._queue.get(), timeout=5)
        _, events, rank = msgspec.msgpack.decode(payload)
        assert rank == 0
        return topic, int.from_bytes(seq, "big"), events

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.sock.disable_monitor()
        self._monitor.close()
        self.sock.close()


async def test_scripted_run_stores_evicts_resets_replays_and_restarts(
    tokenizer: PromptTokenizer, tmp_path: Path
) -> None:
    pub, replay = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    ctx = zmq.asyncio.Context()
    sub = Subscriber(ctx, pub)
    a, b = list(range(1000, 1040)), list(range(2000, 2100))
    try:
        async with SimCluster(_config(pub, replay), tokenizer=tokenizer) as cluster:
            base = cluster.urls[0]
            await sub.connected()  # ZMQ slow joiner: a PUB drops batches until the SUB's subscription arrives
            await _complete(base, a)
            topic, seq, events = await sub.recv()
            assert (topic, seq) == (TOPIC.encode(), 0)
            assert [e["type"] for e in events] == ["BlockStored"]
            stored = events[0]
            assert stored["block_hashes"] == SPEC_HASHES and stored["parent_block_hash"] is None
            assert stored["token_ids"] == a[:32] and stored["block_size"] == 16 and stored["medium"] == "GPU"
            assert stored["extra_keys"] == [None, None] and stored["group_idx"] == 0
            assert stored["kv_cache_spec_kind"] == "full_attention" and stored["lora_name"] is None

            await _complete(base, a)  # full hit: nothing new is cached, nothing is announced
            await _complete(base, b)  # 7 of 8 usable blocks: evicts a's tail block, then stores b's 6 blocks
            _, seq, events = await sub.recv()
            assert seq == 1
            assert [e["type"] for e in events] == ["BlockRemoved", "BlockStored"]
            assert events[0]["block_hashes"] == [SPEC_HASHES[1]] and events[0]["medium"] == "GPU"
            assert len(events[1]["block_hashes"]) == 6 and events[1]["token_ids"] == b[:96]

            async with aiohttp.ClientSession() as s, s.post(f"{base}/reset_prefix_cache") as r:
                assert r.status == 200
            # As vLLM: the AllBlocksCleared waits for the engine's next step (an idle engine publishes nothing).
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sub.recv(), 0.3)
            await _complete(base, [5])  # one token: a step, no full block
            _, seq, events = await sub.recv()
            assert seq == 2 and events == [{"type": "AllBlocksCleared"}]

            # a consumer that missed everything asks for it again from seq 0 (DEALER, as SPEC §1.9 advises)
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(replay)
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            frames = [await asyncio.wait_for(dealer.recv_multipart(), 5) for _ in range(4)]
            await dealer.send_multipart([b"", (2).to_bytes(8, "big")])
            tail = [await asyncio.wait_for(dealer.recv_multipart(), 5) for _ in range(2)]
            dealer.close()
            assert [f[:3] for f in frames[:3]] == [[b"", TOPIC.encode(), i.to_bytes(8, "big")] for i in (0, 1, 2)]
            assert msgspec.msgpack.decode(frames[0][3])[1][0]["block_hashes"] == SPEC_HASHES
            assert msgspec.msgpack.decode(frames[2][3])[1] == [{"type": "AllBlocksCleared"}]
            assert frames[3] == [b"", b"", b"\xff" * 8, b""]
            assert tail == [frames[2], frames[3]]

        async with SimCluster(_config(pub, replay), tokenizer=tokenizer) as cluster:  # restart
            await sub.connected()
            await _complete(cluster.urls[0], a)
            _, seq, events = await sub.recv()
            assert seq == 0 and [e["type"] for e in events] == ["BlockStored"]  # no AllBlocksCleared
    finally:
        await sub.close()
        ctx.term()


async def test_connect_mode_raw_hashes_and_k_servers(tokenizer: PromptTokenizer) -> None:
    """A host endpoint without ``*`` makes the simulator connect to our bound SUB (llm-d's central mode)."""
    ctx = zmq.asyncio.Context()
    sub = Subscriber(ctx, "tcp://127.0.0.1", bind=True)
    port = sub.port
    cfg = _config(f"tcp://127.0.0.1:{port}", None, env={"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"})
    try:
        async with SimCluster(cfg, n=2, tokenizer=tokenizer) as cluster:
            await sub.connected()  # only server 0 dials this port; server 1 dials port + 1
            async with aiohttp.ClientSession() as s, s.get(f"{cluster.urls[1]}/kv_event_sources") as r:
                sources = await r.json()
            assert sources["0"]["endpoint"] == f"tcp://127.0.0.1:{port + 1}"  # server 1: port + 1
            await _complete(cluster.urls[0], list(range(1000, 1040)))
            _, seq, events = await sub.recv()
            digests = events[0]["block_hashes"]
            assert seq == 0 and all(isinstance(d, bytes) and len(d) == 32 for d in digests)
            assert [int.from_bytes(d[-8:], "big") for d in digests] == SPEC_HASHES
    finally:
        await sub.close()
        ctx.term()


async def test_sim_kv_events_bind_binds_a_host_endpoint(tokenizer: PromptTokenizer) -> None:
    """``--sim-kv-events-bind``: the PUB binds tcp://127.0.0.1:port (vLLM itself would connect there)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kv = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}", "topic": TOPIC}
    cfg = sim_config("--sim-kv-events-bind", "--kv-events-config", msgspec.json.encode(kv).decode())
    ctx = zmq.asyncio.Context()
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{port}")
    try:
        async with SimCluster(cfg, tokenizer=tokenizer) as cluster:
            await sub.connected()
            await _complete(cluster.urls[0], list(range(1000, 1040)))
            _, seq, events = await sub.recv()
            assert seq == 0 and events[0]["block_hashes"] == SPEC_HASHES
    finally:
        await sub.close()
        ctx.term()


async def test_legacy_array_events_and_topicless_replay(tokenizer: PromptTokenizer, tmp_path: Path) -> None:
    pub, replay = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    kv = {"enable_kv_cache_events": True, "endpoint": pub, "replay_endpoint": replay, "topic": TOPIC}
    cfg = sim_config("--sim-legacy-kv-events", "--kv-events-config", msgspec.json.encode(kv).decode())
    ctx = zmq.asyncio.Context()
    sub = Subscriber(ctx, pub)
    try:
        async with SimCluster(cfg, tokenizer=tokenizer) as cluster:
            await sub.connected()
            await _complete(cluster.urls[0], list(range(1000, 1040)))
            _, seq, events = await sub.recv()
            assert events[0][:3] == ["BlockStored", SPEC_HASHES, None] and len(events[0]) == 12
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(replay)
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            frames = [await asyncio.wait_for(dealer.recv_multipart(), 5) for _ in range(2)]
            dealer.close()
            assert frames[0][:2] == [b"", (0).to_bytes(8, "big")] and len(frames[0]) == 3
            assert frames[1] == [b"", b"\xff" * 8, b""]
    finally:
        await sub.close()
        ctx.term()
