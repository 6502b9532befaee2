"""``POST /v1/completions`` and ``POST /v1/chat/completions``: validate, tokenize, run on the engine, respond.

A completion body with several prompts becomes one engine request per prompt (ids ``<id>-0``, ``<id>-1``, ...)
and one choice per prompt, as vLLM does; usage sums over them. Streaming writes one SSE chunk per delta the
engine delivered since the last write (tokens coalesce when the client lags), then the optional usage chunk
and ``data: [DONE]``. A client that disconnects aborts its requests, which frees their KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from aiohttp import web

from vllm_sim import pd
from vllm_sim.engine import Engine
from vllm_sim.frontend import Frontend, error_response, json_response, read_json
from vllm_sim.openai_api import (
    ApiError,
    GenParams,
    StreamHead,
    chat_body,
    check_prompt_len,
    completion_body,
    completion_choice,
    parse_gen_params,
    resolve_output_len,
    stream_chunk,
    usage,
    usage_chunk,
)
from vllm_sim.request import FINISH_ABORT, FINISH_LENGTH, OutputStream, SimRequest
from vllm_sim.validate import check_sampling, check_tool_choice, check_tool_parsing, coerce_fields

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_ENGINE_FAILED = ApiError(500, "the simulated engine failed; see the server log")


class GenerateHandlers:
    """The two generation endpoints of one server."""

    def __init__(self, frontend: Frontend, engine: Engine) -> None:
        self._fe = frontend
        self._engine = engine
        self._cfg = frontend.cfg
        self._engine_id = str(uuid.uuid4())  # NixlConnector's engine id, reported by prefill legs
        self.sidecar = pd.Sidecar() if self._cfg.sim.pd_sidecar else None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def _prepare(self, raw: dict[str, Any], chat: bool) -> tuple[GenParams, str, list[SimRequest]]:
        """Validate and tokenize; returns the params, the response id and one engine request per prompt."""
        # Arrival is when the request reached us: tokenizing it overlaps the modelled GPU time (as vLLM's
        # frontend overlaps the engine), so the simulator's own CPU work does not add to the model's TTFT.
        arrival_s = asyncio.get_running_loop().time()
        body = coerce_fields(raw, chat)
        if chat:
            check_tool_choice(body)
        params = parse_gen_params(body, self._cfg.model_name, chat)
        self._fe.resolve_model(params.model)
        if chat:  # vLLM: the model check, then the tool parser's, then rendering; sampling fields later
            check_tool_parsing(body, self._cfg.tool_parsing)
        check_sampling(body)
        prompts = await self._fe.prompt_ids(body, chat)
        for ids in prompts:
            check_prompt_len(len(ids), self._cfg.engine.max_model_len)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        names = [rid] if len(prompts) == 1 else [f"{rid}-{i}" for i in range(len(prompts))]
        return params, rid, [self._request(n, ids, params, arrival_s) for n, ids in zip(names, prompts, strict=True)]

    def _request(self, request_id: str, ids: list[int], params: GenParams, arrival_s: float) -> SimRequest:
        out_len, eos = resolve_output_len(params, len(ids), self._cfg.engine.max_model_len, self._cfg.sim.output_len)
        return SimRequest(
            request_id=request_id,
            prompt_token_ids=ids,
            output_len=out_len,
            eos_at_end=eos,
            lora=self._fe.resolve_model(params.model),
            cache_salt=params.cache_salt,
            arrival_s=arrival_s,
            sink=OutputStream(wake_every=self._cfg.stream_interval if params.stream else 0),
            filler=self._fe.filler,
            eos_token_id=self._fe.tokenizer.eos_token_id,
        )

    async def _handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await read_json(request)
            prefiller = request.headers.get(pd.PREFILLER_HEADER) if self.sidecar else None
            prefill_cached = None
            if self.sidecar is not None and prefiller:  # llm-d's decode sidecar: the prefill leg first
                kv_params, prefill_cached = await self.sidecar.prefill(prefiller, request.path, body)
                body = pd.decode_leg_body(body, kv_params)
            params, rid, reqs = await self._prepare(body, chat)
            if self._cfg.kv_transfer.active and len(reqs) == 1 and pd.remote_prefill(body) is not None:
                await self._pull_kv(reqs[0])
        except ApiError as err:
            return error_response(err)
        for req in reqs:
            self._engine.submit(req)
        remote_decode = self._cfg.kv_transfer.active and pd.wants_remote_decode(body)
        try:
            if params.stream:
                head = StreamHead(rid, params.model, int(time.time()), chat)
                return await self._stream(request, head, reqs, params, prefill_cached)
            return await self._collect(rid, reqs, params, chat, prefill_cached, remote_decode)
        finally:
            for req in reqs:
                if req.finish_reason is None:
                    self._engine.abort(req)

    async def _pull_kv(self, req: SimRequest) -> None:
        """A decode leg: wait out the KV transfer of the blocks this engine lacks, then hold them as cached."""
        blocks = self._engine.missing_prefix_blocks(req)
        seconds = self._cfg.sim.transfer.seconds(blocks, self._cfg.engine.block_size)
        await asyncio.sleep(seconds * self._cfg.engine.time_scale)
        self._engine.receive_prefix_blocks(req)

    async def _collect(
        self,
        rid: str,
        reqs: list[SimRequest],
        params: GenParams,
        chat: bool,
        prefill_cached: int | None = None,
        remote_decode: bool = False,
    ) -> web.Response:
        """Wait for every request, then answer once (non-streaming). ``prefill_cached``: the sidecar reports the
        prefiller's cached tokens; ``remote_decode``: a prefill leg, whose answer carries the producer params."""
        texts: list[str] = []
        for req in reqs:
            tokens: list[int] = []
            finish = None
            while finish is None:
                delta, finish = await req.sink.next_delta()
                tokens.extend(delta)
            if finish == FINISH_ABORT:
                return error_response(_ENGINE_FAILED)
            texts.append(self._fe.text_of(tokens))
        use = self._usage(reqs, chat, prefill_cached)
        if chat:
            out = chat_body(rid, params.model, texts[0], reqs[0].finish_reason, use)
        else:
            choices = [
                completion_choice(i, t, r.finish_reason) for i, (t, r) in enumerate(zip(texts, reqs, strict=True))
            ]
            out = completion_body(rid, params.model, choices, use)
        if remote_decode and len(reqs) == 1 and reqs[0].finish_reason == FINISH_LENGTH:
            blocks = len(reqs[0].prompt_token_ids) // self._cfg.engine.block_size
            out["kv_transfer_params"] = pd.producer_params(rid, self._engine_id, self._cfg.host, blocks)
        return json_response(out)

    def _usage(self, reqs: list[SimRequest], chat: bool, prefill_cached: int | None = None) -> dict[str, Any]:
        cached = sum(max(r.num_cached_tokens, 0) for r in reqs) if prefill_cached is None else prefill_cached
        block = self._cfg.engine.block_size
        # vLLM 0.32 fills created_cache_tokens on chat only: the prompt's full blocks it wrote to the cache.
        created = sum(max(len(r.prompt_token_ids) // block * block - max(r.num_cached_tokens, 0), 0) for r in reqs)
        return usage(
            sum(len(r.prompt_token_ids) for r in reqs),
            sum(r.num_output_tokens for r in reqs),
            cached,
            self._cfg.enable_prompt_tokens_details,
            created if chat else None,
        )

    async def _stream(
        self,
        request: web.Request,
        head: StreamHead,
        reqs: list[SimRequest],
        params: GenParams,
        prefill_cached: int | None = None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        role_pending = head.chat  # vLLM sends the role-only delta with the first output, i.e. after prefill
        async for index, delta, finish in _deltas(reqs):
            if role_pending:
                await _sse(resp, stream_chunk(head, 0, None, None))
                role_pending = False
            await _sse(resp, stream_chunk(head, index, self._fe.text_of(delta), finish))
        if params.include_usage:
            await _sse(resp, usage_chunk(head, self._usage(reqs, head.chat, prefill_cached)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _deltas(reqs: list[SimRequest]) -> AsyncIterator[tuple[int, list[int], str | None]]:
    """``(choice index, tokens, finish reason)`` as they come, until every request has finished."""
    if len(reqs) == 1:  # the common case, without a task per request
        finish = None
        while finish is None:
            delta, finish = await reqs[0].sink.next_delta()
            yield 0, delta, finish
        return
    queue: asyncio.Queue[tuple[int, list[int], str | None]] = asyncio.Queue()

    async def pump(index: int, sink: OutputStream) -> None:
        finish = None
        while finish is None:
            delta, finish = await sink.next_delta()
            queue.put_nowait((index, delta, finish))

    tasks = [asyncio.create_task(pump(i, r.sink)) for i, r in enumerate(reqs)]
    try:
        for _ in range(len(reqs)):
            item = await queue.get()
            while item[2] is None:
                yield item
                item = await queue.get()
            yield item
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _sse(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    await resp.write(b"data: " + msgspec.json.encode(obj) + b"\n\n")
