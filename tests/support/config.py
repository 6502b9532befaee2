"""Router configs for in-process tests, written by the harness's one picker-config writer.

``router_config(endpoints, **sections)``: a validated ``RouterConfig`` for ``endpoints`` serving the stack's
model (``bench.stack_config.picker_config``: the same writer the stack launcher uses), listening on a free
loopback gRPC port, metrics off, a generous tokenize timeout; the model's block size and hash algorithm
are left to discovery and no hash seed is set. ``sections`` merge over the top-level sections one level deep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.stack_config import merge_sections, picker_config
from extproc.config import RouterConfig

ENDPOINTS = ("127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003")
_IN_PROCESS: dict[str, Any] = {
    "listen": {"metrics_port": None},
    "limits": {"tokenize_timeout_s": 10.0},
}


def router_config(endpoints: Sequence[str] = ENDPOINTS, **overrides: Any) -> RouterConfig:
    """A config for ``endpoints`` serving Qwen3, listening on free loopback ports, metrics off."""
    raw = picker_config(list(endpoints), block_size=None, hash_seed=None, log_level=None,
                        overrides=merge_sections(_IN_PROCESS, overrides))  # fmt: skip
    return RouterConfig.model_validate(raw)
