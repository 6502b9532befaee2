"""K simulated servers in one event loop, sharing one tokenizer, one tokenizer thread and one ZMQ context.

Embedding API for tests and tools::

    async with SimCluster(config, n=2) as cluster:
        urls = cluster.urls          # server i listens on config.port + i (or a free port when port is 0)
        ...

Server ``i`` gets ``config.for_index(i)``: HTTP port + i, KV-event endpoint and replay endpoint offset by i.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import zmq.asyncio

from vllm_sim.config import ServerConfig
from vllm_sim.server import SimServer
from vllm_sim.tokenize import PromptTokenizer, TokenCache


class SimCluster:
    """Owns every server it starts; :meth:`stop` (or leaving the ``async with``) releases all of them."""

    def __init__(self, config: ServerConfig, n: int = 1, tokenizer: PromptTokenizer | None = None) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.config = config
        self.n = n
        self._tokenizer = tokenizer
        self._executor: ThreadPoolExecutor | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self.servers: list[SimServer] = []

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    async def start(self) -> None:
        """Load the tokenizer (off the loop), then start server 0..n-1 in order."""
        if self._tokenizer is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-sim-tok")
            loop = asyncio.get_running_loop()
            cache = TokenCache(self.config.sim.token_cache_tokens)
            self._tokenizer = await loop.run_in_executor(
                self._executor, PromptTokenizer, self.config.tokenizer, self._executor, cache
            )
        self._ctx = zmq.asyncio.Context()
        try:
            for i in range(self.n):
                server = SimServer(self.config.for_index(i), self._tokenizer, self._ctx)
                await server.start()
                self.servers.append(server)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every started server, close the ZMQ context and the tokenizer thread. Idempotent."""
        for server in reversed(self.servers):
            await server.stop()
        self.servers = []
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
