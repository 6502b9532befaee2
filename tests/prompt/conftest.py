"""Shared fixtures: the real Qwen3 tokenizer (``tokenizer_cache/``); golden files come from ``tests/support/golden``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.stack_config import MODEL, REPO
from extproc.prompt.models import Adapter, BaseModel, ModelRegistry
from extproc.prompt.tokenizers import EncoderSettings, LoadedTokenizer, PromptTokenizer, TokenizerRegistry
from extproc.types import LoraAdapter


@pytest.fixture(scope="session")
def qwen() -> BaseModel:
    return BaseModel(MODEL)


@pytest.fixture(scope="session")
def models(qwen: BaseModel) -> ModelRegistry:
    return ModelRegistry([qwen], [Adapter(LoraAdapter("adapter-x", "/models/adapter-x"), MODEL)])


@pytest.fixture(scope="session", params=["fastokens", "hf"])
def registry(request: pytest.FixtureRequest) -> TokenizerRegistry:
    """The real tokenizer folder, once per encoder: every golden and render test runs on both."""
    registry = TokenizerRegistry(REPO / "tokenizer_cache", encoders=EncoderSettings(fast=request.param == "fastokens"))
    encoder = registry.get(BaseModel(MODEL)).encoder
    assert encoder.name == request.param, encoder.fallback_reason  # never silently HF twice
    return registry


@pytest.fixture(scope="session")
def loaded(registry: TokenizerRegistry, qwen: BaseModel) -> LoadedTokenizer:
    return registry.get(qwen)


@pytest.fixture(scope="session")
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tok") as pool:
        yield pool


@pytest.fixture
async def prompt_tokenizer(registry: TokenizerRegistry, executor: ThreadPoolExecutor) -> AsyncIterator[PromptTokenizer]:
    yield PromptTokenizer(registry, executor, timeout_s=30.0)
