"""``POST /v1/completions`` and ``POST /v1/chat/completions``: validate, tokenize, run on the engine, respond.

Streaming writes one SSE chunk per delta the engine delivered since the last write (tokens coalesce when the
client lags), then the optional usage chunk and ``data: [DONE]``. A client that disconnects aborts its
request,
which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from vllm_sim.engine import Engine
from vllm_sim.frontend import Frontend, error_response, json_response, read_json
from vllm_sim.openai_api import (
    ApiError,
    GenParams,
    chat_body,
    check_prompt_len,
    completion_body,
    parse_gen_params,
    resolve_output_len,
    stream_chunk,
    usage,
    usage_chunk,
)
from vllm_sim.request import FINISH_ABORT, OutputStream, SimRequest

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class GenerateHandlers:
    """The two generation endpoints of one server."""

    def __init__(self, frontend: Frontend, engine: Engine) -> None:
        self._fe = frontend
        self._engine = engine
        self._cfg = frontend.cfg

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def _prepare(self, request: web.Request, chat: bool) -> tuple[GenParams, SimRequest]:
        # Arrival is when the request reached us: tokenizing it overlaps the modelled GPU time (as vLLM's
        # frontend overlaps the engine), so the simulator's own CPU work does not add to the model's TTFT.
        arrival_s = asyncio.get_running_loop().time()
        body = await read_json(request)
        params = parse_gen_params(body, self._cfg.model_name, chat)
        lora = self._fe.resolve_model(params.model)
        ids = await self._fe.prompt_ids(body, chat)
        max_len = self._cfg.engine.max_model_len
        check_prompt_len(len(ids), params.max_tokens, max_len)
        out_len, eos = resolve_output_len(params, len(ids), max_len, self._cfg.sim.output_len)
        req = SimRequest(
            request_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            prompt_token_ids=ids,
            output_len=out_len,
            eos_at_end=eos,
            lora=lora,
            cache_salt=params.cache_salt,
            arrival_s=arrival_s,
            sink=OutputStream(wake_every=self._cfg.stream_interval if params.stream else 0),
            filler=self._fe.filler,
            eos_token_id=self._fe.tokenizer.eos_token_id,
        )
        return params, req

    async def _handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            params, req = await self._prepare(request, chat)
        except ApiError as err:
            return error_response(err)
        self._engine.submit(req)
        try:
            if params.stream:
                return await self._stream(request, req, params, chat)
            tokens: list[int] = []
            finish = None
            while finish is None:
                delta, finish = await req.sink.next_delta()
                tokens.extend(delta)
            if finish == FINISH_ABORT:
                return error_response(ApiError(500, "the simulated engine failed; see the server log"))
            body = chat_body if chat else completion_body
            return json_response(
                body(
                    req.request_id,
                    params.model,
                    self._fe.text_of(tokens),
                    req.finish_reason,
                    self._usage(req),
                )
            )
        finally:
            if req.finish_reason is None:
                self._engine.abort(req)

    def _usage(self, req: SimRequest) -> dict[str, Any]:
        return usage(
            len(req.prompt_token_ids),
            req.num_output_tokens,
            max(req.num_cached_tokens, 0),
            self._cfg.enable_prompt_tokens_details,
        )

    async def _stream(self, request: web.Request, req: SimRequest, params: GenParams, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        created, rid, model = int(time.time()), req.request_id, params.model
        if chat:
            await _sse(resp, stream_chunk(rid, model, created, True, None, None))
        while True:
            delta, finish = await req.sink.next_delta()
            await _sse(resp, stream_chunk(rid, model, created, chat, self._fe.text_of(delta), finish))
            if finish is not None:
                break
        if params.include_usage:
            await _sse(resp, usage_chunk(rid, model, created, chat, self._usage(req)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _sse(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    await resp.write(b"data: " + msgspec.json.encode(obj) + b"\n\n")
