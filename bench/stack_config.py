"""What the stack launcher writes for its children: ``vllm-sim`` flags, the picker's YAML, Envoy bootstraps.

Pure functions of plain data; ``bench/stack.py`` does the I/O. The Envoy variants start from
``extproc.envoy_config.render_bootstrap`` (the one renderer) and edit the rendered dict only where
``EnvoyOptions`` cannot say what a benchmark needs (several pickers, no ext_proc, an upstream-host header).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Literal

from extproc.envoy import keys
from extproc.envoy.filters import EXT_PROC_FILTER
from extproc.envoy_config import EnvoyOptions, render_bootstrap

EnvoyKind = Literal["picker", "round_robin", "least_request"]
"""``picker``: ext_proc (BUFFERED, fail-open) + override_host. The others: Envoy's own balancer, no ext_proc."""

ENVOY_KINDS: tuple[EnvoyKind, ...] = ("picker", "round_robin", "least_request")

UPSTREAM_HOST_HEADER = "x-upstream-host"
"""Response header every stack Envoy adds: the ``ip:port`` of the backend that served (``%UPSTREAM_HOST%``)."""

REPO = Path(__file__).resolve().parents[1]
"""The checkout's root: children run here (``python -m vllm_sim``, ``python -m extproc.cli``)."""
MODEL = "Qwen/Qwen3-0.6B"
"""The model every stack serves (its tokenizer ships in ``tokenizer_cache/``)."""
TOKENIZER_CACHE = REPO / "tokenizer_cache"
HASH_SEED = "0"
"""PYTHONHASHSEED for the engines, and the picker's ``hash_seed``: KV-event hashes the picker can reproduce."""

SIM_READY = re.compile(r"^vllm-sim: ready", re.MULTILINE)
"""The line ``vllm-sim`` prints once every server in its process listens."""
SIM_SERVING = re.compile(r"^vllm-sim: serving \S+ on http://(\S+)$", re.MULTILINE)
"""One line per server: group 1 is its ``ip:port``."""
PICKER_READY = re.compile(r"extproc: ready on ([\d.]+):(\d+) \(metrics :(\d+)\)(?: \(authz :(\d+)\))?")
"""``extproc serve``'s line after its first scrape: host, gRPC port, metrics port."""

_LB = "envoy.load_balancing_policies"
_LB_TYPES = {
    "round_robin": "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin",
    "least_request": "envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
}


def sim_argv(
    python: str,
    *,
    servers: int,
    profile: str,
    block_size: int,
    max_model_len: int,
    num_gpu_blocks: int | None,
    kv_events_base: str | None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """One ``vllm-sim`` process with ``servers`` servers on free HTTP ports; with ``kv_events_base`` (a path
    prefix), server ``i`` publishes KV events on ``kv_events_sources(kv_events_base, i)``."""
    argv = [
        python, "-m", "vllm_sim", MODEL,
        "--host", "127.0.0.1", "--port", "0", "--sim-num-servers", str(servers),
        "--tokenizer", str(TOKENIZER_CACHE / MODEL), "--sim-profile", profile,
        "--block-size", str(block_size), "--max-model-len", str(max_model_len),
        "--enable-prompt-tokens-details",
    ]  # fmt: skip
    if num_gpu_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if kv_events_base is not None:
        events = {"enable_kv_cache_events": True, **kv_events_sources(kv_events_base, 0)}
        argv += ["--kv-events-config", json.dumps(events)]
    return argv + list(extra)


NIXL_TRANSFER_CONFIG = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
"""vLLM's ``--kv-transfer-config`` in llm-d's P/D guide (vLLM's NixlConnector; roles come from the proxy)."""


def pd_sim_args(role: Literal["prefill", "decode"]) -> tuple[str, ...]:
    """The vllm-sim flags of a P/D pool: the NIXL connector, plus llm-d's decode sidecar on decode servers."""
    sidecar = ("--sim-pd-sidecar",) if role == "decode" else ()
    return ("--kv-transfer-config", NIXL_TRANSFER_CONFIG, *sidecar)


def kv_events_sources(base: str, index: int) -> dict[str, str]:
    """Server ``index``'s PUB and replay endpoints. ``ipc://``: vLLM (and vllm-sim) *bind* it, so every
    picker replica can dial it, and nothing listens on TCP; server ``i > 0`` gets vllm-sim's ``_dp<i>``
    suffix. (A ``tcp://127.0.0.1:port`` endpoint would make the engine *connect* instead, vLLM's rule.)"""
    suffix = f"_dp{index}" if index else ""
    return {"endpoint": f"ipc://{base}.pub{suffix}", "replay_endpoint": f"ipc://{base}.replay{suffix}"}


def picker_config(
    endpoints: list[str],
    kv_events: dict[str, dict[str, str]] | None = None,
    *,
    block_size: int | None = 16,
    hash_seed: str | None = HASH_SEED,
    metrics_urls: dict[str, str] | None = None,
    log_level: str | None = "WARNING",
    overrides: dict[str, Any] | None = None,
    roles: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The picker's ``RouterConfig`` as a dict: gRPC and metrics on port 0 (the ready line names them),
    the in-memory index, ``endpoints`` (with their KV-event PUB endpoint where ``kv_events`` has one, and
    their metrics URL where ``metrics_urls`` has one, their P/D role where ``roles`` has one).

    ``block_size`` None: the model names no block size and no hash algorithm (the picker discovers both
    from the backends); ``hash_seed`` None: none set; ``log_level`` None: the config's default.
    ``overrides``: top-level sections merged over the generated ones (``merge_sections``).
    """
    model: dict[str, Any] = {"name": MODEL, "tokenizer_dir": str(TOKENIZER_CACHE / MODEL)}
    if block_size is not None:
        model.update(block_size=block_size, hash_algo="sha256")
    if hash_seed is not None:
        model["hash_seed"] = hash_seed
    kv_events, metrics_urls, roles = kv_events or {}, metrics_urls or {}, roles or {}
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "grpc_port": 0, "metrics_port": 0},
        "models": [model],
        "endpoints": [_endpoint(e, kv_events.get(e), metrics_urls.get(e), roles.get(e)) for e in endpoints],
        "tokenizer_cache_dir": str(TOKENIZER_CACHE),
    }
    if log_level is not None:
        config["logging"] = {"level": log_level}
    return merge_sections(config, overrides or {})


def _endpoint(
    address: str, kv_events: dict[str, str] | None, metrics_url: str | None, role: str | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"address": address}
    if role is not None:
        entry["role"] = role
    if kv_events is not None:
        entry["kv_events"] = kv_events
    if metrics_url is not None:
        entry["metrics_url"] = metrics_url
    return entry


def merge_sections(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each top-level section of ``overrides`` merged in: a dict over a dict is merged one
    level deep, anything else replaces the section. Returns a new dict; neither argument changes."""
    out = dict(config)
    for key, value in overrides.items():
        base = out.get(key)
        out[key] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    return out


def envoy_bootstrap(kind: EnvoyKind, opts: EnvoyOptions, pickers: list[tuple[str, int]]) -> dict[str, Any]:
    """The rendered bootstrap for ``kind``, plus the upstream-host response header.

    ``picker``: every picker in ``pickers`` goes into the ext_proc cluster (``EnvoyOptions`` names one).
    ``round_robin`` / ``least_request``: ``EnvoyOptions`` cannot express "no ext_proc", so the ext_proc
    filter (and any per-route ext_proc config) is removed from the rendered dict and the model cluster's
    override_host policy is replaced by the plain balancer: a baseline with no picker in the path at all.
    """
    config = copy.deepcopy(render_bootstrap(opts))
    hcm = _hcm(config)
    vhost = hcm["route_config"]["virtual_hosts"][0]
    vhost["response_headers_to_add"] = [
        {
            "header": {"key": UPSTREAM_HOST_HEADER, "value": "%UPSTREAM_HOST%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    if kind == "picker":
        if len(pickers) > 1:
            lb_endpoints = [_lb_endpoint(host, port) for host, port in pickers]
            clusters[keys.PICKER_CLUSTER]["load_assignment"]["endpoints"] = [{"lb_endpoints": lb_endpoints}]
        return config
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != EXT_PROC_FILTER]
    for route in vhost["routes"]:
        route.get("typed_per_filter_config", {}).pop(EXT_PROC_FILTER, None)
    policy = {"name": f"{_LB}.{kind}", "typed_config": {"@type": f"type.googleapis.com/{_LB_TYPES[kind]}"}}
    clusters[keys.MODEL_CLUSTER]["load_balancing_policy"] = {"policies": [{"typed_extension_config": policy}]}
    return config


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    listener = config["static_resources"]["listeners"][0]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def _lb_endpoint(host: str, port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
