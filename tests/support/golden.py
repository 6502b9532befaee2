"""Golden data from the real vLLM (``shared/vllm/`` beside the checkout), found relative to the repo.

A missing golden file fails the test (or the collection of a module that loads it at import), never skips:
a skipped golden test is a failing test (STYLE rule 12).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from bench.stack_config import REPO

GOLDEN_DIR = REPO.parent / "shared" / "vllm"


@functools.cache
def golden(name: str) -> Any:
    """The parsed golden file ``name`` (e.g. ``golden-tokens.json``); treat it as read-only."""
    path = GOLDEN_DIR / name
    if not path.is_file():
        pytest.fail(f"golden file {path} is missing (CI keeps shared/ beside the checkout)")
    return json.loads(path.read_text(encoding="utf-8"))


def golden_case(name: str) -> dict[str, Any]:
    """One case of ``golden-tokens.json`` by name (``messages``, ``token_ids``, ...)."""
    case: dict[str, Any] = next(c for c in golden("golden-tokens.json")["cases"] if c["name"] == name)
    return case


def golden_event_hashes(case: str = "doc_summary", *, algo: str = "sha256", block_size: int = 16) -> list[int]:
    """The engine's KV-event block hashes for ``case`` (``golden-hashes.json``), PYTHONHASHSEED unset, no
    cache salt, no LoRA: what vLLM publishes for that prompt."""
    for v in golden("golden-hashes.json")["vectors"]:
        if (v["case"], v["algo"], v["block_size"]) == (case, algo, block_size) and v["pythonhashseed"] is None \
                and v["cache_salt"] is None and v["lora"] is None:  # fmt: skip
            return list(v["event_block_hashes"])
    raise AssertionError(f"golden vector {case}/{algo}/default seed/bs{block_size} missing")


def golden_event_batch() -> bytes:
    """The msgpack ``KVEventBatch`` payload vLLM published in the golden run."""
    return bytes.fromhex(golden("golden-hashes.json")["event_batch"]["payload_hex"])
