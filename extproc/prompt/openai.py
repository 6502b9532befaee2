"""OpenAI bodies (``/v1/completions``, ``/v1/chat/completions``) parsed into a frozen ``ParsedRequest``.

Parsing reads only the fields that change a request's tokens or cache keys (vLLM 0.33.0's protocol, SPEC §5)
plus a few the router logs. It is deliberately *lenient* beyond that: a body vLLM would reject for a reason
we do not check is forwarded and rejected by the engine itself, while a body we reject that vLLM would accept
is a request lost. It is strict where we need the value (model, messages, prompt, cache_salt, template
flags).

Scalars (booleans, integers) and ``prompt`` are validated by pydantic in lax mode, as vLLM's request models
do, so ``"stream": 1``, ``"add_generation_prompt": "false"`` or ``"prompt": [1.0, true]`` mean what they mean
to vLLM (``True``, ``False``, ``[1, 1]``). JSON means what the stdlib ``json`` module makes of the bytes, as
FastAPI does for vLLM (UTF-8/16/32 detection, ``NaN`` accepted, lone surrogates kept; ``json_value``); nesting
deeper than ``MAX_DEPTH`` is refused.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from pydantic import TypeAdapter, ValidationError

from extproc.errors import BadRequest, BodyTooLarge, UnsupportedMediaType

MAX_DEPTH = 64
"""Deepest JSON nesting accepted (a chat body needs ~6; tool schemas a little more)."""
_CONTAINERS = (dict, list)
_STRICT_JSON = msgspec.json.Decoder()  # stateless: decodes strict RFC 8259 JSON in UTF-8, refuses the rest

CACHE_SALT_MAX_CHARS = 128  # vLLM validate_cache_salt (SPEC §5.1)
_CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")

# Immutable validators, built once: pydantic's lax coercions are what vLLM's request models apply.
_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)
_PROMPT: TypeAdapter[list[int] | list[list[int]] | str | list[str]] = TypeAdapter(
    list[int] | list[list[int]] | str | list[str]  # vLLM's union, in vLLM's order
)

Message = Mapping[str, Any]
Prompt = str | tuple[int, ...]
"""One completion prompt: text to tokenize, or token ids used as they are."""


class RequestKind(enum.StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"


_PATHS = {"/v1/chat/completions": RequestKind.CHAT, "/v1/completions": RequestKind.COMPLETION}


def kind_for_path(path: str) -> RequestKind | None:
    """The request kind served at ``path`` (query string ignored), or None for paths we do not parse.

    The one classification of paths: the router passes every other path through. Exact, as vLLM's routes
    are: vLLM (FastAPI's ``redirect_slashes``) answers ``/v1/completions/`` with a 307 to ``/v1/completions``
    and serves nothing there, so a trailing slash is not ours to parse (the redirected request is).
    """
    return _PATHS.get(path.split("?", 1)[0])


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What routing needs from one OpenAI body. Containers inside ``messages``/``tools`` are the decoded JSON.

    ``prompts`` holds every completion prompt (a batch has several); routing uses ``prompt``, the first one,
    since a batch is one HTTP request that goes to one endpoint.
    """

    kind: RequestKind
    model: str
    messages: tuple[Message, ...] = ()
    tools: tuple[Mapping[str, Any], ...] | None = None
    documents: tuple[Any, ...] | None = None
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    reasoning_effort: str | None = None
    add_special_tokens: bool = False
    prompts: tuple[Prompt, ...] = ()
    has_prompt_embeds: bool = False
    cache_salt: str | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    stream: bool = False
    max_tokens: int | None = None

    @property
    def prompt(self) -> Prompt | None:
        """The completion prompt routing looks at (the first of a batch); None for chat or embeds-only."""
        return self.prompts[0] if self.prompts else None


def parse_request(
    body: bytes, content_type: str | None, kind: RequestKind, *, max_bytes: int | None = None
) -> ParsedRequest:
    """Parse one request body. Pure and synchronous; cost is one ``json.loads`` plus a walk of the tree.

    Raises ``UnsupportedMediaType`` (415) for a content type other than JSON, ``BodyTooLarge`` (413) past
    ``max_bytes``, and ``BadRequest`` (400, ``param`` naming the field) for anything else we cannot use.
    Never raises another exception type.
    """
    _check_content_type(content_type)
    if max_bytes is not None and len(body) > max_bytes:
        raise BodyTooLarge(f"request body is {len(body)} bytes; the limit is {max_bytes}")
    data = _decode(body)
    model = _model(data)
    common = {
        "model": model,
        "cache_salt": _cache_salt(data),
        "stream": _opt_bool(data, "stream", False),
        "truncate_prompt_tokens": _opt_int(data, "truncate_prompt_tokens", minimum=-1),
        "truncation_side": _opt_choice(data, "truncation_side", ("left", "right")),
    }
    if kind is RequestKind.CHAT:
        return _parse_chat(data, common)
    return _parse_completion(data, common)


def _check_content_type(content_type: str | None) -> None:
    # FastAPI (vLLM's server) reads the body as JSON when the header is absent or application/json or
    # application/*+json; anything else fails its validation (vLLM answers 400). We answer 415: same refusal,
    # with the precise status and a message that names the cause.
    if content_type is None or not content_type.strip():
        return
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json")):
        return
    raise UnsupportedMediaType(f"content-type {mime!r} is not supported; send application/json")


def json_value(body: bytes) -> Any:
    """``json.loads(body)``: the same value (types, key order, float bits) or the same exception.

    msgspec's decoder computes it where it accepts the input, strict JSON in UTF-8, which is 2-3x faster than
    ``json.loads`` on long bodies (a 100K-token agent context: 0.36 -> 0.19 ms in ASCII, 1.3 -> 0.8 ms with
    accents). What it refuses and ``json`` takes (``NaN``, ``Infinity``, lone surrogate escapes, a BOM, UTF-16
    or UTF-32, numbers past a double's range), and what neither takes, goes to ``json.loads``, whose answer or
    error is the one returned. ``tests/prompt/test_json_value.py`` checks the equality on generated JSON.
    """
    try:
        return _STRICT_JSON.decode(body)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return json.loads(body)


def _decode(body: bytes) -> dict[str, Any]:
    try:
        data = json_value(body)
    except RecursionError:
        raise BadRequest(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, int-digits limit
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    _check_depth(data)
    return data


def _check_depth(root: object) -> None:
    """Refuse nesting past ``MAX_DEPTH`` (iteratively: no recursion on hostile input).

    One level at a time, each a flat list comprehension: linear in the number of containers, with no
    per-node generator or tuple (the stack-of-(node, depth) walk cost more than ``json.loads`` itself on a
    100K-token agent body: 0.42 ms vs 0.33 ms).
    """
    level: list[object] = [root]
    for _depth in range(MAX_DEPTH):
        below: list[object] = []
        for node in level:
            if isinstance(node, dict):
                below += [v for v in node.values() if isinstance(v, _CONTAINERS)]
            elif isinstance(node, list):
                below += [v for v in node if isinstance(v, _CONTAINERS)]
        if not below:
            return
        level = below
    raise BadRequest(f"JSON nested deeper than {MAX_DEPTH} levels")


def _model(data: Mapping[str, Any]) -> str:
    model = data.get("model")
    if model is None:
        raise BadRequest("the 'model' field is required", param="model")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("'model' must be a non-empty string", param="model")
    return model


def _cache_salt(data: Mapping[str, Any]) -> str | None:
    salt = data.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not 1 <= len(salt) <= CACHE_SALT_MAX_CHARS:
        raise BadRequest(f"'cache_salt' must be a string of 1-{CACHE_SALT_MAX_CHARS} chars", param="cache_salt")
    if any(ch in salt for ch in _CACHE_SALT_FORBIDDEN):
        raise BadRequest("'cache_salt' must not contain '@', '/', '\\' or NUL", param="cache_salt")
    return salt


def _opt_bool(data: Mapping[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        raise BadRequest(f"'{name}' must be a boolean", param=name) from None


def _opt_int(data: Mapping[str, Any], name: str, *, minimum: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    try:
        number = _INT.validate_python(value)
    except ValidationError:
        number = minimum - 1
    if number < minimum:
        raise BadRequest(f"'{name}' must be an integer >= {minimum}", param=name)
    return number


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string", param=name)
    return value


def _opt_choice(data: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str | None:
    value = _opt_str(data, name)
    if value is not None and value not in choices:
        raise BadRequest(f"'{name}' must be one of {', '.join(choices)}", param=name)
    return value


def _opt_list(data: Mapping[str, Any], name: str) -> tuple[Any, ...] | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise BadRequest(f"'{name}' must be a list", param=name)
    return tuple(value)


def _parse_chat(data: Mapping[str, Any], common: dict[str, Any]) -> ParsedRequest:
    messages = _messages(data.get("messages"))
    tools = _opt_list(data, "tools")
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise BadRequest("every tool must be an object", param="tools")
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadRequest("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    add_generation_prompt = _opt_bool(data, "add_generation_prompt", True)
    continue_final_message = _opt_bool(data, "continue_final_message", False)
    if add_generation_prompt and continue_final_message:
        raise BadRequest(
            "cannot set both 'continue_final_message' and 'add_generation_prompt' to true",
            param="continue_final_message",
        )
    return ParsedRequest(
        kind=RequestKind.CHAT,
        messages=messages,
        tools=tools,
        documents=_opt_list(data, "documents"),
        chat_template=_opt_str(data, "chat_template"),
        chat_template_kwargs=dict(kwargs or {}),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        reasoning_effort=_opt_str(data, "reasoning_effort"),
        add_special_tokens=_opt_bool(data, "add_special_tokens", False),
        max_tokens=_chat_max_tokens(data),
        **common,
    )


def _chat_max_tokens(data: Mapping[str, Any]) -> int | None:
    if data.get("max_completion_tokens") is not None:
        return _opt_int(data, "max_completion_tokens", minimum=0)
    return _opt_int(data, "max_tokens", minimum=0)


def _messages(value: object) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(value):
        _check_message(i, message)
    return tuple(value)


def _check_message(index: int, message: object) -> None:
    problem = _message_problem(message)
    if problem is not None:  # the message's place is spelled only for an error (an agent body has hundreds)
        raise BadRequest(f"messages[{index}]{problem}", param="messages")


def _message_problem(message: object) -> str | None:
    if not isinstance(message, dict):
        return " must be an object"
    if not isinstance(message.get("role"), str):
        return ".role must be a string"
    content = message.get("content")
    if content is None or isinstance(content, str):
        pass
    elif isinstance(content, list):
        if not all(isinstance(part, str | dict) for part in content):
            return ".content parts must be objects or strings"
    else:
        return ".content must be a string, a list of parts, or null"
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not (
        isinstance(tool_calls, list)
        and all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in tool_calls)
    ):
        return ".tool_calls must be a list of {function: {...}}"
    return None


def _parse_completion(data: Mapping[str, Any], common: dict[str, Any]) -> ParsedRequest:
    has_embeds = data.get("prompt_embeds") is not None
    raw = data.get("prompt")
    if raw is None and not has_embeds:
        raise BadRequest("the 'prompt' field is required", param="prompt")
    return ParsedRequest(
        kind=RequestKind.COMPLETION,
        prompts=() if raw is None else _prompts(raw),
        has_prompt_embeds=has_embeds,
        add_special_tokens=_opt_bool(data, "add_special_tokens", True),
        max_tokens=_opt_int(data, "max_tokens", minimum=0),
        **common,
    )


def _prompts(raw: object) -> tuple[Prompt, ...]:
    """``str | list[str] | list[int] | list[list[int]]`` as a tuple of prompts (ids as plain ``int``)."""
    try:
        value = _PROMPT.validate_python(raw)
    except ValidationError:
        value = []
    if isinstance(value, str):
        return (value,)
    if not value:
        raise BadRequest("'prompt' must be a string, or a non-empty list of strings or token ids", param="prompt")
    if isinstance(value[0], str):
        return tuple(str(p) for p in value)
    if isinstance(value[0], list):
        return tuple(_token_ids(p) for p in value)
    return (_token_ids(value),)


def _token_ids(value: Any) -> tuple[int, ...]:
    ids = tuple(value)
    if not ids or not all(0 <= t < 2**63 for t in ids):  # vLLM would refuse them later (out of vocabulary)
        raise BadRequest("a token-id prompt must be a non-empty list of non-negative integers", param="prompt")
    return ids
