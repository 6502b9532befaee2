"""Backends that cost (almost) nothing: one Envoy answering every port with canned vLLM-shaped responses.

For benchmarks where the picker must be the bottleneck (``bench.picker_scaling``): a simulator tokenizes every
prompt again, which on a 2-core box costs more CPU than the picker saves or spends. Each listener answers
``GET /metrics`` with an idle vLLM metrics page (running/waiting/KV usage and ``cache_config_info`` with the
block size), ``GET /v1/models`` with the one model, and any other request with a one-token chat completion.
No KV events: the picker routes these by its approximate index and load, which is all the hot path needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.envoy_proc import EnvoyProcess
from bench.procs import free_ports
from extproc.envoy_config import EnvoyOptions

__all__ = ["CannedBackends"]


def metrics_page(model: str, block_size: int, num_gpu_blocks: int) -> str:
    """An idle engine's ``/metrics``, with the gauges and labels the picker reads."""
    labels = f'model_name="{model}",engine="0"'
    return "\n".join([
        f"vllm:num_requests_running{{{labels}}} 0.0",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.1",
        f'vllm:cache_config_info{{block_size="{block_size}",enable_prefix_caching="True",{labels},'
        f'num_gpu_blocks="{num_gpu_blocks}",prefix_caching_hash_algo="sha256"}} 1.0',
        "",
    ])  # fmt: skip


def models_body(model: str, max_model_len: int) -> str:
    return json.dumps({"object": "list", "data": [
        {"id": model, "object": "model", "owned_by": "vllm", "root": model, "parent": None,
         "max_model_len": max_model_len},
    ]})  # fmt: skip


def completion_body(model: str) -> str:
    return json.dumps({
        "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })  # fmt: skip


def bootstrap(ports: list[int], admin_port: int, model: str, block_size: int) -> dict[str, Any]:
    """An Envoy bootstrap with one listener per port, each answering from ``direct_response``."""

    def answer(prefix: str, body: str, content_type: str) -> dict[str, Any]:
        return {
            "match": {"prefix": prefix},
            "direct_response": {"status": 200, "body": {"inline_string": body}},
            "response_headers_to_add": [{"header": {"key": "content-type", "value": content_type}}],
        }

    routes = [
        answer("/metrics", metrics_page(model, block_size, 1 << 20), "text/plain; version=0.0.4"),
        answer("/v1/models", models_body(model, 1 << 20), "application/json"),
        answer("/", completion_body(model), "application/json"),
    ]
    hcm = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    router = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    listeners = [
        {
            "name": f"canned{port}",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [
                {
                    "filters": [
                        {
                            "name": "envoy.filters.network.http_connection_manager",
                            "typed_config": {
                                "@type": hcm,
                                "stat_prefix": f"canned{port}",
                                "route_config": {
                                    "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]
                                },
                                "http_filters": [
                                    {"name": "envoy.filters.http.router", "typed_config": {"@type": router}}
                                ],
                            },
                        }
                    ]
                }
            ],
        }
        for port in ports
    ]
    admin = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}}
    return {"admin": admin, "static_resources": {"listeners": listeners}}


class CannedBackends:
    """``count`` canned backends in one Envoy; ``addresses`` once started. A context manager."""

    def __init__(self, count: int, workdir: Path, *, model: str, block_size: int) -> None:
        *ports, admin = free_ports(count + 1)
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        opts = EnvoyOptions(endpoints=tuple(self.addresses), admin_port=admin, access_log_path="")
        self.envoy = EnvoyProcess(opts, workdir, config=bootstrap(ports, admin, model, block_size))

    def start(self) -> CannedBackends:
        self.envoy.start()
        return self

    def stop(self) -> None:
        self.envoy.stop()

    def __enter__(self) -> CannedBackends:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
