"""Every case of ``../shared/vllm/golden-tokens.json`` (transformers' own output) through the public path:
JSON body -> ``parse_request`` -> ``ModelRegistry.resolve`` -> ``PromptTokenizer.render_and_tokenize``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.stack_config import MODEL
from extproc.prompt.models import ModelRegistry
from extproc.prompt.openai import RequestKind, kind_for_path, parse_request
from extproc.prompt.render import render_and_tokenize_sync
from extproc.prompt.tokenizers import LoadedTokenizer, PromptTokenizer
from tests.support.golden import golden

CASES = golden("golden-tokens.json")["cases"]


def _body(case: dict[str, Any]) -> tuple[str, bytes]:
    if case["kind"] == "chat":
        body: dict[str, Any] = {"model": MODEL, "messages": case["messages"]}
        if case["template_kwargs"]:
            body["chat_template_kwargs"] = case["template_kwargs"]
        return "/v1/chat/completions", json.dumps(body).encode()
    return "/v1/completions", json.dumps({"model": MODEL, "prompt": case["prompt"]}).encode()


def test_golden_file_has_seven_cases() -> None:
    assert {c["name"] for c in CASES} == {
        "doc_summary", "doc_conclusion", "doc_leading_space", "multi_turn", "no_thinking",
        "completion_doc", "completion_unicode",
    }  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
async def test_golden_tokens_through_the_public_path(
    case: dict[str, Any], models: ModelRegistry, prompt_tokenizer: PromptTokenizer
) -> None:
    path, body = _body(case)
    kind = kind_for_path(path)
    assert kind is not None
    parsed = parse_request(body, "application/json", kind)
    base, lora = models.resolve(parsed.model)
    assert lora is None
    assert list(await prompt_tokenizer.render_and_tokenize(parsed, base)) == case["token_ids"]


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "chat"], ids=lambda c: c["name"])
def test_golden_rendered_text(case: dict[str, Any], loaded: LoadedTokenizer) -> None:
    """The template renders exactly the golden text (a mismatch here explains a token mismatch)."""
    parsed = parse_request(_body(case)[1], None, RequestKind.CHAT)
    text = loaded.tokenizer.apply_chat_template(
        case["messages"], tokenize=False, add_generation_prompt=True, **case["template_kwargs"]
    )
    assert text == case["rendered"]
    assert list(render_and_tokenize_sync(loaded.tokenizer, loaded.info, parsed, loaded.encoder)) == case["token_ids"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
async def test_golden_tokens_via_lora_name_resolve_to_the_base_tokenizer(
    case: dict[str, Any], models: ModelRegistry, prompt_tokenizer: PromptTokenizer
) -> None:
    path, body = _body(case)
    data = json.loads(body)
    data["model"] = "adapter-x"
    kind = kind_for_path(path)
    assert kind is not None
    parsed = parse_request(json.dumps(data).encode(), None, kind)
    base, lora = models.resolve(parsed.model)
    assert base.name == MODEL and lora is not None and lora.path == "/models/adapter-x"
    assert list(await prompt_tokenizer.render_and_tokenize(parsed, base)) == case["token_ids"]
