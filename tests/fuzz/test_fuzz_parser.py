"""Property-based fuzzing of the OpenAI request parser and the preparer in front of it.

Whatever the body (random JSON, wrong types, deep nesting, huge arrays and numbers, invalid UTF-8, truncated
bytes), ``parse_request`` either returns a ``ParsedRequest`` or raises a ``RouterError`` whose status is a 4xx;
nothing else ever escapes. Through the real preparer (real Qwen3 tokenizer), text that looks like Jinja
template syntax is tokenized as the literal text it is.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.stack_config import MODEL
from extproc.errors import RouterError
from extproc.prompt.openai import MAX_DEPTH, ParsedRequest, RequestKind, parse_request
from extproc.types import HttpRequest
from tests.fuzz.inproc import ready_app

FIELDS = [
    "model", "messages", "prompt", "cache_salt", "stream", "max_tokens", "max_completion_tokens",
    "tools", "documents", "chat_template", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "truncate_prompt_tokens", "truncation_side",
    "prompt_embeds", "reasoning_effort", "role", "content", "tool_calls", "function", "type", "text",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**200), max_value=10**200),  # far past int64
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["{{ 7*7 }}", "{% for x in y %}", "<|im_end|>", "\ud800", "", " ", MODEL]),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)
bodies_as_objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=10)
kinds = st.sampled_from(list(RequestKind))
content_types = st.sampled_from(
    [
        None,
        "",
        "application/json",
        "application/json; charset=utf-8",
        "application/x+json",
        "text/plain",
        "multipart/form-data",
        "\x00",
    ]
)


def check(body: bytes, content_type: str | None, kind: RequestKind) -> ParsedRequest | RouterError:
    """Parse; return the result or the RouterError. Any other exception fails the test."""
    try:
        return parse_request(body, content_type, kind, max_bytes=1 << 20)
    except RouterError as err:
        assert 400 <= err.status < 500, err
        assert err.message
        return err


@settings(max_examples=300, deadline=None)
@given(bodies_as_objects, content_types, kinds)
def test_random_json_objects(obj: dict[str, Any], content_type: str | None, kind: RequestKind) -> None:
    check(json.dumps(obj).encode(), content_type, kind)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), kinds)
def test_random_bytes(body: bytes, kind: RequestKind) -> None:
    check(body, "application/json", kind)


@settings(max_examples=200, deadline=None)
@given(bodies_as_objects, st.data(), kinds)
def test_truncated_and_corrupted_bodies(obj: dict[str, Any], data: st.DataObject, kind: RequestKind) -> None:
    raw = json.dumps({"model": MODEL, "prompt": "x", "messages": [{"role": "user", "content": "y"}], **obj}).encode()
    cut = data.draw(st.integers(0, len(raw)))
    check(raw[:cut], None, kind)
    pos = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf", b"\\u"]))
    check(raw[:pos] + junk + raw[pos:], None, kind)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        json.dumps({"model": "m", "prompt": [{"a": 1}] * 1}).encode(),
        b'{"model": "m", "prompt": ' + json.dumps(list(range(200_000))).encode() + b"}",
        b'{"model": "m", "prompt": [' + b"9" * 50_000 + b"]}",
        b'{"model": "m", "max_tokens": 1' + b"0" * 5000 + b', "prompt": "x"}',
        b'{"model": "m", "max_tokens": 1e999, "prompt": "x"}',
        b'{"model": "m", "prompt": [1e400]}',
        b'{"model": "m", "prompt": NaN}',
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "m", "cache_salt": "' + b"s" * 10_000 + b'"}',
        '{"model": "m", "prompt": "é"}'.encode("utf-16"),
        b'{"model": "m", "model": 5, "prompt": "x"}',
        b'\xef\xbb\xbf{"model": "m", "prompt": "x"}',
        b"",
        b"null",
        b'"just a string"',
    ],
    ids=[
        "deep-array",
        "deep-messages",
        "object-prompt",
        "huge-array",
        "huge-int-digits",
        "huge-max-tokens",
        "float-overflow",
        "float-token",
        "nan-prompt",
        "lone-surrogate",
        "long-salt",
        "utf16",
        "duplicate-key",
        "bom",
        "empty",
        "null",
        "string",
    ],
)
@pytest.mark.parametrize("kind", list(RequestKind))
def test_hostile_bodies(body: bytes, kind: RequestKind) -> None:
    result = check(body, "application/json", kind)
    if body.startswith(b"[" * (MAX_DEPTH + 1)):
        assert isinstance(result, RouterError)


def test_body_over_the_limit_is_413() -> None:
    result = check(b'{"model": "m", "prompt": "' + b"x" * (2 << 20) + b'"}', None, RequestKind.COMPLETION)
    assert isinstance(result, RouterError) and result.status == 413


# -- through the real preparer (parse, render with Qwen3's chat template, tokenize) --------------------------

TEMPLATE_LIKE = st.sampled_from(
    [
        "{{ ",
        " }}",
        "{%",
        "%}",
        "{#",
        "#}",
        "raw",
        "endraw",
        "messages",
        "7*7",
        "range(99999999)",
        "|",
        "'",
        '"',
        "<|im_start|>",
        "<|im_end|>",
        "\n",
        "system",
        "lipsum.__globals__",
        " ",
    ]
)
template_texts = st.lists(TEMPLATE_LIKE | st.text(max_size=6), min_size=1, max_size=12).map("".join)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app():  # type: ignore[no-untyped-def]
    app = await ready_app()
    yield app
    await app.stop()


@pytest.mark.asyncio(loop_scope="module")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=template_texts)
async def test_template_syntax_stays_text(app, text: str) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]}).encode()
    request = HttpRequest("POST", "/v1/chat/completions", {"content-type": "application/json"}, body, "r")
    prepared = await app.preparer.prepare(request)
    assert prepared.token_ids is not None
    tokenizer = app.preparer._tokenizer._registry.get(app.preparer._models.models[MODEL]).tokenizer
    expected = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer(expected, add_special_tokens=False)["input_ids"] == list(prepared.token_ids)
