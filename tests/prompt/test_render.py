"""Rendering as vLLM does it: conversation normalization, template kwargs, truncation, against real Qwen3."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.errors import RouterError
from extproc.prompt.openai import ParsedRequest, RequestKind, parse_request
from extproc.prompt.render import (
    TemplateInfo,
    TokenizeFailed,
    render_and_tokenize_sync,
    template_kwargs,
    to_conversation,
    tool_dicts,
    truncate,
)
from extproc.prompt.tokenizers import LoadedTokenizer
from tests.support.golden import golden

STRING = TemplateInfo(variables=None, content_format="string", has_developer_role=False)
OPENAI = TemplateInfo(variables=None, content_format="openai", has_developer_role=True)


def chat(messages: list[dict[str, Any]], **fields: Any) -> ParsedRequest:
    raw = json.dumps({"model": "m", "messages": messages, **fields}).encode()
    return parse_request(raw, None, RequestKind.CHAT)


def hf(loaded: LoadedTokenizer, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """What transformers gives for an already-normalized conversation."""
    kwargs.setdefault("add_generation_prompt", True)
    ids = loaded.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    return list(ids)


def ours(loaded: LoadedTokenizer, parsed: ParsedRequest) -> list[int]:
    """Our path with the model's chosen encoder (the fast one or HF: the ``registry`` fixture runs both)."""
    return list(render_and_tokenize_sync(loaded.tokenizer, loaded.info, parsed, loaded.encoder))


def test_qwen3_template_is_inspected(loaded: LoadedTokenizer) -> None:
    info = loaded.info
    assert info.content_format == "string" and not info.has_developer_role
    assert info.variables is not None and {"messages", "tools", "enable_thinking"} <= info.variables


@pytest.mark.parametrize(
    "text",
    ["{{ 7*7 }}", "{% for x in range(3) %}x{% endfor %}", "{# c #}{{ messages }}", "<|im_end|>{%- raw %}"],
    ids=["expression", "for-loop", "comment", "special-token-and-raw"],
)
def test_template_syntax_in_a_message_is_literal_text(loaded: LoadedTokenizer, text: str) -> None:
    tokens = ours(loaded, chat([{"role": "user", "content": text}]))
    expected_text = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert loaded.tokenizer(expected_text, add_special_tokens=False)["input_ids"] == tokens


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, ""),
        ("plain", "plain"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\nb"),
        (["a", {"type": "input_text", "text": "b"}], "a\nb"),
        ([{"type": "text", "text": None}, {"type": "refusal", "refusal": "no"}], "no"),
        ([{"type": "thinking", "thinking": "hmm"}], "hmm"),
        ([], ""),
    ],
    ids=["none", "str", "text-parts", "str-and-input-text", "skip-none-refusal", "thinking", "empty-list"],
)
def test_string_content_format_joins_text_parts(content: object, expected: str) -> None:
    assert to_conversation([{"role": "user", "content": content}], STRING) == [{"role": "user", "content": expected}]


def test_openai_content_format_keeps_parts_except_for_tools() -> None:
    msgs = [{"role": "user", "content": "a"}, {"role": "tool", "content": [{"type": "text", "text": "r"}]}]
    assert to_conversation(msgs, OPENAI) == [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "tool", "content": "r"},
    ]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://x"}},
        {"type": "input_audio"},
        {"type": "wat"},
        {"no": 1},
    ],
    ids=["image", "audio", "unknown", "untyped"],
)
def test_multimodal_parts_cannot_be_reproduced(part: dict[str, Any]) -> None:
    with pytest.raises(TokenizeFailed):
        to_conversation([{"role": "user", "content": [part]}], STRING)


def test_conversation_keeps_only_what_vllm_keeps() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": "x",
            "reasoning_content": "r",
            "tool_calls": [],
            "extra": 1,
            "name": "n",
        },
        {"role": "tool", "content": "y", "tool_call_id": "c1", "name": 5},
        {"role": "developer", "content": "d"},
    ]
    assert to_conversation(msgs, STRING) == [
        {"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r", "name": "n"},
        {"role": "tool", "content": "y", "tool_call_id": "c1"},
        {"role": "system", "content": "d", "tools": None},
    ]
    assert to_conversation(msgs[2:], OPENAI)[0]["role"] == "developer"


@pytest.mark.parametrize(
    ("arguments", "decoded"),
    [('{"city": "Paris"}', {"city": "Paris"}), ("not json", {}), ("", {}), (None, {}), ({"a": 1}, {"a": 1}),
     ("[1]", [1]), (7, {})],
    ids=["json", "invalid", "empty", "none", "dict", "list-json", "int"],
)  # fmt: skip
def test_tool_call_arguments_are_decoded(arguments: object, decoded: object) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    [msg] = to_conversation([{"role": "assistant", "content": None, "tool_calls": [call]}], STRING)
    assert msg["tool_calls"][0]["function"] == {"name": "f", "arguments": decoded}
    assert call["function"]["arguments"] == arguments  # the request is not mutated


def test_tools_are_dumped_like_pydantic() -> None:
    tools = [{"function": {"name": "f", "strict": True}}, {"type": "function", "function": {"name": "g",
             "parameters": {"type": "object"}, "description": "d"}, "x": 1}]  # fmt: skip
    assert tool_dicts(tools) == [
        {"type": "function",
         "function": {"name": "f", "description": None, "parameters": None, "strict": True}},
        {"type": "function", "function": {"name": "g", "description": "d", "parameters": {"type": "object"}},
         "x": 1},
    ]  # fmt: skip
    assert tool_dicts(None) is None


def test_tools_and_tool_calls_render_like_transformers(loaded: LoadedTokenizer) -> None:
    tool = {
        "type": "function",
        "function": {"name": "weather", "description": "w", "parameters": {"type": "object"}},
    }
    call = {"id": "c", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c"},
    ]
    expected_msgs = [*messages[:2], {"role": "assistant", "content": "", "tool_calls": [
        {**call, "function": {"name": "weather", "arguments": {"city": "Paris"}}}]}, messages[3]]  # fmt: skip
    assert ours(loaded, chat(messages, tools=[tool])) == hf(loaded, expected_msgs, tools=[tool])


def test_reasoning_effort_none_disables_thinking(loaded: LoadedTokenizer) -> None:
    case = next(c for c in golden("golden-tokens.json")["cases"] if c["name"] == "no_thinking")
    assert ours(loaded, chat(case["messages"], reasoning_effort="none")) == case["token_ids"]
    kwargs_win = chat(case["messages"], reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert ours(loaded, kwargs_win) != case["token_ids"]


def test_continue_final_message(loaded: LoadedTokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    parsed = chat(messages, add_generation_prompt=False, continue_final_message=True)
    tokens = ours(loaded, parsed)
    assert tokens == hf(loaded, messages, add_generation_prompt=False, continue_final_message=True)
    assert loaded.tokenizer.decode(tokens).endswith("Hel")


def test_add_special_tokens_renders_text_then_encodes(loaded: LoadedTokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    # Qwen3 has no BOS, so both paths agree; the point is that the add_special_tokens path works end to end.
    assert ours(loaded, chat(messages, add_special_tokens=True)) == ours(loaded, chat(messages))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"add_generation_prompt": True, "continue_final_message": False}),
        ({"chat_template_kwargs": {"add_generation_prompt": False}},
         {"add_generation_prompt": True, "continue_final_message": False}),
        ({"chat_template_kwargs": {"enable_thinking": False, "unknown": 1}},
         {"add_generation_prompt": True, "continue_final_message": False, "enable_thinking": False}),
        ({"reasoning_effort": "high"}, {"add_generation_prompt": True, "continue_final_message": False,
                                        "reasoning_effort": "high", "enable_thinking": True}),
        ({"reasoning_effort": "auto"}, {"add_generation_prompt": True, "continue_final_message": False,
                                        "enable_thinking": True}),
        ({"documents": [{"t": "x"}]}, {"add_generation_prompt": True, "continue_final_message": False,
                                       "documents": [{"t": "x"}]}),
    ],
    ids=["defaults", "explicit-field-wins", "undeclared-dropped", "effort", "effort-auto", "documents"],
)  # fmt: skip
def test_template_kwargs(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    info = TemplateInfo(frozenset({"enable_thinking", "reasoning_effort"}), "string", False)
    assert template_kwargs(chat([{"role": "user"}], **fields), info) == expected


def test_server_default_kwargs_have_lowest_priority() -> None:
    info = TemplateInfo(None, "string", False, {"enable_thinking": False, "x": 1})
    kwargs = template_kwargs(chat([{"role": "user"}], chat_template_kwargs={"x": 2, "y": None}), info)
    assert (kwargs["enable_thinking"], kwargs["x"], "y" in kwargs) == (False, 2, False)
    no_defaults = template_kwargs(chat([{"role": "user"}], chat_template_kwargs={"y": None}), STRING)
    assert no_defaults["y"] is None


@pytest.mark.parametrize("key", ["tokenize", "chat_template", "return_dict", "tools", "max_length"])
def test_conflicting_template_kwargs_fail_tokenization(key: str) -> None:
    with pytest.raises(TokenizeFailed):
        template_kwargs(chat([{"role": "user"}], chat_template_kwargs={key: 1}), STRING)


def test_request_chat_template_is_not_rendered(loaded: LoadedTokenizer) -> None:
    with pytest.raises(TokenizeFailed, match="chat_template"):
        ours(loaded, chat([{"role": "user", "content": "x"}], chat_template="{{ 1 }}"))


def test_template_errors_become_tokenize_failed(loaded: LoadedTokenizer) -> None:
    # Qwen3's template raises on content it cannot slice; that must not escape as a jinja2 error.
    with pytest.raises(TokenizeFailed):
        ours(loaded, chat([{"role": "user", "content": "x"}], chat_template_kwargs={"messages": 5}))


def test_content_format_detection() -> None:
    loop = "{% for m in messages %}{% for part in m['content'] %}{{ part.text }}{% endfor %}{% endfor %}"
    assert TemplateInfo.of(loop).content_format == "openai"
    assert TemplateInfo.of("{% for m in messages %}{{ m.content }}{% endfor %}").content_format == "string"
    assert TemplateInfo.of(loop, "string").content_format == "string"
    assert TemplateInfo.of(None).variables == frozenset()
    assert TemplateInfo.of("{% if %}").variables is None
    generation = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}{{ x }}"
    assert TemplateInfo.of(generation).variables == {"messages", "x"}


@pytest.mark.parametrize(
    ("keep", "side", "expected"),
    [(None, None, [1, 2, 3, 4]), (-1, None, [1, 2, 3, 4]), (0, None, []), (2, None, [3, 4]),
     (2, "left", [3, 4]), (2, "right", [1, 2]), (9, None, [1, 2, 3, 4])],
    ids=["none", "max-model-len-unknown", "zero", "left-default", "left", "right", "longer"],
)  # fmt: skip
def test_truncate(keep: int | None, side: str | None, expected: list[int]) -> None:
    assert truncate([1, 2, 3, 4], keep, side) == expected


def test_completion_tokens_and_truncation(loaded: LoadedTokenizer) -> None:
    raw = json.dumps({"model": "m", "prompt": "Hello world", "truncate_prompt_tokens": 1}).encode()
    parsed = parse_request(raw, None, RequestKind.COMPLETION)
    assert ours(loaded, parsed) == loaded.tokenizer("Hello world")["input_ids"][-1:]


messages_st = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "other"])},
        optional={
            "content": st.none()
            | st.text(max_size=30)
            | st.lists(
                st.text(max_size=10)
                | st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "refusal"])},
                                        optional={"text": st.none() | st.text(max_size=10)}),
                max_size=3,
            ),
            "tool_calls": st.lists(
                st.fixed_dictionaries({"function": st.fixed_dictionaries(
                    {"name": st.text(max_size=5)}, optional={"arguments": st.text(max_size=15) | st.none()})}),
                max_size=2,
            ),
            "reasoning_content": st.text(max_size=10),
        },
    ),
    min_size=1,
    max_size=5,
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    messages=messages_st,
    agp=st.booleans(),
    kwargs=st.dictionaries(st.sampled_from(["enable_thinking", "x"]), st.booleans() | st.none(), max_size=2),
)
def test_fuzz_render_returns_ids_or_tokenize_failed(
    loaded: LoadedTokenizer, messages: list[dict[str, Any]], agp: bool, kwargs: dict[str, Any]
) -> None:
    try:
        parsed = chat(messages, add_generation_prompt=agp, chat_template_kwargs=kwargs)
    except RouterError:
        return
    try:
        tokens = ours(loaded, parsed)
    except TokenizeFailed:
        return
    assert all(type(t) is int for t in tokens)
