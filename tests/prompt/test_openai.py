"""``parse_request``: tables of accepted and refused bodies, and a fuzz that only RouterError escapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.errors import BadRequest, BodyTooLarge, RouterError, UnsupportedMediaType
from extproc.prompt.openai import MAX_DEPTH, ParsedRequest, RequestKind, kind_for_path, parse_request

CHAT, COMPLETION = RequestKind.CHAT, RequestKind.COMPLETION
MSGS = [{"role": "user", "content": "hi"}]


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def chat(**fields: Any) -> ParsedRequest:
    return parse_request(body(**{"model": "m", "messages": MSGS, **fields}), "application/json", CHAT)


def completion(**fields: Any) -> ParsedRequest:
    return parse_request(body(model="m", **fields), "application/json", COMPLETION)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", COMPLETION),
        ("/v1/completions?x=1", COMPLETION),
        ("/v1/completions/", None),  # vLLM (FastAPI) answers it with a 307 to /v1/completions: not served there
        ("/v1/models", None),
        ("/v1/chat/completions/render", None),
        ("/", None),
    ],
    ids=["chat", "completion", "query", "trailing-slash", "models", "render", "root"],
)
def test_kind_for_path(path: str, kind: RequestKind | None) -> None:
    assert kind_for_path(path) is kind


def test_chat_defaults() -> None:
    p = chat()
    assert (p.kind, p.model, p.messages, p.tools) == (CHAT, "m", tuple(MSGS), None)
    assert (p.add_generation_prompt, p.continue_final_message, p.add_special_tokens) == (True, False, False)
    assert (p.cache_salt, p.stream, p.max_tokens, p.prompt, p.chat_template_kwargs) == (
        None,
        False,
        None,
        None,
        {},
    )


def test_chat_fields_are_read() -> None:
    p = chat(
        tools=[{"type": "function", "function": {"name": "f"}}],
        chat_template_kwargs={"enable_thinking": False},
        add_generation_prompt=False, continue_final_message=True, add_special_tokens=True, cache_salt="t-1",
        stream=True, max_completion_tokens=7, max_tokens=9, reasoning_effort="low", truncate_prompt_tokens=5,
        truncation_side="right", documents=[{"title": "a"}], unknown_field={"ignored": True},
    )  # fmt: skip
    assert p.tools == ({"type": "function", "function": {"name": "f"}},)
    assert p.chat_template_kwargs == {"enable_thinking": False}
    assert (p.add_generation_prompt, p.continue_final_message, p.add_special_tokens) == (False, True, True)
    assert (p.cache_salt, p.stream, p.max_tokens, p.reasoning_effort) == ("t-1", True, 7, "low")
    assert (p.truncate_prompt_tokens, p.truncation_side, p.documents) == (5, "right", ({"title": "a"},))


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hello", ("hello",)),
        ("", ("",)),
        (["a", "b"], ("a", "b")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1, 2], [3]], ((1, 2), (3,))),
    ],
    ids=["str", "empty-str", "batch-str", "token-ids", "batch-token-ids"],
)
def test_completion_prompt_shapes(prompt: object, expected: tuple[object, ...]) -> None:
    p = completion(prompt=prompt)
    assert p.prompts == expected
    assert p.prompt == expected[0]  # a batch routes by its first prompt
    assert p.add_special_tokens is True


def test_completion_embeds_only_has_no_prompt() -> None:
    p = completion(prompt_embeds="AAAA")
    assert p.prompts == () and p.prompt is None and p.has_prompt_embeds


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/x+json",
    ],
    ids=["absent", "empty", "json", "json-charset", "case", "plus-json"],
)
def test_json_content_types_are_accepted(content_type: str | None) -> None:
    assert parse_request(body(model="m", messages=MSGS), content_type, CHAT).model == "m"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_other_content_types_are_415(content_type: str) -> None:
    with pytest.raises(UnsupportedMediaType) as info:
        parse_request(body(model="m", messages=MSGS), content_type, CHAT)
    assert info.value.status == 415


def test_body_too_large_is_413() -> None:
    with pytest.raises(BodyTooLarge):
        parse_request(body(model="m", messages=MSGS), None, CHAT, max_bytes=10)


BAD_CHAT: list[tuple[str, bytes, str | None]] = [
    ("invalid-utf8", b'{"model": "m\xff", "messages": []}', None),
    ("not-json", b"{model: m}", None),
    ("truncated", body(model="m", messages=MSGS)[:-3], None),
    ("empty-body", b"", None),
    ("array", b"[1, 2]", None),
    ("string", b'"hi"', None),
    ("huge-int", b'{"model": "m", "n": ' + b"9" * 5000 + b"}", None),
    ("too-deep", b'{"model": "m", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", None),
    ("deep-but-parsable", b'{"x": ' + b"[" * (MAX_DEPTH + 5) + b"]" * (MAX_DEPTH + 5) + b"}", None),
    ("missing-model", body(messages=MSGS), "model"),
    ("null-model", body(model=None, messages=MSGS), "model"),
    ("int-model", body(model=3, messages=MSGS), "model"),
    ("blank-model", body(model="  ", messages=MSGS), "model"),
    ("missing-messages", body(model="m"), "messages"),
    ("empty-messages", body(model="m", messages=[]), "messages"),
    ("messages-object", body(model="m", messages={"role": "user"}), "messages"),
    ("message-string", body(model="m", messages=["hi"]), "messages"),
    ("message-no-role", body(model="m", messages=[{"content": "hi"}]), "messages"),
    ("role-int", body(model="m", messages=[{"role": 1, "content": "hi"}]), "messages"),
    ("content-int", body(model="m", messages=[{"role": "user", "content": 5}]), "messages"),
    ("content-part-int", body(model="m", messages=[{"role": "user", "content": [5]}]), "messages"),
    ("tool-calls-str", body(model="m", messages=[{"role": "assistant", "tool_calls": "x"}]), "messages"),
    ("tools-object", body(model="m", messages=MSGS, tools={"a": 1}), "tools"),
    ("tool-str", body(model="m", messages=MSGS, tools=["f"]), "tools"),
    ("kwargs-list", body(model="m", messages=MSGS, chat_template_kwargs=[1]), "chat_template_kwargs"),
    ("agp-str", body(model="m", messages=MSGS, add_generation_prompt="maybe"), "add_generation_prompt"),
    ("both-flags", body(model="m", messages=MSGS, continue_final_message=True), "continue_final_message"),
    ("stream-int", body(model="m", messages=MSGS, stream=2), "stream"),
    ("max-tokens-neg", body(model="m", messages=MSGS, max_tokens=-1), "max_tokens"),
    ("max-tokens-float", body(model="m", messages=MSGS, max_tokens=1.5), "max_tokens"),
    ("max-tokens-str", body(model="m", messages=MSGS, max_tokens="ten"), "max_tokens"),
    (
        "truncate-below-minus-one",
        body(model="m", messages=MSGS, truncate_prompt_tokens=-2),
        "truncate_prompt_tokens",
    ),
    ("truncation-side", body(model="m", messages=MSGS, truncation_side="middle"), "truncation_side"),
    ("template-int", body(model="m", messages=MSGS, chat_template=1), "chat_template"),
    ("salt-empty", body(model="m", messages=MSGS, cache_salt=""), "cache_salt"),
    ("salt-long", body(model="m", messages=MSGS, cache_salt="x" * 129), "cache_salt"),
    ("salt-at", body(model="m", messages=MSGS, cache_salt="a@b"), "cache_salt"),
    ("salt-slash", body(model="m", messages=MSGS, cache_salt="a/b"), "cache_salt"),
    ("salt-backslash", body(model="m", messages=MSGS, cache_salt="a\\b"), "cache_salt"),
    ("salt-nul", body(model="m", messages=MSGS, cache_salt="a\x00b"), "cache_salt"),
    ("salt-int", body(model="m", messages=MSGS, cache_salt=5), "cache_salt"),
]


@pytest.mark.parametrize(("raw", "param"), [(b, p) for _, b, p in BAD_CHAT], ids=[i for i, _, _ in BAD_CHAT])
def test_bad_chat_bodies_are_400(raw: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request(raw, "application/json", CHAT)
    assert info.value.status == 400
    assert info.value.param == param


@pytest.mark.parametrize(
    "prompt",
    [None, [], [[]], [1, "a"], [1.5, 2], [-1], [2**63], ["a", 1], [[1], "a"], [[1, 2], [3.5]], {"a": 1}, 5],
    ids=["missing", "empty", "empty-inner", "mixed", "fraction", "negative", "huge", "str-int", "nested-mixed",
         "float", "object", "int"],
)  # fmt: skip
def test_bad_completion_prompts_are_400(prompt: object) -> None:
    fields = {} if prompt is None else {"prompt": prompt}
    with pytest.raises(BadRequest) as info:
        completion(**fields)
    assert info.value.param == "prompt"


@pytest.mark.parametrize(
    ("fields", "attr", "value"),
    [
        ({"stream": 1}, "stream", True),
        ({"stream": "yes"}, "stream", True),
        ({"add_generation_prompt": "false"}, "add_generation_prompt", False),
        ({"add_generation_prompt": 0.0, "continue_final_message": "true"}, "continue_final_message", True),
        ({"max_tokens": True}, "max_tokens", 1),
        ({"max_tokens": 7.0}, "max_tokens", 7),
        ({"max_tokens": " 12 "}, "max_tokens", 12),
    ],
    ids=["stream-1", "stream-yes", "agp-false-str", "cfm-true-str", "max-tokens-bool", "max-tokens-float",
         "max-tokens-str"],
)  # fmt: skip
def test_pydantic_lax_coercions_as_vllm(fields: dict[str, Any], attr: str, value: object) -> None:
    assert getattr(chat(**fields), attr) == value


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [([True, 2], ((1, 2),)), ([1.0, 2], ((1, 2),)), ([[3.0], [False]], ((3,), (0,))), (["1", "2"], ("1", "2"))],
    ids=["bool-ids", "float-ids", "nested", "digit-strings-stay-text"],
)
def test_prompt_coercions_as_vllm(prompt: object, expected: tuple[object, ...]) -> None:
    prompts = completion(prompt=prompt).prompts
    assert prompts == expected
    assert all(type(t) is int for p in prompts if isinstance(p, tuple) for t in p)  # plain ints for hashing


@pytest.mark.parametrize(
    ("salt", "ok"),
    [("a", True), ("x" * 128, True), ("tenant-a_b.c:d", True), ("ünïcødé", True), ("x" * 129, False)],
    ids=["one", "max", "punctuation", "unicode", "too-long"],
)
def test_cache_salt_length(salt: str, ok: bool) -> None:
    if ok:
        assert chat(cache_salt=salt).cache_salt == salt
    else:
        with pytest.raises(BadRequest):
            chat(cache_salt=salt)


@pytest.mark.parametrize(
    ("raw", "model"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "x": NaN}', "m"),
        (b'{"model": "m", "model": "n", "messages": [{"role": "user"}]}', "n"),
        (b'{"model": "m\\ud800", "messages": [{"role": "user"}]}', "m\ud800"),
        (json.dumps({"model": "m", "messages": MSGS}).encode("utf-16"), "m"),
        (b"\xef\xbb\xbf" + json.dumps({"model": "m", "messages": MSGS}).encode(), "m"),
    ],
    ids=["nan", "duplicate-key-last-wins", "lone-surrogate", "utf16", "utf8-bom"],
)
def test_json_quirks_accepted_like_fastapi(raw: bytes, model: str) -> None:
    assert parse_request(raw, None, CHAT).model == model


def test_template_syntax_in_messages_is_kept_verbatim() -> None:
    text = "{{ 7*7 }} {% for x in range(3) %}x{% endfor %}"
    assert chat(messages=[{"role": "user", "content": text}]).messages[0]["content"] == text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)
keys = st.sampled_from(
    ["model", "messages", "prompt", "tools", "chat_template_kwargs", "cache_salt", "stream", "max_tokens",
     "add_generation_prompt", "continue_final_message", "add_special_tokens", "truncate_prompt_tokens",
     "truncation_side", "documents", "chat_template", "reasoning_effort", "prompt_embeds", "role", "content"]
)  # fmt: skip
bodies = st.dictionaries(keys, json_values, max_size=8)


def _parse_or_refuse(raw: bytes, content_type: str | None, kind: RequestKind) -> None:
    try:
        result = parse_request(raw, content_type, kind)
    except RouterError:
        return
    assert isinstance(result, ParsedRequest)


@settings(max_examples=400, deadline=None)
@given(data=bodies, kind=st.sampled_from(list(RequestKind)))
def test_fuzz_structured_bodies(data: dict[str, Any], kind: RequestKind) -> None:
    _parse_or_refuse(json.dumps(data).encode(), "application/json", kind)


@settings(max_examples=300, deadline=None)
@given(data=bodies, cut=st.integers(min_value=0, max_value=400), kind=st.sampled_from(list(RequestKind)))
def test_fuzz_truncated_bodies(data: dict[str, Any], cut: int, kind: RequestKind) -> None:
    _parse_or_refuse(json.dumps(data).encode()[:cut], None, kind)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.binary(max_size=300),
    kind=st.sampled_from(list(RequestKind)),
    ctype=st.none() | st.text(max_size=30),
)
def test_fuzz_random_bytes_and_content_types(raw: bytes, kind: RequestKind, ctype: str | None) -> None:
    _parse_or_refuse(raw, ctype, kind)


@settings(max_examples=50, deadline=None)
@given(depth=st.integers(min_value=1, max_value=3000), opener=st.sampled_from([b"[", b'{"a":']))
def test_fuzz_deep_nesting(depth: int, opener: bytes) -> None:
    closer = b"]" if opener == b"[" else b"}"
    raw = b'{"model": "m", "messages": [{"role": "user"}], "x": ' + opener * depth + b"1" + closer * depth + b"}"
    _parse_or_refuse(raw, None, CHAT)


def _nested(depth: int) -> dict[str, Any]:
    """A chat body whose deepest container is at ``depth`` (the body itself is depth 1), dicts and lists mixed."""
    node: Any = "leaf"
    for level in range(depth - 1):
        node = [node] if level % 2 else {"k": node}
    return {"model": "m", "messages": MSGS, "x": node, "y": [1, {"z": 2}]}


@pytest.mark.parametrize(("depth", "refused"), [(MAX_DEPTH - 1, False), (MAX_DEPTH, False), (MAX_DEPTH + 1, True)])
def test_depth_limit_is_exact(depth: int, refused: bool) -> None:
    raw = json.dumps(_nested(depth)).encode()
    if refused:
        with pytest.raises(BadRequest, match="nested deeper"):
            parse_request(raw, None, CHAT)
    else:
        assert parse_request(raw, None, CHAT).model == "m"
