"""One simulated vLLM server: its aiohttp app, engine, metrics and KV-event publisher, and their lifecycle.

Routes (vLLM 0.33 paths): ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``,
``/metrics``, ``/tokenize``, ``/v1/completions/render``, ``/v1/chat/completions/render``,
``/kv_event_sources``,
``/reset_prefix_cache``; and the simulator-only ``GET /sim/requests?ids=a,b`` (model-side timings).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import zmq.asyncio
from aiohttp import web

from vllm_sim.config import ServerConfig
from vllm_sim.engine import Engine
from vllm_sim.events import EventEncoder
from vllm_sim.frontend import Frontend, error_response, json_response, read_json
from vllm_sim.generate import GenerateHandlers
from vllm_sim.metrics import CONTENT_TYPE, ServerMetrics
from vllm_sim.openai_api import ApiError, GenParams, check_prompt_len, parse_gen_params
from vllm_sim.publisher import ZmqEventPublisher
from vllm_sim.tokenize import PromptTokenizer

STOP_GRACE_S = 1.0  # on stop, in-flight requests get this long before their connections are closed


class SimServer:
    """A vLLM look-alike on one port. ``await start()`` inside a running loop; ``await stop()`` to release all."""

    def __init__(self, cfg: ServerConfig, tokenizer: PromptTokenizer, zmq_ctx: zmq.asyncio.Context) -> None:
        self.cfg = cfg
        self.publisher: ZmqEventPublisher | None = None
        if cfg.kv_events.active:
            encoder = EventEncoder(cfg.sim.use_int_block_hashes, cfg.sim.legacy_events)
            self.publisher = ZmqEventPublisher(
                cfg.kv_events, encoder, zmq_ctx, cfg.sim.kv_events_bind, legacy_replay=cfg.sim.legacy_events
            )
        self.engine = Engine(cfg.engine, cfg.timing, events=self.publisher)
        self.metrics = ServerMetrics(cfg, self.engine)
        self.engine.set_observer(self.metrics)
        self.frontend = Frontend(cfg, tokenizer)
        self._gen = GenerateHandlers(self.frontend, self.engine)
        self._created = int(time.time())
        self._runner: web.AppRunner | None = None
        self.port = cfg.port

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def build_app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._gen.completions)
        app.router.add_post("/v1/chat/completions", self._gen.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/metrics/{below:.*}", self.metrics_mount)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions/render", self.render_completion)
        app.router.add_post("/v1/chat/completions/render", self.render_chat)
        app.router.add_get("/kv_event_sources", self.kv_event_sources)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/sim/requests", self.sim_requests)
        return app

    async def start(self) -> None:
        """Start the publisher, the engine loop and the HTTP listener (port 0 picks a free port)."""
        if self.publisher is not None:
            self.publisher.start()
        self.engine.start()
        # handler_cancellation: a client that goes away cancels its handler, which aborts its request (as vLLM)
        self._runner = web.AppRunner(
            self.build_app(),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=STOP_GRACE_S,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    async def stop(self) -> None:
        """Stop listening, stop the engine, close the sockets."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.engine.stop()
        if self._gen.sidecar is not None:
            await self._gen.sidecar.close()
        if self.publisher is not None:
            await self.publisher.close()

    # --- small endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.engine.healthy else 500)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        """vLLM's ``GET /metrics`` (the request-metrics instrumentator's route): the whole page, any query ignored."""
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def metrics_mount(self, request: web.Request) -> web.Response:
        """Any path below ``/metrics/`` (vLLM mounts prometheus_client's exposition app there): the samples named
        by the ``name[]`` query parameters, or the whole page without any."""
        names = request.query.getall("name[]", [])
        return web.Response(body=self.metrics.render(names), headers={"Content-Type": CONTENT_TYPE})

    def _model_card(self, name: str, root: str, parent: str | None) -> dict[str, Any]:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": self._created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": self.cfg.engine.max_model_len if parent is None else None,
            "permission": [permission],
        }

    async def models(self, request: web.Request) -> web.Response:
        """Served names (root = the model) and LoRA adapters (root = their path, parent = the base name)."""
        cards = [self._model_card(n, self.cfg.model, None) for n in self.cfg.served_model_names]
        cards += [self._model_card(a.name, a.path, self.cfg.model_name) for a in self.cfg.lora_modules]
        return json_response({"object": "list", "data": cards})

    async def kv_event_sources(self, request: web.Request) -> web.Response:
        """vLLM ≥ 0.31: ``{dp_rank: KVEventsConfig}`` with the resolved endpoints."""
        cfg = self.cfg.kv_events.as_dict()
        if self.publisher is not None:
            cfg["endpoint"] = self.publisher.endpoint
            cfg["replay_endpoint"] = self.publisher.replay_endpoint
        return json_response({"0": cfg})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """Reset the prefix cache (``?reset_running_requests=true`` preempts running requests first)."""
        force = request.query.get("reset_running_requests", "false").lower() == "true"
        self.engine.reset_prefix_cache(reset_running_requests=force)
        return web.Response(status=200)

    async def sim_requests(self, request: web.Request) -> web.Response:
        """Simulator-only: the model's own timings for the given response ids (comma-separated)."""
        ids = [i for i in request.query.get("ids", "").split(",") if i]
        return json_response(self.engine.records(ids))

    # --- tokenization endpoints

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/tokenize`` for completion-shaped (``prompt``) or chat-shaped (``messages``) bodies."""
        try:
            body = await read_json(request)
            self.frontend.resolve_model(body.get("model") or self.cfg.model_name)
            prompts = await self.frontend.prompt_ids(body, "messages" in body)
            if len(prompts) != 1:
                raise ApiError(400, "/tokenize takes one prompt")
        except ApiError as err:
            return error_response(err)
        ids = prompts[0]
        return json_response(
            {
                "count": len(ids),
                "max_model_len": self.cfg.engine.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def _render(self, request: web.Request, chat: bool) -> web.Response:
        try:
            body = await read_json(request)
            params = parse_gen_params(body, self.cfg.model_name, chat)
            self.frontend.resolve_model(params.model)
            prompts = await self.frontend.prompt_ids(body, chat)
            for ids in prompts:
                check_prompt_len(len(ids), self.cfg.engine.max_model_len)
        except ApiError as err:
            return error_response(err)
        rendered = [self._generate_request(ids, params, chat) for ids in prompts]
        return json_response(rendered[0] if chat else rendered)

    @staticmethod
    def _generate_request(ids: list[int], params: GenParams, chat: bool) -> dict[str, Any]:
        """The render endpoints' answer for one prompt (vLLM's ``GenerateRequest``, approximately)."""
        return {
            "request_id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            "token_ids": ids,
            "features": None,
            "sampling_params": {
                "max_tokens": params.max_tokens,
                "min_tokens": params.min_tokens,
                "ignore_eos": params.ignore_eos,
            },
            "model": params.model,
            "stream": params.stream,
            "cache_salt": params.cache_salt,
            "priority": 0,
            "kv_transfer_params": None,
        }

    async def render_completion(self, request: web.Request) -> web.Response:
        return await self._render(request, chat=False)

    async def render_chat(self, request: web.Request) -> web.Response:
        return await self._render(request, chat=True)
