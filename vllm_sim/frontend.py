"""Request-side helpers shared by the HTTP handlers: JSON in/out, model resolution, prompt → token ids."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from aiohttp import web

from vllm_sim.config import ServerConfig
from vllm_sim.hashing import LoraKey
from vllm_sim.openai_api import ApiError, error_body, parse_chat_input, parse_prompts, truncate
from vllm_sim.tokenize import PromptTokenizer, TemplateError
from vllm_sim.validate import schema_error

FILLER_TEXT = " The quick brown fox jumps over the lazy dog."
_json_decoder = msgspec.json.Decoder()


def json_response(obj: Any, status: int = 200) -> web.Response:
    """A JSON response encoded with msgspec (fast, compact)."""
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    return json_response(error_body(err), status=err.status)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; raises ApiError(400) otherwise (deep nesting too)."""
    raw = await request.read()
    if not raw.strip():
        raise schema_error("", "Field required")
    try:
        body = _json_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        body = _other_encoding(raw, exc)
    except RecursionError:  # nesting deeper than the decoder's stack: still the client's bad JSON
        raise schema_error("", "JSON decode error: nested too deeply") from None
    if not isinstance(body, dict):
        raise schema_error("", "Input should be a valid dictionary or object to extract fields from")
    return body


def _other_encoding(raw: bytes, exc: Exception) -> Any:
    """vLLM parses the body with ``json.loads`` on bytes (Starlette), which also reads UTF-16, UTF-32 and a UTF-8
    BOM (detected as the JSON RFC says); msgspec reads plain UTF-8 only, so retry there. Raises the schema error
    for anything that is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        pass
    raise schema_error("", f"JSON decode error: {exc}") from None


class Frontend:
    """Model names, LoRA adapters, tokenization and the filler tokens of one server."""

    def __init__(self, cfg: ServerConfig, tokenizer: PromptTokenizer) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self._loras = {lora.name: lora for lora in cfg.lora_modules}
        self.filler = tuple(tokenizer.encode_plain(FILLER_TEXT))
        self.pieces = {t: tokenizer.decode([t]) for t in self.filler}
        self.pieces[tokenizer.eos_token_id] = ""

    def resolve_model(self, name: str) -> LoraKey | None:
        """None for a base-model name, the adapter for a LoRA name; raises ApiError(404) for anything else."""
        if name in self.cfg.served_model_names:
            return None
        lora = self._loras.get(name)
        if lora is None:
            raise ApiError(404, f"The model `{name}` does not exist.", param="model")
        return lora

    def text_of(self, token_ids: list[int]) -> str:
        """Detokenized text of generated (filler/EOS) tokens."""
        pieces = self.pieces
        return "".join([pieces.get(t, "") for t in token_ids])

    def _check_ids(self, ids: list[int]) -> list[int]:
        vocab = self.tokenizer.vocab_size
        for t in ids:
            if t < 0 or t >= vocab:
                raise ApiError(400, f"Token id {t} is out of vocabulary")
        return ids

    async def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[list[int]]:
        """Token ids of each prompt of a chat (one) or completion body, exactly as vLLM renders them.

        ``truncate_prompt_tokens`` / ``truncation_side`` apply after tokenization, as in vLLM.
        Raises ApiError(400) for malformed prompts, template errors and out-of-vocabulary ids.
        """
        try:
            max_len = self.cfg.engine.max_model_len
            if chat:
                return [truncate(await self.tokenizer.chat(parse_chat_input(body)), body, max_len)]
            add_special = body.get("add_special_tokens", True) is not False
            out: list[list[int]] = []
            for prompt in parse_prompts(body):
                if isinstance(prompt, list):
                    out.append(truncate(self._check_ids(prompt), body, max_len))
                else:
                    out.append(truncate(await self.tokenizer.completion(prompt, add_special), body, max_len))
            return out
        except TemplateError as exc:
            raise ApiError(400, f"Chat template error: {exc}") from None
