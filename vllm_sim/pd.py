"""Prefill/decode disaggregation as vLLM's NixlConnector and llm-d's decode sidecar play it, simulated.

Two roles, each opt-in by flag:

- **the connector** (``--kv-transfer-config '{"kv_connector": "NixlConnector", ...}'``, vLLM's flag): a request
  whose ``kv_transfer_params`` say ``do_remote_decode`` is a *prefill leg*: it runs as usual (the sidecar sent it
  with ``max_tokens`` 1) and, when it finished length-capped, its response carries the producer's
  ``kv_transfer_params`` (``do_remote_prefill``, ``remote_block_ids``, ``remote_engine_id``,
  ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``), as vLLM's
  ``NixlConnectorScheduler.request_finished``. A request whose params say ``do_remote_prefill`` is a *decode
  leg*: the prompt's full blocks it does not hold are "pulled" (``TransferModel``: a wait, no engine step), then
  stored in its cache, announced by ``BlockStored`` like any computed block, so the request's prefill is only
  the tail. Params missing a remote field (vLLM: "invalid KVTransferParams") are ignored: computed locally.
  The prefill instance keeps its blocks in its prefix cache (free, evictable), as any finished request's.
- **the decode sidecar** (``--sim-pd-sidecar``; llm-d's ``pd-sidecar`` with ``--kv-connector nixlv2``): a
  request carrying ``x-prefiller-host-port: ip:port`` first sends the prefill leg there (the original body plus
  ``kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, remote_*: null}``, ``stream`` false,
  ``stream_options`` removed, ``max_tokens`` 1, ``max_completion_tokens`` and ``min_tokens`` 1 where given, a
  fresh ``x-request-id``), then runs the decode leg here with the ``kv_transfer_params`` the prefill returned,
  and reports the **prefiller's** ``cached_tokens`` in the final usage (llm-d's cached-tokens rewriter). Without
  the header the request runs locally.

The simulator's block ids in ``remote_block_ids`` are placeholders (0..n-1): no memory is really read.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from vllm_sim.openai_api import ApiError

log = logging.getLogger(__name__)

PREFILLER_HEADER = "x-prefiller-host-port"  # llm-d's header naming the prefill pod (pkg/common/routing)
SIDE_CHANNEL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT's default, reported as remote_port
_REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
_PREFILL_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class KvTransferConfig:
    """The part of vLLM's ``--kv-transfer-config`` the simulator reads (other keys are accepted, unused)."""

    kv_connector: str | None = None
    kv_role: str | None = None

    @classmethod
    def from_json(cls, text: str | None) -> KvTransferConfig:
        if not text:
            return cls()
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("--kv-transfer-config must be a JSON object")
        return cls(raw.get("kv_connector"), raw.get("kv_role"))

    @property
    def active(self) -> bool:
        """Whether ``kv_transfer_params`` are honoured (vLLM ignores them without a connector)."""
        return self.kv_connector is not None


@dataclass(frozen=True, slots=True)
class TransferModel:
    """The KV pull of a decode leg: ``setup_s + blocks * block_size * bytes_per_token / bandwidth``.

    Defaults (``--sim-kv-transfer-gbps 25``, ``--sim-kv-bytes-per-token 131072``, 1 ms setup): Llama-3-8B's
    K and V in BF16 (32 layers x 8 KV heads x 128 dims x 2 x 2 bytes = 128 KiB per token) over one 200 Gb/s
    RDMA link at 25 GB/s: 84 us per 16-token block, 86 ms for a 16K-token prompt (whose prefill takes ~0.68 s).
    The pull waits on the network, not the GPU: decode steps of other requests go on meanwhile.
    """

    gbps: float = 25.0
    bytes_per_token: int = 131_072
    setup_s: float = 0.001

    def seconds(self, blocks: int, block_size: int) -> float:
        if blocks <= 0:
            return 0.0
        return self.setup_s + blocks * block_size * self.bytes_per_token / (self.gbps * 1e9)


def transfer_params(body: dict[str, Any]) -> dict[str, Any] | None:
    params = body.get("kv_transfer_params")
    return params if isinstance(params, dict) else None


def wants_remote_decode(body: dict[str, Any]) -> bool:
    """A prefill leg: its KV is for another instance."""
    params = transfer_params(body)
    return bool(params and params.get("do_remote_decode"))


def remote_prefill(body: dict[str, Any]) -> dict[str, Any] | None:
    """A decode leg's valid producer params, or None (not a decode leg, or invalid: computed locally)."""
    params = transfer_params(body)
    if not params or not params.get("do_remote_prefill"):
        return None
    if params.get("remote_block_ids") and any(params.get(k) is None for k in _REMOTE_FIELDS):
        log.warning("invalid KVTransferParams %s: computing the prompt locally", params)
        return None
    return params


def producer_params(request_id: str, engine_id: str, host: str, blocks: int) -> dict[str, Any]:
    """What a finished prefill leg returns (vLLM's ``request_finished`` for a length-capped request)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(blocks)),
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": SIDE_CHANNEL_PORT,
        "tp_size": 1,
    }


def prefill_leg_body(body: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's prefill request: the original body, one token, not streamed, asking for a remote decode."""
    out = dict(body)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    for key in ("max_completion_tokens", "min_tokens"):
        if key in out:
            out[key] = 1
    return out


def decode_leg_body(body: dict[str, Any], params: dict[str, Any] | None) -> dict[str, Any]:
    """The sidecar's decode request: the original body plus what the prefill returned."""
    out = dict(body)
    out["kv_transfer_params"] = params
    return out


class Sidecar:
    """llm-d's decode sidecar in front of this server: runs prefill legs against the named prefill instance."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def prefill(
        self, host_port: str, path: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, int | None]:
        """Send the prefill leg to ``host_port``; returns its ``kv_transfer_params`` and the prefiller's cached
        tokens (None when it does not report them). Raises ApiError(502) when the prefill fails."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_PREFILL_TIMEOUT_S))
        headers = {"x-request-id": str(uuid.uuid4())}
        try:
            async with self._session.post(
                f"http://{host_port}{path}", json=prefill_leg_body(body), headers=headers
            ) as r:
                answer = await r.json(content_type=None)
                if r.status != 200:
                    raise ApiError(r.status if r.status >= 500 else 502, f"prefill at {host_port} answered {r.status}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ApiError(502, f"prefill at {host_port} failed: {exc}") from exc
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        return transfer_params(answer), cached if isinstance(cached, int) else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
