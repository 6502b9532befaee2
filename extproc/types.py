"""The router's vocabulary: small immutable types every layer speaks.

Adapters (ext_proc, vLLM events, ``vllm:*`` metrics, Redis) translate their wire formats into these types and
back; nothing outside an adapter sees a protobuf, a msgpack frame or a metric name.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NewType

EndpointId = NewType("EndpointId", str)
"""A model server as Envoy addresses it: ``"ip:port"`` (the value of ``x-gateway-destination-endpoint``)."""

BlockHash = NewType("BlockHash", int)
"""A prefix block key *we* computed from a request's tokens: the low 64 bits of vLLM's chained block digest.

Equal to the ``EngineBlockHash`` an engine reports for the same block when seed, algorithm, block size and
extra keys agree; the ingest self-check is what earns an engine's hashes the right to be used as ``BlockHash``.
"""

EngineBlockHash = NewType("EngineBlockHash", int)
"""A block hash as an engine reported it in a KV event, reduced to its low 64 bits."""

TokenIds = Sequence[int]
"""Token ids of a rendered prompt, exactly as vLLM would compute them."""


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter as vLLM registered it; ``path`` is part of the block hash since vLLM 0.31."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class HashScheme:
    """How one model pool hashes prefix blocks (must match the pool's vLLM flags)."""

    block_size: int = 16
    algo: str = "sha256"  # "sha256" | "sha256_cbor"
    seed: str | None = None  # PYTHONHASHSEED as the engines see it; None means unset


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """One endpoint's load as last scraped, plus what we routed there since.

    ``known`` is False until a scrape succeeds, and after scrapes fail: unknown load is not idle.
    """

    running: int = 0
    waiting: int = 0  # requests the last page showed waiting that still wait by our clock (``load.snapshot``)
    kv_usage: float = 0.0  # 0..1
    known: bool = False
    scraped_at_s: float = 0.0  # monotonic
    inflight_requests: int = 0  # routed by us since what the last scrape can show (InflightLoad)
    queued_requests: int = 0  # of those, the ones before their predicted first token by our clock (the estimate's)
    prefill_busy_s: float = 0.0  # until the latest predicted first token routed there (ours, or any replica's shared)
    queued_prefill_tokens: float = 0.0  # uncached prompt tokens we estimate are still ahead in its queue
    # seconds until each chain's next call is expected here (negative: a little late), from what we routed
    # (``scheduling.due_calls``); empty when no chain is measured
    calls_due_s: tuple[float, ...] = ()


class Role(enum.StrEnum):
    """What an endpoint does in prefill/decode disaggregation (llm-d's ``llm-d.ai/role`` label values)."""

    PREFILL = "prefill"  # prefill legs only: never the decode pick
    DECODE = "decode"  # decode pick (behind llm-d's decode sidecar); runs short prompts locally
    BOTH = "both"  # aggregated: either pick (llm-d spells it ``prefill-decode``)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A model server: where it is, what it serves, and whether it is eligible at all."""

    id: EndpointId
    models: frozenset[str] = frozenset()  # served base model names; empty = not yet discovered
    adapters: frozenset[str] = frozenset()  # LoRA adapter names it serves
    healthy: bool = True
    num_gpu_blocks: int | None = None  # KV capacity in blocks, when discovered
    role: Role = Role.BOTH


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who sent a request, as the fairness header names it, and what its class promises."""

    id: str = ""
    priority: int = 0  # higher first; negative is sheddable
    ttft_target_s: float | None = None
    cache_share: float | None = None  # fraction of KV it may fill freely (config.TenantClass says the rest)
    cache_share_of: str = "fleet"  # "fleet" | "endpoint"
    protect_hot_prefixes: bool = False
    uncached_tokens_per_endpoint: int | None = None
    cls: str = ""  # the class it belongs to: its own id when listed in tenants.classes, else "default"


@dataclass(frozen=True, slots=True)
class EndpointShares:
    """One endpoint's prefix cache by tenant class, as the occupancy bookkeeping last saw it (a frozen copy).

    ``by_class``: ``{class: blocks it put there that the engine's events confirmed and has not removed}``;
    blocks nobody we routed put there count in ``used_blocks`` only. ``inflight_uncached``: ``{class: uncached
    prompt tokens we routed there and estimate are not yet prefilled}``.
    """

    used_blocks: int = 0
    by_class: Mapping[str, int] = field(default_factory=dict)
    inflight_uncached: Mapping[str, float] = field(default_factory=dict)
    # {class: blocks we routed there that no event has confirmed yet}: a home exists from its first request,
    # not from the engine's first BlockStored (the flood landed there in between: docs/tenants.md)
    pending_by_class: Mapping[str, int] = field(default_factory=dict)

    def held(self, cls: str) -> int:
        """Blocks ``cls`` holds there or is about to (confirmed plus pending)."""
        return self.by_class.get(cls, 0) + self.pending_by_class.get(cls, 0)


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """Everything the decision needs about one request, after parsing, rendering, tokenizing and hashing."""

    request_id: str
    model: str  # the name the client asked for (base model or adapter)
    base_model: str
    lora: LoraAdapter | None
    prompt_tokens: int  # 0 when tokenization failed
    block_hashes: Sequence[BlockHash]
    block_size: int
    tenant: Tenant = field(default_factory=Tenant)
    subset: frozenset[EndpointId] | None = None  # the gateway's subset hint, when given
    token_ids: TokenIds | None = None  # the prompt's tokens (diagnostics read them; the decision does not)
    # requests that followed each new prefix lately (``scheduling.prefix_reuse``): what a cold placement's
    # hot-traffic window is worth; 1.0 (its full width) when not measured
    prefix_followers: float = 1.0
    # requests that continued one earlier request's own context per request that did not, lately
    # (``scheduling.prefix_reuse``): the calls a chain's start brings along; 0.0 when not measured
    chain_followers: float = 0.0
    # how far the decisions behind ``chain_followers`` fill their window (0: none yet, 1: full): how much that
    # measure is evidence (``sessions.lasting_hits``); 1.0 when not measured
    chains_measured: float = 1.0


@dataclass(frozen=True, slots=True)
class LearnedCost:
    """What the cost model learned of one endpoint (``backends.calibration``), in the TTFT estimate's terms:
    ``base_s + prefill_scale * work_s * (1 + interference_per_running * running) + queue_scale * queue_s``,
    where ``work_s`` and ``queue_s`` are the configured estimate's prefill and per-request queue terms."""

    base_s: float  # seconds every request waits whatever its size (a step's fixed part, the scheduler's turn)
    prefill_scale: float  # configured prefill seconds -> real ones (learned tokens/s = configured / this)
    interference_per_running: float  # fractional prefill slowdown per running request (decode interference)
    queue_scale: float  # configured per-request queue seconds -> real ones (the queue's drain)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A routed request's predicted time to first token on its endpoint and the estimate's terms behind it, as the
    calibration pairs it with the engine's count (``backends.calibration``); replicas sharing Redis tell each other
    theirs (``redis.touches``), so each pairs the engine's first tokens with every replica's requests."""

    endpoint: EndpointId
    ttft_s: float
    features: tuple[float, ...] = ()  # ``CostTerms.features()``; empty: nothing to learn from
    fixed_s: float = 0.0  # the estimate's unlearned terms


@dataclass(frozen=True, slots=True)
class DueCall:
    """A routed call whose chain's next call is expected, as ``scheduling.due_calls`` remembers it; replicas sharing
    Redis tell each other theirs (``redis.touches``), so no replica places a chain's first call where another
    replica's chain has its next call due."""

    endpoint: EndpointId
    block: BlockHash  # its prompt's last full block: a continuation's cached prefix ends in it
    blocks: int  # its prompt's full blocks
    first_token_in_s: float  # seconds from its routing to its predicted first token
    after_s: float | None = None  # what its chain took from its last call's first token to it; None: not measured
    continues: BlockHash | None = None  # where its cached prefix ends (a call it may continue, then no longer due)


@dataclass(frozen=True, slots=True)
class Touch:
    """What one routed request did to its endpoint's prefix cache, as the hot sets count it
    (``backends.hot_blocks``); replicas sharing Redis tell each other theirs (``redis.touches``)."""

    endpoint: EndpointId
    path: Sequence[BlockHash]  # the blocks it hit or placed there as a new prefix, from the prompt's first
    hit_blocks: int  # how many leading blocks of ``path`` were hits (the rest were placed)
    stored_blocks: int  # the blocks it stored there (its uncached ones)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One eligible endpoint with everything the scorers read: frozen input to a pure decision."""

    endpoint: Endpoint
    load: LoadSnapshot
    cached_blocks: int  # leading blocks of the request this endpoint holds (index lookup)
    precise: bool  # cached_blocks comes from the engine's own KV events, not our guesses
    shares: EndpointShares | None = None  # its cache by tenant class (None: bookkeeping off or not known)
    # blocks of its prefix cache that recent requests hit (``backends.hot_blocks``): what a copy must not evict;
    # None: not tracked (capacity unknown)
    hot_blocks: int | None = None
    cost: LearnedCost | None = None  # the endpoint's learned cost model; None: the configured estimate
    # requests that hit this request's deepest cached block here lately (``backends.hot_blocks``): how often the
    # prefix a move would copy is reused; 0 when nothing is cached here or it is not tracked
    prefix_hits: int = 0
    # mean seconds between those hits (``HotBlocks.hit_gap_s``): how many of them a momentary queue here meets;
    # None: not measured, every hit counts as meeting it
    prefix_hit_gap_s: float | None = None


class Reason(enum.StrEnum):
    """Why a decision went the way it did; a label on the decisions metric."""

    CACHE = "cache"  # picked for its cached prefix
    LOAD = "load"  # no useful prefix anywhere: picked by load
    SPILL = "spill"  # a warm endpoint existed but was too busy; went cold
    SHARE = "share"  # tenant cache shares narrowed the candidates (kept off another class's protected blocks)
    MOVE = "move"  # left the warm endpoint: the copy, spread over its prefix's reuse, costs less than the queue
    HOLD = "hold"  # the warm endpoint is busy, but no other has room for a copy: queue there, evict nothing
    NO_TOKENS = "no_tokens"  # tokenization failed or timed out; picked by load
    SHED = "shed"
    NO_ENDPOINT = "no_endpoint"


@dataclass(frozen=True, slots=True)
class Decision:
    """The pick: endpoints in order (first = pick, rest = fallbacks for Envoy's retries), and why."""

    endpoints: tuple[EndpointId, ...]
    reason: Reason
    cached_tokens: int  # predicted cached prompt tokens on the pick
    # {endpoint: estimated seconds to first token}, lower is better (the TTFT profile; empty otherwise)
    estimates_s: Mapping[EndpointId, float] = field(default_factory=dict)
    # {endpoint: weighted scorer total}, higher is better (the weighted profile; empty otherwise)
    scores: Mapping[EndpointId, float] = field(default_factory=dict)
    # {endpoint: seconds}, what going there would cost chains' calls due there, added to the estimate to rank
    # (the TTFT profile, ``scheduling.due_calls``; only the endpoints where it is not 0)
    due_s: Mapping[EndpointId, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request as the proxy showed it to us (the ext_proc adapter builds it; the router reads it).

    ``headers`` keys are lower-case; pseudo-headers keep their colon (``:path``). ``subset`` is the gateway's
    ``envoy.lb.subset_hint`` list when one was sent (an empty tuple means "none eligible").
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    request_id: str
    subset: tuple[EndpointId, ...] | None = None
    received_at_s: float | None = None  # time.monotonic() when the stream's first message reached us


@dataclass(frozen=True, slots=True)
class Route:
    """Send the request to ``endpoints[0]``, falling back in order; add ``headers`` upstream (decision summary)."""

    endpoints: tuple[EndpointId, ...]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PassThrough:
    """No decision: leave the request untouched (Envoy's own fallback balancing applies)."""


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """A request understood: which model/adapter, its cache salt, and its token ids (None: tokenizer failed)."""

    model: str
    base_model: str
    lora: LoraAdapter | None
    cache_salt: str | None
    token_ids: Sequence[int] | None
    parse_s: float = 0.0  # of the prepare step, the time spent parsing the body (the rest is render+tokenize)
