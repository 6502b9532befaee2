"""Render and tokenize one parsed request exactly as vLLM's HF renderer does (vLLM 0.33, SPEC §5.3).

Synchronous, CPU-bound and pure given a tokenizer: ``tokenizers.py`` runs it on the event loop or a worker thread.
Steps:

1. messages -> vLLM's *conversation*: content parts joined with ``"\\n"`` ("string" content format) or kept as
   ``[{"type": "text", ...}]`` ("openai" format); ``reasoning_content`` read as ``reasoning``; assistant
   ``tool_calls[].function.arguments`` JSON strings decoded to objects; ``developer`` becomes ``system`` when
   the template has no such role. Multimodal parts cannot be reproduced: ``TokenizeFailed``.
2. template kwargs: the request's ``chat_template_kwargs`` overridden by the explicit fields
   (``add_generation_prompt``, ``continue_final_message``, ``documents``, ``reasoning_effort``, and
   ``enable_thinking = reasoning_effort != "none"`` unless the request set it), then filtered to the variables
   the template declares plus HF's own parameters.
3. ``apply_chat_template(conversation, tools=..., tokenize=False, **kwargs)`` renders the text (the HF tokenizer's,
   or ``renderers.TemplateChoice``: a faster renderer proven to give the same text), which
   the encoder (``encoders.py``: HF or a fast encoder proven equal) encodes with ``add_special_tokens`` as the
   request says (default false). That is what ``apply_chat_template(..., tokenize=True)`` does inside HF.
4. ``truncate_prompt_tokens`` keeps the last N tokens (``truncation_side="right"``: the first N).

Message text is template *data*: ``{{ 7*7 }}`` inside a message renders as those literal characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from extproc.prompt.encoders import HfEncoder, TextEncoder, TokenIds
from extproc.prompt.openai import ParsedRequest, RequestKind
from extproc.prompt.templates import GenerationTag

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
_TEXT_PART_FIELD = {"thinking": "thinking", "refusal": "refusal"}  # the rest carry "text"
# apply_chat_template parameters that would change *how* we call it, not what the template sees.
_CONFLICTING_KWARGS = frozenset(
    {"tokenize", "chat_template", "tools", "conversation", "return_dict", "return_tensors", "padding",
     "truncation", "max_length", "tokenizer_kwargs", "processor_kwargs", "return_assistant_tokens_mask"}
)  # fmt: skip
_HF_TEMPLATE_PARAMS = frozenset({"add_generation_prompt", "continue_final_message", "documents"})
_CONTENT_LOOP = re.compile(r"for\s+\w+\s+in\s+\w+(?:\.content|\[\s*['\"]content['\"]\s*\])")


class TokenizeFailed(Exception):
    """Rendering or tokenizing failed or timed out; the router routes such a request by load alone."""


class ChatRenderer(Protocol):
    """What renders a chat: ``apply_chat_template`` (a ``transformers`` tokenizer or a ``TemplateChoice``)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class ChatTokenizer(Protocol):
    """The slice of a ``transformers`` tokenizer we use (tests pass fakes)."""

    chat_template: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class TemplateInfo:
    """What vLLM derives from a chat template once: its variables, content format and developer role."""

    variables: frozenset[str] | None  # None: the template would not parse; kwargs go through unfiltered
    content_format: str  # "string" | "openai"
    has_developer_role: bool
    default_kwargs: Mapping[str, Any] = field(default_factory=dict)  # the server's defaults, lowest priority

    @classmethod
    def of(
        cls,
        template: str | None,
        content_format: str = "auto",
        default_kwargs: Mapping[str, Any] | None = None,
    ) -> TemplateInfo:
        """Inspect ``template``; ``content_format`` "auto" detects a loop over ``message.content``."""
        source = template if isinstance(template, str) else ""
        if content_format == "auto":
            content_format = "openai" if _CONTENT_LOOP.search(source) else "string"
        variables = _template_variables(source)
        return cls(variables, content_format, "developer" in source, dict(default_kwargs or {}))


def _template_variables(source: str) -> frozenset[str] | None:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=[GenerationTag, jinja2.ext.loopcontrols])
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))
    except jinja2.TemplateError:
        return None


def render_and_tokenize_sync(
    tokenizer: ChatRenderer, info: TemplateInfo, parsed: ParsedRequest, encoder: TextEncoder | None = None
) -> TokenIds:
    """Token ids of ``parsed`` as vLLM computes them. Raises ``TokenizeFailed`` for anything it cannot do.

    ``tokenizer`` renders the chat template; ``encoder`` (default: ``tokenizer`` itself, which must then be an
    HF tokenizer) encodes. Completion batches tokenize their first prompt only (the one routing uses); token-id
    prompts are returned as they are (after truncation). The two halves, ``prompt_text`` and ``encode_prompt``,
    may run on different threads.
    """
    encoder = encoder or HfEncoder(cast(ChatTokenizer, tokenizer))
    if parsed.kind is RequestKind.COMPLETION and isinstance(parsed.prompt, tuple):
        return truncate(list(parsed.prompt), parsed.truncate_prompt_tokens, parsed.truncation_side)
    return encode_prompt(encoder, parsed, prompt_text(tokenizer, info, parsed))


def prompt_text(tokenizer: ChatRenderer, info: TemplateInfo, parsed: ParsedRequest) -> str:
    """The text ``parsed`` encodes: its rendered chat, or its (first) completion prompt. Raises
    ``TokenizeFailed`` for anything it cannot do, token-id prompts included (they need no text)."""
    try:
        if parsed.kind is RequestKind.CHAT:
            return render_chat_text(tokenizer, info, parsed)
        return _completion_text(parsed)
    except TokenizeFailed:
        raise
    except Exception as exc:  # jinja2, or a template raising on odd input: all route by load
        raise TokenizeFailed(f"{type(exc).__name__}: {exc}") from exc


def encode_prompt(encoder: TextEncoder, parsed: ParsedRequest, text: str) -> TokenIds:
    """``text`` (``prompt_text`` of ``parsed``) encoded and truncated as ``parsed`` says. Raises
    ``TokenizeFailed`` for anything it cannot do."""
    try:
        tokens = encoder.encode(text, add_special_tokens=parsed.add_special_tokens)
    except Exception as exc:  # tokenizers failing on odd input: routed by load
        raise TokenizeFailed(f"{type(exc).__name__}: {exc}") from exc
    return truncate(tokens, parsed.truncate_prompt_tokens, parsed.truncation_side)


def truncate(tokens: TokenIds, keep: int | None, side: str | None) -> TokenIds:
    """vLLM's ``truncate_prompt_tokens``: None or -1 (max_model_len, unknown here) keep everything."""
    if keep is None or keep < 0 or keep >= len(tokens):
        return tokens
    if keep == 0:
        return []
    return tokens[:keep] if side == "right" else tokens[-keep:]


def _completion_text(parsed: ParsedRequest) -> str:
    prompt = parsed.prompt
    if prompt is None:
        raise TokenizeFailed("prompt_embeds requests cannot be tokenized")
    if isinstance(prompt, tuple):
        raise TokenizeFailed("a token-id prompt has no text")
    return prompt


def render_chat_text(tokenizer: ChatRenderer, info: TemplateInfo, parsed: ParsedRequest) -> str:
    """The chat prompt's rendered text, before encoding (steps 1-3 of the module docstring, without encoding)."""
    if parsed.chat_template is not None:
        raise TokenizeFailed("request-supplied chat_template is not rendered by the router")
    conversation = to_conversation(parsed.messages, info)
    kwargs = template_kwargs(parsed, info)
    text = tokenizer.apply_chat_template(conversation, tools=tool_dicts(parsed.tools), tokenize=False, **kwargs)
    if not isinstance(text, str):
        raise TokenizeFailed(f"chat template rendered {type(text).__name__}, not text")
    return text


def template_kwargs(parsed: ParsedRequest, info: TemplateInfo) -> dict[str, Any]:
    """The kwargs vLLM passes to ``apply_chat_template`` for this request (step 2 of the module docstring)."""
    user = dict(parsed.chat_template_kwargs)
    if conflicts := _CONFLICTING_KWARGS & user.keys():
        raise TokenizeFailed(f"chat_template_kwargs sets {sorted(conflicts)}")
    explicit: dict[str, Any] = {
        "add_generation_prompt": parsed.add_generation_prompt,
        "continue_final_message": parsed.continue_final_message,
        "documents": list(parsed.documents) if parsed.documents is not None else None,
        "reasoning_effort": parsed.reasoning_effort,
    }
    if parsed.reasoning_effort is not None and "enable_thinking" not in user:
        explicit["enable_thinking"] = parsed.reasoning_effort != "none"
    # Priority: explicit request fields, then the request's chat_template_kwargs, then server defaults.
    merged = _merge(user, explicit)
    if info.default_kwargs:  # vLLM merges server defaults only when there are some (dropping None overrides)
        merged = _merge(info.default_kwargs, merged)
    if info.variables is None:
        return merged
    accepted = info.variables | _HF_TEMPLATE_PARAMS
    return {k: v for k, v in merged.items() if k in accepted}


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``merge_kwargs``: an override of None or "auto" leaves the default in place."""
    return dict(defaults) | {k: v for k, v in overrides.items() if v is not None and v != "auto"}


def tool_dicts(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives them to the template.

    Declared fields come first with their defaults filled in (``type``; ``function.name``, ``description``,
    ``parameters``), then any extra keys in the order sent.
    """
    if tools is None:
        return None
    out = []
    for tool in tools:
        function = tool.get("function")
        fn = dict(function) if isinstance(function, Mapping) else {}
        dumped_fn = {"name": fn.pop("name", None), "description": fn.pop("description", None)}
        dumped_fn["parameters"] = fn.pop("parameters", None)
        rest = {k: v for k, v in tool.items() if k not in ("type", "function")}
        out.append({"type": tool.get("type", "function"), "function": dumped_fn | fn, **rest})
    return out


def to_conversation(messages: Sequence[Mapping[str, Any]], info: TemplateInfo) -> list[dict[str, Any]]:
    """vLLM's parsed conversation for ``messages`` (step 1 of the module docstring)."""
    return [_conversation_message(m, info) for m in messages]


def _conversation_message(message: Mapping[str, Any], info: TemplateInfo) -> dict[str, Any]:
    role = message["role"]
    out: dict[str, Any] = {"role": role, "content": _content(message.get("content"), role, info)}
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls:  # vLLM drops an empty list so templates take the plain assistant path
            out["tool_calls"] = [_tool_call(c) for c in tool_calls]
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
        if not info.has_developer_role:
            out["role"] = "system"
    return out


def _content(content: object, role: str, info: TemplateInfo) -> str | list[dict[str, str]]:
    if isinstance(content, str) and (info.content_format != "openai" or role == "tool"):
        return content  # the common case, as the general path below would give it: "\n".join([content])
    if content is None:
        parts: list[object] = []
    elif isinstance(content, str):
        parts = [content]
    else:
        parts = list(content) if isinstance(content, list) else [content]
    texts = [t for t in (_part_text(p) for p in parts) if t is not None]
    if info.content_format == "openai" and role != "tool":
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


def _part_text(part: object) -> str | None:
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        raise TokenizeFailed(f"content part of type {type(part).__name__}")
    kind = part.get("type")
    if kind not in _TEXT_PART_TYPES:
        raise TokenizeFailed(f"content part {kind!r} (multimodal or unknown) cannot be reproduced")
    text = part.get(_TEXT_PART_FIELD.get(kind, "text"))
    if text is not None and not isinstance(text, str):
        raise TokenizeFailed(f"{kind} part without a string")
    return text


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call with ``arguments`` decoded as vLLM does (invalid JSON or non-objects become ``{}``)."""
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            function["arguments"] = json.loads(args)
        except (ValueError, RecursionError):
            function["arguments"] = {}
    elif not isinstance(args, dict | list):
        function["arguments"] = {}
    return {**call, "function": function}
