"""Helpers for the simulator tests: where the tokenizer lives, config from flags (golden data: tests/support)."""

from __future__ import annotations

from collections.abc import Mapping

from bench.stack_config import REPO
from vllm_sim.cli import config_from_args
from vllm_sim.config import ServerConfig

TOKENIZER_DIR = REPO / "tokenizer_cache" / "Qwen" / "Qwen3-0.6B"


def sim_config(*flags: str, env: Mapping[str, str] | None = None) -> ServerConfig:
    """A server config from vllm-sim flags (fast timing, free port, 127.0.0.1) plus ``flags``."""
    base = ["--host", "127.0.0.1", "--port", "0", "--sim-profile", "fast", "--tokenizer", str(TOKENIZER_DIR)]
    return config_from_args([*base, *flags], env)
