"""Shared fixtures for the simulator tests: golden data from ../shared/vllm and the Qwen3 tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.helpers import TOKENIZER_DIR
from tests.support.golden import golden
from vllm_sim.tokenize import PromptTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PromptTokenizer:
    return PromptTokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="session")
def golden_tokens() -> dict[str, Any]:
    return {c["name"]: c for c in golden("golden-tokens.json")["cases"]}


@pytest.fixture(scope="session")
def golden_hashes() -> dict[str, Any]:
    data: dict[str, Any] = golden("golden-hashes.json")
    return data
