"""Helpers for the simulator tests: where golden data and the tokenizer live, config from flags."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_sim.cli import config_from_args
from vllm_sim.config import ServerConfig

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
GOLDEN = SHARED / "vllm"
TOKENIZER_DIR = REPO / "tokenizer_cache" / "Qwen" / "Qwen3-0.6B"


def load_golden(name: str) -> Any:
    """A golden file from ../shared/vllm; a missing file fails (a skipped golden test is a failing test)."""
    return json.loads((GOLDEN / name).read_text())


def sim_config(*flags: str, env: Mapping[str, str] | None = None) -> ServerConfig:
    """A server config from vllm-sim flags (fast timing, free port, 127.0.0.1) plus ``flags``."""
    base = ["--host", "127.0.0.1", "--port", "0", "--sim-profile", "fast", "--tokenizer", str(TOKENIZER_DIR)]
    return config_from_args([*base, *flags], env)
