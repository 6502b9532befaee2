"""Typed, frozen configuration of one simulated server (what ``vllm serve`` flags resolve to).

``KVEventsConfig`` mirrors vLLM 0.33's dataclass (``vllm/config/kv_events.py``): same keys, same defaults,
``publisher`` resolved to ``"zmq"`` when events are enabled. ``offset_endpoint`` is vLLM's data-parallel port
offset, reused here to give server *i* of a multi-server process its own ports.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from vllm_sim.engine import EngineConfig
from vllm_sim.hashing import LoraKey
from vllm_sim.pd import KvTransferConfig, TransferModel
from vllm_sim.timing import TimingProfile
from vllm_sim.tokenize import DEFAULT_CACHE_TOKENS


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's ``--kv-events-config`` keys and defaults."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in ("zmq", "null"):
            raise ValueError(f"unknown KV event publisher {self.publisher!r} (expected 'zmq' or 'null')")
        if self.buffer_steps < 1 or self.hwm < 0:
            raise ValueError("buffer_steps must be >= 1 and hwm >= 0")

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse the flag's JSON; unknown keys are an error (as vLLM's dataclass parsing)."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown --kv-events-config keys: {', '.join(unknown)}")
        return cls(**raw)

    @property
    def active(self) -> bool:
        """Whether a ZMQ publisher runs."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def for_index(self, index: int) -> KVEventsConfig:
        """This config with both endpoints offset for server ``index`` (vLLM's DP-rank rule)."""
        replay = None if self.replay_endpoint is None else offset_endpoint(self.replay_endpoint, index)
        return replace(self, endpoint=offset_endpoint(self.endpoint, index), replay_endpoint=replay)


def offset_endpoint(endpoint: str, index: int) -> str:
    """vLLM's ``offset_endpoint_port``: tcp port + index (0 stays 0), inproc suffix ``_dp<i>``.

    vLLM rejects ``ipc://`` for rank > 0; the simulator gives it the ``_dp<i>`` suffix too, so K servers in
    one
    process can each bind their own socket file.
    """
    if index == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{index}"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{host}:{int(port) + index}"
    raise ValueError(f"cannot offset endpoint {endpoint!r} for server {index}")


@dataclass(frozen=True, slots=True)
class SimOptions:
    """Simulator-only behaviour (no vLLM equivalent)."""

    output_len: int = 128
    legacy_events: bool = False
    use_int_block_hashes: bool = True
    kv_events_bind: bool = False  # bind the PUB even where vLLM would connect (tcp://127.0.0.1:port)
    pd_sidecar: bool = False  # act as llm-d's decode sidecar: x-prefiller-host-port runs a prefill leg there
    transfer: TransferModel = field(default_factory=TransferModel)  # a decode leg's KV pull
    # the tokenizer's result cache, in tokens held (tokenize.TokenCache): a benchmark that replays the same prompts
    # to several routers must hold them all, or each router's run pays the tokenizer for a different share
    token_cache_tokens: int = DEFAULT_CACHE_TOKENS


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One server: HTTP identity, engine, events, adapters and timing."""

    host: str
    port: int
    model: str
    served_model_names: tuple[str, ...]
    tokenizer: Path
    engine: EngineConfig
    timing: TimingProfile
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    kv_transfer: KvTransferConfig = field(default_factory=KvTransferConfig)
    lora_modules: tuple[LoraKey, ...] = ()
    enable_prompt_tokens_details: bool = False
    stream_interval: int = 1
    sim: SimOptions = field(default_factory=SimOptions)
    tool_call_parser: str | None = None  # --tool-call-parser, kept only with --enable-auto-tool-choice

    @property
    def tool_parsing(self) -> bool:
        """Whether ``tool_choice`` other than "none" is served (vLLM: both tool flags given)."""
        return self.tool_call_parser is not None

    @property
    def model_name(self) -> str:
        """The first served name (the ``model_name`` metric label)."""
        return self.served_model_names[0]

    def for_index(self, index: int) -> ServerConfig:
        """Server ``index`` of a multi-server process: port + index, event endpoints offset by index."""
        return replace(self, port=self.port + index if self.port else 0, kv_events=self.kv_events.for_index(index))
