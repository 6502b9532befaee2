"""Tools and ``tool_choice`` with and without vLLM's tool flags (``--enable-auto-tool-choice --tool-call-parser``):
status and error JSON exactly as vLLM 0.32's CPU build answered them (docs/simulator.md; the real-vLLM tier's
differential suite compares the same cases against the engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.sim.helpers import sim_config
from vllm_sim.cluster import SimCluster
from vllm_sim.tokenize import PromptTokenizer

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _err(message: str, param: str | None = None) -> tuple[int, dict[str, Any]]:
    return 400, {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


# (id, extra body fields, answer without the flags, answer with them); None = 200
CASES: list[tuple[str, dict[str, Any], tuple[int, Any] | None, tuple[int, Any] | None]] = [
    ("unset", {"tools": [TOOL]}, _err(AUTO), None),
    ("auto", {"tools": [TOOL], "tool_choice": "auto"}, _err(AUTO), None),
    ("auto-streamed", {"tools": [TOOL], "stream": True}, _err(AUTO), None),
    ("none", {"tools": [TOOL], "tool_choice": "none"}, None, None),
    ("null", {"tools": [TOOL], "tool_choice": None}, None, None),
    ("required", {"tools": [TOOL], "tool_choice": "required"},
     _err('tool_choice="required" requires --tool-call-parser to be set'), None),
    ("named", {"tools": [TOOL], "tool_choice": _named("get_weather")},
     _err('tool_choice=function "get_weather" requires --tool-call-parser to be set'), None),
    ("auto-before-sampling", {"tools": [TOOL], "top_p": 1.5}, _err(AUTO),
     _err("top_p must be in (0, 1], got 1.5.", "top_p")),
    ("no-tools-none", {"tool_choice": "none"}, None, None),
]  # fmt: skip
_UNKNOWN = "The tool specified in `tool_choice` does not match any of the specified `tools` (parameter=tool_choice)"
# the schema-level checks, the same with or without the flags
SCHEMA: list[tuple[str, dict[str, Any], tuple[int, Any]]] = [
    ("named-unknown", {"tools": [TOOL], "tool_choice": _named("nope")}, _err(_UNKNOWN, "tool_choice")),
    ("choice-without-tools", {"tool_choice": "auto"},
     _err("When using `tool_choice`, `tools` must be set. (parameter=tool_choice)", "tool_choice")),
    ("required-without-tools", {"tool_choice": "required"},
     _err("When using `tool_choice`, `tools` must be set. (parameter=tool_choice)", "tool_choice")),
    ("tools-empty", {"tools": []}, _err("`tools` must not be an empty array. Either provide at least one tool or "
                                       "omit the field entirely. (parameter=tools)", "tools")),
    ("choice-bogus", {"tools": [TOOL], "tool_choice": "bogus"},
     _err('Invalid value for `tool_choice`: bogus! Only named tools, "none", "auto" or "required" are supported. '
          "(parameter=tool_choice)", "tool_choice")),
    ("named-without-name", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {}}},
     _err('Expected field `name` in `function` in `tool_choice`! Correct usage: `{"type": "function", "function": '
          '{"name": "my_function"}}` (parameter=tool_choice.function.name)', "tool_choice.function.name")),
]  # fmt: skip


@pytest.fixture(params=[False, True], ids=["without-flags", "with-flags"])
async def server(request: pytest.FixtureRequest, tokenizer: PromptTokenizer) -> AsyncIterator[tuple[str, bool]]:
    flags = FLAGS if request.param else ()
    async with SimCluster(sim_config("--max-model-len", "2048", *flags), n=1, tokenizer=tokenizer) as cluster:
        yield cluster.urls[0], request.param


async def _chat(base: str, extra: dict[str, Any]) -> tuple[int, Any]:
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 2, **extra}
    async with aiohttp.ClientSession() as s, s.post(f"{base}/v1/chat/completions", json=body) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else None)


@pytest.mark.parametrize(("extra", "without", "with_"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_tool_choice_needs_the_tool_flags_as_in_vllm(
    server: tuple[str, bool], extra: dict[str, Any], without: tuple[int, Any] | None, with_: tuple[int, Any] | None
) -> None:
    base, flags = server
    status, body = await _chat(base, extra)
    expected = with_ if flags else without
    if expected is None:
        assert status == 200, body
    else:
        assert (status, body) == expected


@pytest.mark.parametrize(("extra", "expected"), [c[1:] for c in SCHEMA], ids=[c[0] for c in SCHEMA])
async def test_tool_usage_errors_do_not_depend_on_the_flags(
    server: tuple[str, bool], extra: dict[str, Any], expected: tuple[int, Any]
) -> None:
    assert await _chat(server[0], extra) == expected


async def test_tools_are_rendered_into_the_prompt_with_tool_choice_none(server: tuple[str, bool]) -> None:
    base, _ = server
    (s1, plain), (s2, tools) = await _chat(base, {}), await _chat(base, {"tools": [TOOL], "tool_choice": "none"})
    assert s1 == s2 == 200
    assert tools["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 50


def test_tool_flags_resolve_as_vllm_reads_them() -> None:
    assert sim_config().tool_parsing is False
    assert sim_config("--tool-call-parser", "hermes").tool_parsing is False  # a parser alone enables nothing
    assert sim_config(*FLAGS).tool_call_parser == "hermes" and sim_config(*FLAGS).tool_parsing
    with pytest.raises(ValueError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        sim_config("--enable-auto-tool-choice")
