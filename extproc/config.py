"""Typed, validated configuration (YAML file → ``RouterConfig``). Units are in the field names.

Validated once at boot; a bad file is a clear error naming the field, and nothing starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from extproc.scheduling.scorers import SCORERS
from extproc.wire import TENANT_HEADER

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_hostport(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected ip:port, got {value!r}")
    return value


class LoraConfig(_Strict):
    name: str = Field(description="adapter name clients put in `model`")
    path: str = Field(description="adapter path exactly as vLLM registered it (part of the block hash)")


class ModelConfig(_Strict):
    name: str = Field(description="served model name, as in vLLM's --served-model-name")
    tokenizer_dir: str | None = Field(None, description="tokenizer folder; default tokenizer_cache/<name>")
    block_size: int | None = Field(None, ge=1, description="KV block size; None = discover from backends")
    hash_algo: Literal["sha256", "sha256_cbor"] | None = Field(None, description="None = discover")
    hash_seed: str | None = Field(None, description="PYTHONHASHSEED the engines run with; None = unset")
    loras: tuple[LoraConfig, ...] = Field((), description="LoRA adapters the engines serve on this model")


class KvEventsConfig(_Strict):
    endpoint: str = Field(description="the engine's PUB endpoint, e.g. tcp://127.0.0.1:5557")
    replay_endpoint: str | None = Field(None, description="the engine's ROUTER replay endpoint")
    topic: str = Field("", description='ZMQ topic to subscribe to, as vLLM\'s kv_events_config.topic; "" = all')


def _role_spelling(value: Any) -> Any:
    """llm-d's label value ``prefill-decode`` is our ``both``."""
    return "both" if value == "prefill-decode" else value


RoleName = Annotated[Literal["prefill", "decode", "both"], BeforeValidator(_role_spelling)]
_ROLE_DESCRIPTION = (
    "P/D role, as llm-d's `llm-d.ai/role` label: prefill (prefill legs only), decode (decode pick, behind "
    "llm-d's decode sidecar) or both (aggregated; `prefill-decode` is read as both)"
)


class EndpointConfig(_Strict):
    address: str = Field(description="ip:port as Envoy reaches the model server")
    metrics_url: str | None = Field(None, description="default http://<address>/metrics")
    models: tuple[str, ...] = Field((), description="served models; empty = discover from /v1/models")
    kv_events: KvEventsConfig | None = Field(
        None, description="the engine's KV-event stream; None = approximate (our own guesses) only"
    )
    role: RoleName = Field("both", description=_ROLE_DESCRIPTION)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _check_hostport(value)


class DnsDiscoveryConfig(_Strict):
    name: str = Field(description="DNS name whose A records are the model servers, e.g. a headless Service's FQDN")
    port: int = Field(ge=1, lt=65536, description="the model servers' HTTP port (the same on every one)")
    interval_s: float = Field(5.0, gt=0, description="how often the name is resolved again")
    timeout_s: float = Field(1.0, gt=0, description="per lookup")
    nameserver: str | None = Field(None, description="ip:port of the DNS server; None = /etc/resolv.conf's first")
    kv_events: KvEventsConfig | None = Field(
        None, description="each discovered endpoint's KV events; `{ip}` in the endpoints becomes its IP"
    )
    role: RoleName = Field(
        "both",
        description="the P/D role of every endpoint this name resolves to: one DNS name per pool (`pools`), e.g. a "
        "headless Service selecting `llm-d.ai/role: decode` (DNS cannot carry the label itself)",
    )

    @field_validator("nameserver")
    @classmethod
    def _nameserver(cls, value: str | None) -> str | None:
        return None if value is None else _check_hostport(value)

    def kv_events_for(self, ip: str) -> KvEventsConfig | None:
        """The KV-event config of the endpoint at ``ip`` (the template with ``{ip}`` filled in)."""
        if self.kv_events is None:
            return None
        replay = self.kv_events.replay_endpoint
        return KvEventsConfig(
            endpoint=self.kv_events.endpoint.replace("{ip}", ip),
            replay_endpoint=None if replay is None else replay.replace("{ip}", ip),
            topic=self.kv_events.topic,
        )


class DiscoveryConfig(_Strict):
    dns: DnsDiscoveryConfig | None = Field(None, description="add the A records of a DNS name as endpoints")
    pools: tuple[DnsDiscoveryConfig, ...] = Field(
        (),
        description="more DNS names, one per pool, each with its own port, role and KV events (e.g. a prefill and "
        "a decode Service); endpoints found are the union",
    )

    def names(self) -> tuple[DnsDiscoveryConfig, ...]:
        """Every DNS name to follow: ``dns``, then ``pools``."""
        return ((self.dns,) if self.dns else ()) + self.pools


class ScrapeConfig(_Strict):
    interval_s: float = Field(0.1, gt=0, description="how often each endpoint's /metrics is read")
    timeout_s: float = Field(0.5, gt=0, description="per scrape")
    stale_after_s: float = Field(2.0, gt=0, description="load older than this counts as unknown")
    discover_interval_s: float = Field(5.0, gt=0, description="how often /v1/models is re-read")
    narrow_pages: bool = Field(
        True,
        description="ask each engine for only the samples the picker reads (vLLM: /metrics/?name[]=...; 59 KB -> "
        "4 KB, and ~5x less of the engine's CPU per read); an endpoint that does not honour it is read whole",
    )
    deferred_reads: bool = Field(
        True,
        description="read each round's answers at the next round or before a decision, whichever comes first, "
        "instead of waking for each (plain-http endpoints at IP addresses; ~45% less CPU per scrape)",
    )
    paced_kv_events: bool = Field(
        True,
        description="read the engines' KV-event messages once per scrape round (every 1.5 s should rounds stop) "
        "instead of waking for each: the precise index lags the engines by up to a round, which the picker's "
        "own marks of its picks cover (index.burst_mark_ttl_s)",
    )


class TtftProfileConfig(_Strict):
    """The default profile: estimate each endpoint's time to first token, stay warm while it is worth it."""

    type: Literal["ttft"] = Field("ttft", description="estimate each endpoint's TTFT and pick the lowest")
    decode_slowdown_per_running: float = Field(
        0.004, ge=0, description="fractional prefill slowdown per running request (batch interference)"
    )
    request_overhead_s: float = Field(
        0.01, ge=0, description="fixed per-request cost: the request's own turn, and each one queued ahead of it"
    )
    kv_pressure_threshold: float = Field(
        1.0,
        ge=0,
        le=1,
        description="KV usage above which the estimate adds up to kv_penalty_s; 1.0 = off (the default: on "
        "prefix-heavy fleets every warm backend runs near full, and spilling for it copies prefixes and evicts more)",
    )
    kv_penalty_s: float = Field(1.0, ge=0, description="the estimate's delay at 100% KV usage, past the threshold")
    unknown_load_penalty_s: float = Field(
        1.0, ge=0, description="added to the estimate of an endpoint whose load is unknown (unknown is not idle)"
    )
    stickiness_s: float = Field(
        0.2,
        ge=0,
        description="prefer the warmest endpoint while its estimate is within this of the best (0.2: at 0.05, "
        "momentary queues on a saturated prefix-heavy fleet made warm backends spill and cascade; "
        "bench/results/probe-stickiness-1.0/notes.md)",
    )
    min_prefix_share: float = Field(
        0.2, ge=0, le=1, description="a cached prefix below this share of the prompt counts as cold"
    )
    tie_epsilon_s: float = Field(0.002, ge=0, description="estimates closer than this are ties, spread")
    copy_into_full_kv: bool = Field(
        False,
        description="let a busy warm request spill onto any endpoint, as before: also a busy one or one whose "
        "prefix cache has no room for the copy (the spill cascade, docs/scheduling.md); false: it spills only onto "
        "an idle endpoint with room, else holds on its warm endpoint (reason hold) and sheddable tenants are shed",
    )


class WeightedProfileConfig(_Strict):
    """The classic blend: weighted scorers in [0, 1] (``scheduling/scorers.py``), the highest total wins."""

    type: Literal["weighted"] = Field(description="weighted scorers, the highest total wins")
    weights: dict[str, float] = Field(
        default_factory=lambda: {"prefix": 3.0, "queue": 2.0, "kv": 1.0},
        description="scorer name (a key of scheduling.scorers.SCORERS) → weight",
    )

    @field_validator("weights")
    @classmethod
    def _known_scorers(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = set(value) - set(SCORERS)
        if unknown:
            raise ValueError(f"unknown scorers {sorted(unknown)}; known: {', '.join(SCORERS)}")
        return value


ProfileConfig = Annotated[TtftProfileConfig | WeightedProfileConfig, Field(discriminator="type")]
_PROFILE_KNOBS = {
    "ttft": frozenset(TtftProfileConfig.model_fields) - {"type"},
    "weighted": frozenset(WeightedProfileConfig.model_fields) - {"type"},
}


class PdConfig(_Strict):
    """Prefill/decode disaggregation (llm-d's convention): used only while some eligible endpoint has role prefill."""

    non_cached_tokens: int = Field(
        256,
        ge=0,
        description="disaggregate only when the prompt tokens not cached on the chosen decode endpoint are at "
        "least this many (llm-d's prefix-based decider `nonCachedTokens`); 0 never disaggregates",
    )
    max_extra_ttft_s: float = Field(
        0.25,
        ge=0,
        description="the prefill pool counts as saturated (run locally) when the best prefill endpoint's estimated "
        "TTFT plus the KV transfer exceeds running it on the decode endpoint by more than this",
    )
    kv_transfer_s_per_token: float = Field(
        5.2e-6,
        ge=0,
        description="KV transfer time per prompt token moved from prefill to decode: 128 KiB of K and V per token "
        "(Llama-3-8B, BF16) at 25 GB/s (one 200 Gb/s RDMA link)",
    )
    kv_transfer_setup_s: float = Field(
        0.002, ge=0, description="fixed cost per disaggregated request: the prefill leg's round trip and handshake"
    )


class CostModelConfig(_Strict):
    """The TTFT estimate learned per endpoint from the engines' own TTFT (``backends/calibration.py``,
    ``docs/scheduling.md``): four weights of the configured estimate's terms, each bounded."""

    learn: bool = Field(
        True, description="learn each endpoint's cost model online and estimate with it; false: measure only"
    )
    max_scale: float = Field(
        4.0,
        ge=1,
        description="bound on how far the learned prefill rate and queue drain may move from the configured ones "
        "(a factor, either way)",
    )
    learning_rate: float = Field(
        0.3, gt=0, le=1, description="nlms: share of an interval's error a learning step removes"
    )
    max_interference_per_running: float = Field(0.1, ge=0, description="bound on the learned slowdown per running")
    max_base_s: float = Field(
        0.5,
        ge=0,
        description="bound on the learned fixed seconds per request (a step's fixed part); the default is ample "
        "for the simulator slowed 5x",
    )
    pooled_share: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of the fleet's mean learned weights in each endpoint's cost (1: one cost model for every "
        "endpoint, for fleets of one hardware, where per-endpoint differences are noise; 0: each its own)",
    )
    learner: Literal["nlms", "rls"] = Field(
        "rls",
        description="how each interval moves the weights: rls, recursive least squares on the interval's relative "
        "error, robust to heavy tails; nlms, a normalized least-mean-squares step of learning_rate on the error in "
        "seconds, which drifts where a few intervals run long (the default until December 8, 2026; "
        "docs/scheduling.md)",
    )
    forgetting: float = Field(
        0.995, gt=0.5, le=1, description="rls: the weight the past keeps per interval (1: never forget)"
    )


class SchedulingConfig(_Strict):
    """How the decision is made: one profile (a tagged union on ``profile.type``) plus what every profile shares.

    The pre-union spelling (``profile: ttft`` or ``weighted`` with the profile's knobs flat on ``scheduling``)
    is still read, with one deprecation warning per load naming the new spelling.
    """

    profile: ProfileConfig = Field(
        default_factory=TtftProfileConfig,
        description="the scheduling profile: {type: ttft, ...} or {type: weighted, weights}",
    )
    prefill_tokens_per_s: float = Field(
        12000.0,
        gt=0,
        description="one endpoint's prefill throughput, to turn tokens into seconds: the TTFT estimate's rate and "
        "the rate at which the load we routed (in-flight, shared) drains, whatever the profile",
    )
    fallbacks: int = Field(2, ge=0, description="extra endpoints in the header for Envoy's retries")
    shed_ttft_s: float = Field(30.0, gt=0, description="sheddable (priority<0) requests get 429 beyond this")
    pd: PdConfig = Field(default_factory=PdConfig, description="prefill/decode disaggregation (needs prefill roles)")
    cost_model: CostModelConfig = Field(
        default_factory=CostModelConfig, description="the TTFT estimate learned per endpoint from what happened"
    )

    @model_validator(mode="before")
    @classmethod
    def _profile_spelling(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _from_flat_spelling(data)
        profile = data.get("profile")
        if isinstance(profile, dict) and profile.get("type") in _PROFILE_KNOBS:
            kind = profile["type"]
            for other, knobs in _PROFILE_KNOBS.items():
                wrong = sorted(knobs & (profile.keys() - _PROFILE_KNOBS[kind])) if other != kind else []
                if wrong:
                    raise ValueError(
                        f"scheduling.profile: {', '.join(wrong)} belong(s) to profile type {other!r}, "
                        f"but profile.type is {kind!r}"
                    )
        return data


def _from_flat_spelling(data: dict[str, Any]) -> dict[str, Any]:
    """The pre-union spelling → ``profile: {type, knobs}``, with one warning naming the new spelling.

    Flat knobs beside a ``profile`` mapping are moved into it (a knob given both ways is an error). Knobs of
    the other profile, which the old spelling accepted and ignored, are dropped, and the warning says so.
    """
    moved = {k: kind for kind, knobs in _PROFILE_KNOBS.items() for k in knobs}
    flat = {k: v for k, v in data.items() if k in moved}
    profile = data.get("profile")
    if not flat and not isinstance(profile, str):
        return data
    given: dict[str, Any] = dict(profile) if isinstance(profile, dict) else {}
    kind = profile if isinstance(profile, str) else given.get("type", "ttft")
    if kind not in _PROFILE_KNOBS:
        raise ValueError(f"scheduling.profile: unknown profile {kind!r}; known: {', '.join(_PROFILE_KNOBS)}")
    mine = {k: v for k, v in flat.items() if moved[k] == kind}
    twice = sorted(k for k, v in mine.items() if k in given and given[k] != v)
    if twice:
        raise ValueError(f"scheduling: {', '.join(twice)} given twice, inside scheduling.profile and beside it")
    ignored = sorted(set(flat) - set(mine))
    new_profile = {**given, "type": kind, **mine}
    new = ", ".join(f"{k}: {v!r}" for k, v in new_profile.items())
    message = f"config: scheduling's flat profile spelling is deprecated; write scheduling.profile: {{{new}}}"
    if ignored:
        message += f" (dropped, as they never applied to the {kind} profile: {', '.join(ignored)})"
    log.warning(message)
    rest = {k: v for k, v in data.items() if k not in moved and k != "profile"}
    return {**rest, "profile": new_profile}


DEFAULT_CLASS = "default"  # the class name of tenants not listed in tenants.classes (a metric label value)


class TenantClass(_Strict):
    """A tenant class's promises: queue priority, TTFT target, and its share of the fleet's prefix cache.

    The cache settings act by placement (``scheduling/tenant_shares.py``); their defaults change nothing: no class
    is protected and no budget is set, so no request is ever steered by them (a single-tenant fleet included).
    """

    priority: int = Field(0, description="higher first; negative = sheddable (429 beyond scheduling.shed_ttft_s)")
    ttft_target_s: float | None = Field(None, gt=0, description="bounds the wait for a warm endpoint")
    cache_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="fraction of KV blocks (of the fleet or of each endpoint: cache_share_of) this class may fill "
        "freely; under it, placement never restricts the class; None: no guaranteed share",
    )
    cache_share_of: Literal["fleet", "endpoint"] = Field(
        "fleet", description="cache_share is a fraction of the fleet's KV blocks, or of each endpoint's"
    )
    protect_hot_prefixes: bool = Field(
        False,
        description="this class's cached blocks (up to its cache_share) are kept from other classes' eviction: "
        "their requests that must evict go to endpoints without them, within a budget, or shed if sheddable",
    )
    uncached_tokens_per_endpoint: int | None = Field(
        None,
        gt=0,
        description="most uncached prompt tokens of this class in flight on one endpoint that holds another "
        "class's protected blocks (bounds its queue there, not its eviction churn: docs/tenants.md); None: no "
        "such endpoint is allowed while another is",
    )


class TenantsConfig(_Strict):
    header: str = Field(TENANT_HEADER, description="request header whose value names the tenant (GIE fairness id)")
    classes: dict[str, TenantClass] = Field(default_factory=dict, description="tenant id → class")
    default: TenantClass = Field(TenantClass(), description="class of tenants not listed in classes")

    @property
    def attributed(self) -> bool:
        """Whether the per-class cache bookkeeping runs: with any class listed (or a protected default class);
        a single-tenant fleet keeps it off and pays nothing."""
        return bool(self.classes) or self.default.protect_hot_prefixes


class _IndexCommon(_Strict):
    enabled: bool = Field(True, description="false: route by load alone (no hashing, no lookups)")
    lookup_deadline_s: float = Field(
        0.005,
        gt=0,
        description="per lookup of the precise index (the approximate one gets twice this); a "
        "lookup past it counts as no match, so the request is routed by load and our own guesses",
    )
    approx_ttl_s: float = Field(600.0, gt=0, description="approximate entries expire after this")
    approx_capacity_blocks: int = Field(20000, gt=0, description="per endpoint, when its KV capacity is not discovered")
    burst_mark_ttl_s: float = Field(2.0, gt=0, description="sibling marks on event-fed endpoints")
    max_blocks: int = Field(8192, gt=0, description="hash at most this many leading blocks per request")


class MemoryIndexConfig(_IndexCommon):
    """The index in this replica's memory (one replica)."""

    backend: Literal["memory"] = Field("memory", description="memory: this replica's own index (the default)")


class LeasesConfig(_Strict):
    enabled: bool = Field(True, description="one replica at a time applies each endpoint's KV events (fencing)")
    ttl_s: float = Field(2.0, ge=0.3, description="a dead replica's event streams fail over within about this + 0.3 s")


class RedisIndexConfig(_IndexCommon):
    """The precise index (and a mirror of our guesses, and the in-flight load) in Redis, shared by replicas."""

    backend: Literal["redis"] = Field(description="redis: shared by every replica naming the same url/namespace")
    url: str = Field(
        description="redis://[:password@]host:port/db or rediss:// (TLS); redis+cluster://[:password@]host:port "
        "(or rediss+cluster://) for a Redis Cluster, any node as the seed (db 0 only)",
    )
    namespace: str = Field("kvidx", description="key prefix (and Redis Cluster hash tag) of this pool")
    timeout_s: float = Field(0.05, gt=0, description="per Redis call; lookups also obey lookup_deadline_s")
    leases: LeasesConfig = Field(LeasesConfig(), description="who applies each endpoint's KV events")
    reserve_redecisions: int = Field(
        3,
        ge=0,
        description="when another replica reserved on the pick between this replica's read and its reservation, "
        "decide again on the fresh shared load up to this many times; the last reservation is taken in any case "
        "(docs/scheduling.md, Replicas as one)",
    )
    share_hot_sets: bool = Field(
        True,
        description="tell the other replicas where each request went and what it hit or placed there (a Redis "
        "stream), so every replica's hot sets, which place new prefixes and bound copies, count the whole "
        "fleet's traffic (docs/scheduling.md, Replicas as one)",
    )
    share_predictions: bool = Field(
        True,
        description="tell the other replicas each request's predicted TTFT (on the hot sets' stream), so every "
        "replica's calibration pairs an engine's first tokens with the whole fleet's requests, not half of them "
        "(docs/scheduling.md, One calibration)",
    )
    share_due_calls: bool = Field(
        True,
        description="tell the other replicas each call routed whose chain's next call is expected (on the hot "
        "sets' stream), so no replica places a chain's first call where another replica's chain has its next call "
        "due, once chains are measured (docs/scheduling.md, One set of due calls)",
    )
    share_busy: bool = Field(
        True,
        description="a reservation carries its request's predicted first token, and every replica's busy floor "
        "counts the others' (docs/scheduling.md, One busy time); off, a replica sees only its own requests' busy "
        "time (agents through two replicas 1.24x one replica's TTFT p90 at 6 req/s, against 1.05x)",
    )

    @field_validator("url")
    @classmethod
    def _cluster_db(cls, url: str) -> str:
        if url.split("://", 1)[0].lower().endswith("+cluster") and urlsplit(url).path.strip("/") not in ("", "0"):
            raise ValueError("a Redis Cluster has only db 0")
        return url


# Old flat spellings (before the backend union) -> where they live now.
_DEPRECATED_INDEX_FIELDS = {
    "redis_url": ("url",),
    "redis_namespace": ("namespace",),
    "redis_timeout_s": ("timeout_s",),
    "event_leases": ("leases", "enabled"),
    "event_lease_ttl_s": ("leases", "ttl_s"),
}


def _upgrade_index(raw: Any) -> Any:
    """Accept the old flat spellings (``index.redis_url`` ...), each with a deprecation warning naming the new
    one; ``backend`` defaults to memory. The old Redis fields were ignored with the memory backend, and still
    are."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    out.setdefault("backend", "memory")
    for old, path in _DEPRECATED_INDEX_FIELDS.items():
        if old not in out:
            continue
        value = out.pop(old)
        new = "index." + ".".join(path)
        if out["backend"] != "redis":
            log.warning("config: index.%s is deprecated and ignored without backend: redis", old)
            continue
        log.warning("config: index.%s is deprecated: write %s", old, new)
        target = out
        for key in path[:-1]:
            target[key] = target = dict(target.get(key) or {})
        target.setdefault(path[-1], value)
    return out


IndexConfig = Annotated[
    MemoryIndexConfig | RedisIndexConfig, Field(discriminator="backend"), BeforeValidator(_upgrade_index)
]


class TokenizerConfig(_Strict):
    encoder: Literal["auto", "hf"] = Field(
        "auto",
        description="auto: a fast exact encoder (fastokens) for each model whose tokenizer it loads and that "
        "equals HF tokenizers on the start-up self-check, HF otherwise; hf: always HF tokenizers (vLLM's own)",
    )
    renderer: Literal["auto", "hf"] = Field(
        "auto",
        description="auto: chat templates rendered by the router's memoized jinja2 sandbox for each model whose "
        "template renders the start-up self-check conversations exactly as transformers' apply_chat_template "
        "does, apply_chat_template otherwise; hf: always apply_chat_template (vLLM's own)",
    )
    segment_cache_mib: int = Field(
        64, ge=0, description="fast encoder: cache of text between added tokens, reused across requests; 0 = off"
    )
    checkpoint_cache_mib: int = Field(
        32,
        ge=0,
        description="fast encoder: long texts remembered with their tokens at cuts (a line break before a letter) "
        "every 4K characters, so a long message that changed near its end is encoded from its last shared cut; "
        "0 = off",
    )
    verify_fraction: float = Field(
        0.01,
        ge=0,
        le=1,
        description="share of fast encodings and fast chat-template renders redone with HF off the hot path; a "
        "mismatch switches that model's encoding or rendering to HF "
        '(router_tokenizer_checks{check,result="mismatch"})',
    )
    verify_cpu_share: float = Field(
        0.01,
        gt=0,
        le=1,
        description="the HF re-encodes and re-renders together use at most this share of one core (a sampled "
        'request that would exceed it is not checked: router_tokenizer_checks{result="skipped"})',
    )
    inline_body_bytes: int = Field(
        64 * 1024, ge=0, description="bodies up to this are rendered and encoded on the event loop (fast encoder)"
    )
    inline_render_bytes: int = Field(
        512 * 1024,
        ge=0,
        description="bodies up to this are rendered on the event loop (fast encoder), and their text encoded there "
        "too when the encoder's checkpoints leave at most inline_body_bytes characters of it to encode afresh (an "
        "agent's context grown by a turn); the rest goes to the tokenizer workers",
    )
    hash_cache_mib: int = Field(
        64, ge=0, description="block hashes of recent token prefixes: a repeat prefix is not hashed again; 0 = off"
    )


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="larger request bodies get 413")
    tokenize_timeout_s: float = Field(
        1.0, gt=0, description="render + tokenize longer than this and the request is routed by load"
    )
    answer_budget_s: float = Field(
        0.5,
        gt=0,
        description="a request that reached the picker longer ago than this is routed by load at once, and "
        "tokenization never runs past it; keep it well under Envoy's ext_proc message_timeout (2 s here)",
    )
    tokenizer_workers: int = Field(2, ge=1, description="threads rendering and tokenizing off the event loop")
    gil_switch_interval_s: float = Field(
        0.005,
        gt=0,
        le=0.005,
        description="how long a worker thread (rendering, tokenizing, hashing) may hold the GIL before the event "
        "loop gets it back (sys.setswitchinterval, once per picker process; 0.005 is Python's own). It equals "
        "index.lookup_deadline_s, so a Redis lookup waiting on a busy worker thread can miss it; 0.0005 cut those "
        "misses 4x but cost ~30% more picker CPU on a 2-core box (docs/scheduling.md): lower it with cores to spare",
    )
    malloc_keep_mib: int = Field(
        64,
        ge=0,
        le=1024,
        description="freed C heap a picker process keeps for reuse (glibc's M_TRIM_THRESHOLD; allocations up to "
        "half of it, at most 32 MiB, come from the heap: M_MMAP_THRESHOLD), so a long body's buffers are not mapped "
        "and page-faulted in anew by the next request (extproc/process.py); the process's memory then stays near "
        "its peak. 0 leaves glibc's own dynamic thresholds; not glibc: ignored",
    )


class WorkersConfig(_Strict):
    fronts: int = Field(
        0,
        ge=0,
        le=64,
        description="front worker processes sharing the gRPC port (SO_REUSEPORT): each parses, tokenizes and "
        "hashes, and asks this process's one decider over a local socket; 0 = this process does everything",
    )
    start_timeout_s: float = Field(
        120.0, gt=0, description="how long start-up waits for every front to load its tokenizers and be ready"
    )


class ListenConfig(_Strict):
    host: str = Field("127.0.0.1", description="address the gRPC and metrics servers bind")
    grpc_port: int = Field(9002, ge=0, lt=65536, description="ext_proc gRPC port; 0 = any free port")
    grpc_server: Literal["h2", "grpcio"] = Field(
        "h2",
        description="the gRPC stack serving ext_proc: h2 (our own gRPC framing over the h2 library: the same "
        "exchange for ~20% less CPU per request, docs/benchmarks.md) or grpcio (grpc.aio)",
    )
    metrics_port: int | None = Field(9090, ge=0, lt=65536, description="Prometheus; None = off")
    authz_port: int | None = Field(
        None,
        ge=0,
        lt=65536,
        description="Envoy ext_authz (HTTP) port, the cheaper transport beside ext_proc (envoy/README.md); "
        "None = off, 0 = any free port. Served by the main process, also with workers.fronts",
    )


class ProtocolConfig(_Strict):
    close_after_pick: bool = Field(
        True,
        description="end the ext_proc stream once the pick is sent; False (GIE gateways) keeps it open so the "
        "response headers can report the endpoint that really served",
    )


class LoggingConfig(_Strict):
    level: str = Field("INFO", description="log level; INFO writes one line per decision")
    log_prompts: bool = Field(
        False, description="decision lines carry the first 512 bytes of the body (prompt text); off: privacy"
    )


class DiagnosticsConfig(_Strict):
    """Prefix-stability diagnostics (docs/diagnostics.md): sampled on the live path, exported as metrics."""

    sample_fraction: float = Field(
        0.02,
        ge=0,
        le=1,
        description="share of routed requests diagnosed (~0.3-1 ms each, on the event loop after the pick); 0: off",
    )
    recent_requests: int = Field(32, ge=1, description="per model and tenant class, recent requests compared against")
    memory_mib: int = Field(8, ge=1, description="bound on the stored fingerprints (8 bytes per 4 tokens), all streams")
    max_prompt_tokens: int = Field(32768, ge=16, description="a prompt is diagnosed up to this many leading tokens")
    max_span_tokens: int = Field(64, ge=1, description="a varying span longer than this is not reported")
    max_shift_tokens: int = Field(8, ge=0, description="how much a span's length may differ between two requests")
    window_requests: int = Field(200, ge=1, description="recent diagnosed requests per stream the report summarises")
    min_share: float = Field(
        0.1, gt=0, le=1, description="a span is reported when at least this share of the window has one ..."
    )
    min_findings: int = Field(3, ge=1, description="... and at least this many requests of the window do")
    plot_blocks: int = Field(512, ge=1, description="per-block repeat rates kept for the first this-many blocks")


class RouterConfig(_Strict):
    listen: ListenConfig = Field(ListenConfig(), description="where the picker serves gRPC and metrics")
    models: tuple[ModelConfig, ...] = Field(min_length=1, description="the served models (and their adapters)")
    endpoints: tuple[EndpointConfig, ...] = Field((), description="static model servers; may be empty with discovery")
    discovery: DiscoveryConfig = Field(DiscoveryConfig(), description="model servers found at run time")
    scrape: ScrapeConfig = Field(ScrapeConfig(), description="reading each endpoint's /metrics and /v1/models")
    scheduling: SchedulingConfig = Field(SchedulingConfig(), description="how the pick is made")
    tenants: TenantsConfig = Field(TenantsConfig(), description="tenant classes, by the fairness header")
    index: IndexConfig = Field(MemoryIndexConfig(), description="the prefix index: memory, or redis (shared)")
    limits: LimitsConfig = Field(LimitsConfig(), description="bounds on request size and tokenization")
    workers: WorkersConfig = Field(WorkersConfig(), description="front worker processes (use more than one core)")
    protocol: ProtocolConfig = Field(ProtocolConfig(), description="ext_proc stream behaviour")
    logging: LoggingConfig = Field(LoggingConfig(), description="log level and what decision lines carry")
    tokenizer: TokenizerConfig = Field(TokenizerConfig(), description="how prompts are encoded")
    diagnostics: DiagnosticsConfig = Field(
        DiagnosticsConfig(), description="prefix-stability diagnostics of the traffic (sampled)"
    )
    tokenizer_cache_dir: str = Field(
        "tokenizer_cache",
        description="folder of per-model tokenizers, loaded offline (relative: to the cwd, or with --relative to "
        "the config's folder)",
    )

    @model_validator(mode="after")
    def _unique(self) -> RouterConfig:
        if not self.endpoints and not self.discovery.names():
            raise ValueError("endpoints: at least one is required unless discovery.dns (or pools) is set")
        addresses = [e.address for e in self.endpoints]
        if len(set(addresses)) != len(addresses):
            raise ValueError("endpoint addresses must be unique")
        names = [m.name for m in self.models] + [lo.name for m in self.models for lo in m.loras]
        if len(set(names)) != len(names):
            raise ValueError("model and adapter names must be unique")
        return self


def load_config(path: str | Path) -> RouterConfig:
    """Read and validate a YAML config. Raises ``ValueError`` with the offending field on bad input."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    return RouterConfig.model_validate(raw or {})
