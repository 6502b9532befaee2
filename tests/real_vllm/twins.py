"""Twins for the differential suite: one real vLLM CPU engine and one ``vllm-sim`` server, configured alike
(block size 128, ``sha256``, PYTHONHASHSEED=0, 64 KV blocks, the same max model length and flags; *without*
``--enable-auto-tool-choice --tool-call-parser``, so that what vLLM answers to tools without them is compared
too, while the tier's fleet and demo run with them), each
publishing KV events to a SUB socket *we* bind (``tcp://127.0.0.1:PORT``: the engine connects, vLLM's rule
for an endpoint without ``*``), with its replay ROUTER on ipc://.

    twin.url("/tokenize"); twin.events.drain() -> [(topic, seq, [ts, events, rank]), ...]; twin.replay(0)
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import zmq

from bench.procs import ManagedProcess, free_ports
from bench.stack_config import REPO
from bench.vllm_cpu import MODEL, Engine, EngineSpec, health_ok
from tests.real_vllm.fleet import BLOCK_SIZE, MAX_MODEL_LEN, NUM_GPU_BLOCKS

HASH_ALGO, HASH_SEED = "sha256", "0"
TOPIC = "kv@twin"
CPU_BATCHED_TOKENS = 2048  # vLLM's CPU build prefills at most this many tokens per step (the simulator: 8192)
Frame = tuple[bytes, int, Any]  # (topic, seq, decoded payload)


class EventSink:
    """A SUB socket bound on 127.0.0.1 (a free port) that a publisher connects to; ``drain`` reads what came."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.port = free_ports(1)[0]
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.bind(self.endpoint)

    def drain(self, quiet_s: float = 0.5, timeout_s: float = 10.0) -> list[Frame]:
        """Every frame until none arrived for ``quiet_s`` (bounded by ``timeout_s``)."""
        frames: list[Frame] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._sub.poll(int(quiet_s * 1000)):
            topic, seq, payload = self._sub.recv_multipart()
            frames.append((topic, int.from_bytes(seq, "big"), msgspec.msgpack.decode(payload)))
        return frames

    def close(self) -> None:
        self._sub.close(linger=0)


def replay(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, start_seq: int) -> list[list[bytes]]:
    """Ask a replay ROUTER for every buffered batch from ``start_seq``: the raw reply frames, end marker included
    (a DEALER sends ``[b"", seq8]`` as a REQ would)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        replies: list[list[bytes]] = []
        while dealer.poll(5000):
            frames = dealer.recv_multipart()
            replies.append(frames)
            if frames[2] == b"\xff" * 8 or frames[-2:] == [b"\xff" * 8, b""]:
                break
        return replies
    finally:
        dealer.close(linger=0)


def events_config(sink: EventSink, replay_endpoint: str) -> dict[str, Any]:
    return {"endpoint": sink.endpoint, "replay_endpoint": replay_endpoint, "topic": TOPIC}


@dataclass
class Twin:
    """One side of the comparison: ``name`` is "vllm" or "sim"."""

    name: str
    proc: ManagedProcess
    port: int
    events: EventSink
    replay_endpoint: str

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def start_twins(python: Path, model_dir: Path, workdir: Path, ctx: zmq.Context[zmq.Socket[bytes]]) -> list[Twin]:
    """Start both (the engine pinned to core 0 while the simulator loads), return ``[vllm, sim]``."""
    vllm_sink, sim_sink = EventSink(ctx), EventSink(ctx)
    vllm_port, sim_port = free_ports(2)
    vllm_replay, sim_replay = f"ipc://{workdir}/vllm.replay", f"ipc://{workdir}/sim.replay"
    spec = EngineSpec(
        port=vllm_port, kv_events=events_config(vllm_sink, vllm_replay), block_size=BLOCK_SIZE,
        hash_algo=HASH_ALGO, hash_seed=HASH_SEED, core=0, num_gpu_blocks=NUM_GPU_BLOCKS,
        max_model_len=MAX_MODEL_LEN, auto_tool_choice=False,
    )  # fmt: skip
    engine = Engine(spec, python, model_dir, workdir / "vllm-twin.log")
    sim_events = {"enable_kv_cache_events": True, "publisher": "zmq", **events_config(sim_sink, sim_replay)}
    sim_argv = [
        sys.executable, "-m", "vllm_sim", MODEL, "--host", "127.0.0.1", "--port", str(sim_port),
        "--tokenizer", str(REPO / "tokenizer_cache" / MODEL), "--sim-profile", "fast",
        "--block-size", str(BLOCK_SIZE), "--prefix-caching-hash-algo", HASH_ALGO,
        "--num-gpu-blocks-override", str(NUM_GPU_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-batched-tokens", str(CPU_BATCHED_TOKENS),
        "--enable-prompt-tokens-details", "--enable-scale-out", "--kv-events-config", json.dumps(sim_events),
    ]  # fmt: skip
    sim = ManagedProcess("sim-twin", sim_argv, workdir / "sim-twin.log", cwd=REPO,
                         env={**os.environ, "PYTHONHASHSEED": HASH_SEED})  # fmt: skip
    try:
        engine.start_engine()
        sim.start(lambda: health_ok(sim_port), 90.0)
    except BaseException:
        engine.stop()
        sim.stop()
        raise
    return [Twin("vllm", engine, vllm_port, vllm_sink, vllm_replay), Twin("sim", sim, sim_port, sim_sink, sim_replay)]
