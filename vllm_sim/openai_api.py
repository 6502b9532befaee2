"""OpenAI-compatible request parsing and response shapes, as vLLM 0.33's OpenAI server has them. Pure functions.

Errors are :class:`ApiError` (status + vLLM's error ``type``); :func:`error_body` renders vLLM's
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from vllm_sim.tokenize import ChatInput

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default


SYSTEM_FINGERPRINT = "vllm-sim"  # vLLM: "vllm-<version>-<hash>"; a string either way


class ApiError(Exception):
    """A request vLLM would reject; ``status`` 400 (BadRequestError) or 404 (NotFoundError). ``schema``: the
    request failed vLLM's pydantic model (wrong type, missing field, not a JSON object), which vLLM reports with
    type ``"Bad Request"``; ``param``: the offending field as vLLM names it (``None`` when it names none)."""

    def __init__(self, status: int, message: str, param: str | None = None, schema: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.schema = schema

    @property
    def type(self) -> str:
        if self.schema:
            return "Bad Request"
        return {400: "BadRequestError", 404: "NotFoundError"}.get(self.status, "InternalServerError")


def error_body(err: ApiError) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` JSON."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.status}}


@dataclass(frozen=True, slots=True)
class GenParams:
    """Request fields that decide scheduling and the output, validated."""

    model: str
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    cache_salt: str | None


def _opt_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}, got {value!r}.", param=None if key == "n" else key)
    return value


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be a boolean, got {value!r}")
    return value


def _cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's cache_salt rules: a non-empty string of at most 128 characters without ``@ / \\`` or NUL."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise ApiError(400, "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if len(salt) > 128 or any(c in salt for c in "@/\\\0"):
        raise ApiError(
            400, "Parameter 'cache_salt' must be at most 128 characters and contain no '@', '/', '\\' or NUL."
        )
    return salt


def truncate(ids: list[int], body: dict[str, Any], max_model_len: int) -> list[int]:
    """vLLM's ``truncate_prompt_tokens`` (k >= 1, or -1 for max_model_len) and ``truncation_side``."""
    k = body.get("truncate_prompt_tokens")
    if k is None:
        return ids
    if isinstance(k, bool) or not isinstance(k, int) or (k < 1 and k != -1):
        raise ApiError(400, "truncate_prompt_tokens must be -1 or a positive integer")
    k = max_model_len if k == -1 else k
    side = body.get("truncation_side") or "left"
    if side not in ("left", "right"):
        raise ApiError(400, "truncation_side must be 'left' or 'right'")
    if len(ids) <= k:
        return ids
    return ids[-k:] if side == "left" else ids[:k]


def parse_gen_params(body: dict[str, Any], default_model: str, chat: bool) -> GenParams:
    """Validate the fields shared by both endpoints; raises ApiError(400)."""
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string")
    max_tokens = _opt_int(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1)
    if max_tokens is None and not chat:
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    if _opt_int(body, "n", 1) not in (None, 1):  # vLLM serves n > 1; the simulator does not
        raise ApiError(400, "vllm-sim supports n=1 only")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise ApiError(400, "Stream options can only be defined when `stream=True`.")
    salt = _cache_salt(body)
    return GenParams(
        model=model,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(body, "ignore_eos", False),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        cache_salt=salt,
    )


def parse_chat_input(body: dict[str, Any]) -> ChatInput:
    """The tokenization-relevant fields of a chat request; raises ApiError(400)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ApiError(400, "each message must be an object with a string 'role'")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ApiError(400, "chat_template_kwargs must be an object")
    add_gen = _bool(body, "add_generation_prompt", True)
    cont = _bool(body, "continue_final_message", False)
    if add_gen and cont:
        raise ApiError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    template = body.get("chat_template")
    tools = body.get("tools")
    return ChatInput(
        messages=messages,
        add_generation_prompt=add_gen,
        continue_final_message=cont,
        add_special_tokens=_bool(body, "add_special_tokens", False),
        chat_template=template if isinstance(template, str) else None,
        chat_template_kwargs=kwargs,
        tools=tools if isinstance(tools, list) else None,
    )


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """Completion prompts: a text, token ids, or a list of texts / token-id lists; raises ApiError(400)."""
    prompt = body.get("prompt")
    if prompt is None or prompt in ("", []):
        raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(prompt, str) or (_is_ids(prompt) and prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        return list(prompt)
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of those", param="prompt")


def check_prompt_len(num_tokens: int, max_model_len: int) -> None:
    """vLLM's length checks; raises ApiError(400). A ``max_tokens`` that does not fit beside the prompt is not
    an error: vLLM 0.32 lowers it to what fits (``resolve_output_len``)."""
    if num_tokens == 0:
        raise ApiError(400, "The decoder prompt cannot be empty")
    if num_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{num_tokens} input tokens, which exceeds this limit even without any output tokens.",
            param="input_tokens",
        )


def resolve_output_len(params: GenParams, prompt_len: int, max_model_len: int, natural_len: int) -> tuple[int, bool]:
    """How many tokens to generate, and whether the last is EOS (finish "stop") rather than a length cut."""
    cap = max_model_len - prompt_len
    limit = cap if params.max_tokens is None else min(params.max_tokens, cap)
    if params.ignore_eos:
        return limit, False
    natural = max(natural_len, params.min_tokens)
    return (natural, True) if natural <= limit else (limit, False)


def usage(prompt: int, completion: int, cached: int, details: bool, created: int | None) -> dict[str, Any]:
    """vLLM 0.32's ``UsageInfo``: with ``--enable-prompt-tokens-details``, ``prompt_tokens_details`` always
    (``cached_tokens`` 0 on a miss); ``created_cache_tokens`` (prompt tokens newly written to the prefix cache)
    is filled on chat only, ``None`` on completions. Streamed usage drops the ``None`` fields (``compact``)."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": (
            {"cached_tokens": cached, "created_cache_tokens": created, "multimodal_tokens": None} if details else None
        ),
        "completion_tokens_details": None,
    }


def compact(use: dict[str, Any]) -> dict[str, Any]:
    """A usage object as vLLM streams it: ``None`` fields left out (top level and in the details)."""
    out = {k: v for k, v in use.items() if v is not None}
    if isinstance(out.get("prompt_tokens_details"), dict):
        out["prompt_tokens_details"] = {k: v for k, v in out["prompt_tokens_details"].items() if v is not None}
    return out


def completion_choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
    """One choice of a non-streaming ``/v1/completions`` response (one per prompt)."""
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def completion_body(rid: str, model: str, choices: list[dict[str, Any]], use: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming ``/v1/completions`` response."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": use,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_body(rid: str, model: str, text: str, finish: str | None, use: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming ``/v1/chat/completions`` response."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None,
              "token_ids": None, "routed_experts": None}  # fmt: skip
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": use,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


@dataclass(frozen=True, slots=True)
class StreamHead:
    """What every chunk of one SSE response repeats."""

    rid: str
    model: str
    created: int
    chat: bool

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def stream_chunk(head: StreamHead, index: int, text: str | None, finish: str | None) -> dict[str, Any]:
    """One SSE chunk for choice ``index``, shaped as vLLM 0.32 streams it. ``text=None`` on a chat stream is the
    opening role-only delta (which alone carries ``prompt_token_ids`` / ``prompt_text`` at the top level)."""
    top: dict[str, Any] = {}
    if head.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        if text is None:
            top = {"prompt_token_ids": None, "prompt_text": None}
        else:
            choice["token_ids"] = None
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish, "stop_reason": None,
                  "prompt_token_ids": None, "token_ids": None}  # fmt: skip
    head_fields = {"id": head.rid, "object": head.object, "created": head.created, "model": head.model}
    return {**head_fields, "choices": [choice], **top}


def usage_chunk(head: StreamHead, use: dict[str, Any]) -> dict[str, Any]:
    """The final ``choices: []`` chunk sent with ``stream_options.include_usage``."""
    return {"id": head.rid, "object": head.object, "created": head.created, "model": head.model, "choices": [],
            "usage": compact(use), "system_fingerprint": SYSTEM_FINGERPRINT}  # fmt: skip
