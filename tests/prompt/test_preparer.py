"""``RequestPreparer``: the router's view: HTTP request in, model/adapter/salt/tokens out."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.stack_config import MODEL, REPO
from extproc.config import RouterConfig
from extproc.errors import BadRequest, UnknownModel, UnsupportedMediaType
from extproc.prompt.models import ModelRegistry
from extproc.prompt.preparer import INLINE_PARSE_BYTES, RequestPreparer, build_preparer, registry_from_config
from extproc.prompt.tokenizers import PromptTokenizer
from extproc.types import HttpRequest, LoraAdapter
from tests.support.golden import golden

CASES = {c["name"]: c for c in golden("golden-tokens.json")["cases"]}


def http(path: str, payload: Any, content_type: str | None = "application/json") -> HttpRequest:
    headers = {":path": path} | ({"content-type": content_type} if content_type else {})
    return HttpRequest("POST", path, headers, json.dumps(payload).encode(), request_id="r1")


@pytest.fixture
def preparer(models: ModelRegistry, prompt_tokenizer: PromptTokenizer, executor: ThreadPoolExecutor) -> RequestPreparer:
    return RequestPreparer(models, prompt_tokenizer, executor, max_body_bytes=8 * 1024 * 1024)


async def test_chat_with_lora_and_salt(preparer: RequestPreparer) -> None:
    case = CASES["multi_turn"]
    payload = {"model": "adapter-x", "messages": case["messages"], "cache_salt": "tenant-a"}
    prepared = await preparer.prepare(http("/v1/chat/completions", payload))
    assert (prepared.model, prepared.base_model) == ("adapter-x", MODEL)
    assert prepared.lora == LoraAdapter("adapter-x", "/models/adapter-x")
    assert prepared.cache_salt == "tenant-a"
    assert list(prepared.token_ids or ()) == case["token_ids"]
    assert prepared.parse_s >= 0


async def test_large_body_is_parsed_off_the_loop(preparer: RequestPreparer) -> None:
    prompt = "The quarterly report covers revenue. " * (INLINE_PARSE_BYTES // 30)
    prepared = await preparer.prepare(http("/v1/completions", {"model": MODEL, "prompt": prompt}))
    assert prepared.token_ids is not None and len(prepared.token_ids) > 40_000


async def test_tokenizer_failure_is_not_an_error(preparer: RequestPreparer) -> None:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
    }
    prepared = await preparer.prepare(http("/v1/chat/completions", payload))
    assert prepared.token_ids is None and prepared.base_model == MODEL


@pytest.mark.parametrize(
    ("path", "payload", "content_type", "error"),
    [
        ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user"}]}, None, UnknownModel),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, None, BadRequest),
        ("/v1/completions", {"model": MODEL, "prompt": "x"}, "text/plain", UnsupportedMediaType),
        ("/v1/embeddings", {"model": MODEL, "input": "x"}, None, BadRequest),
    ],
    ids=["unknown-model", "empty-messages", "not-json", "unsupported-path"],
)
async def test_client_errors_raise(
    preparer: RequestPreparer, path: str, payload: Any, content_type: str | None, error: type[Exception]
) -> None:
    with pytest.raises(error):
        await preparer.prepare(http(path, payload, content_type))


def _config(**model: Any) -> RouterConfig:
    return RouterConfig.model_validate(
        {"models": [{"name": MODEL, **model}], "endpoints": [{"address": "127.0.0.1:8000"}]}
    )


def test_registry_from_config() -> None:
    config = _config(block_size=64, hash_algo="sha256_cbor", hash_seed="0", tokenizer_dir="tok/q",
                     loras=[{"name": "adapter-x", "path": "/models/adapter-x"}])  # fmt: skip
    registry = registry_from_config(config, Path("/base"))
    base, lora = registry.resolve("adapter-x")
    assert base.tokenizer_dir == Path("/base/tok/q")
    assert lora == LoraAdapter("adapter-x", "/models/adapter-x")


async def test_build_preparer_from_config_end_to_end(executor: ThreadPoolExecutor) -> None:
    preparer = build_preparer(_config(), REPO, executor)
    assert await preparer.warm_up() == {}
    case = CASES["completion_unicode"]
    prepared = await preparer.prepare(http("/v1/completions", {"model": MODEL, "prompt": case["prompt"]}))
    assert list(prepared.token_ids or ()) == case["token_ids"]


async def test_warm_up_reports_missing_tokenizers(executor: ThreadPoolExecutor, tmp_path: Path) -> None:
    preparer = build_preparer(_config(), tmp_path, executor)
    assert set(await preparer.warm_up()) == {MODEL}
