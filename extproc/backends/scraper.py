"""Background scraping of each endpoint's ``/metrics`` (load) and ``/v1/models`` (what it serves).

One ticker, owned by ``Scraper``, starts a round each interval: every endpoint's loop (one long-lived task per
endpoint, not a task per scrape) sends its request, and an endpoint whose last scrape is still running sits
that round out, so a slow one never delays the others. One timer for all endpoints, not one per endpoint: on
this kind of VM a wake-up of the process after a sleep costs ~0.2 ms of CPU, about what reading a page costs.
The ticker is a timer callback, not a task: a round is synchronous, and a sleeping task took a future, a task
step and one more turn of the event loop per round.

Answers from plain-http endpoints at IP addresses (the common case) are read without waiting for them
(``deferred_reads``, on by default): a round first collects what arrived for the last one, then sends, on sockets
the event loop does not watch; ``collect_answers`` reads what arrived since (called once a request's headers are
answered, in the round trip before its body, and again before each decision, which then finds little). A
decision sees the same load as if every answer had been read on arrival; the process is woken once per round
instead of once per answer, and an answer costs no future, task step or protocol callback
(``bench/results/scrape-cost``). (Holding the answers in asyncio transports and reading them on a timer 20 ms
into the round saved nothing: the timer's wake-up cost what the answers' did. Here no wake-up is added.) Other
endpoints' answers are awaited by their loop.

A page that repeats the endpoint's last one byte for byte (an idle engine's, or a busy one's between changes of
its gauges) is not parsed again: its last reading is reused (``_parsed``).

Pages are read narrowed (``vllm_metrics.narrow_url``: only the samples we parse, ~15x smaller on vLLM and ~5x
cheaper for the engine to write) unless ``narrow_pages`` is off. An endpoint whose narrowed read is refused
(an HTTP status) or lacks the load gauges, while its whole page reads fine, is read whole from then on (logged
once); when both fail, it is an ordinary failure and the narrowed read is tried again next round.

``on_round`` is called at the start of each round, in the wake-up the round costs anyway: the KV-event
subscriber reads the messages that arrived since the last round there (``SubscriberOptions.paced``).

Each call has a timeout; failures are logged once per change of state, never raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping

import aiohttp

from extproc.backends.http_get import (
    GetFailed,
    GetStatus,
    GetUnreachable,
    HttpGetter,
    IdleConnectionLost,
    PolledGetter,
    parse_http_url,
    polled_target,
)
from extproc.backends.registry import EndpointRegistry
from extproc.backends.vllm_metrics import EngineMetrics, MetricsParseError, narrow_url, parse_metrics
from extproc.tasks import stop_task
from extproc.types import EndpointId

log = logging.getLogger(__name__)

# What a server that does not serve the narrowed page answers it with (then its whole page decides).
_NARROWED_REFUSED = (GetStatus, aiohttp.ClientResponseError, MetricsParseError)


class Scraper:
    """Keeps ``registry`` fresh. ``urls`` maps each endpoint to its base URL (``http://ip:port``)."""

    def __init__(
        self,
        registry: EndpointRegistry,
        urls: Mapping[EndpointId, str],
        *,
        interval_s: float,
        timeout_s: float,
        discover_interval_s: float,
        on_send: Callable[[EndpointId], None] | None = None,
        on_scrape: Callable[[EndpointId], None] | None = None,
        metrics_urls: Mapping[EndpointId, str] | None = None,
        on_down: Callable[[EndpointId], None] | None = None,
        on_round: Callable[[], None] | None = None,
        narrow_pages: bool = True,
        deferred_reads: bool = True,
    ) -> None:
        self._registry = registry
        self._urls: dict[EndpointId, str] = {}
        self._metrics_urls: dict[EndpointId, str] = {}  # the whole page's URL
        self._narrow_pages = narrow_pages
        self._narrow_urls: dict[EndpointId, str] = {}  # the narrowed page's URL, while the endpoint honours it
        self._trying_whole: dict[EndpointId, str] = {}  # narrowed read refused (why): the whole page's is out
        self._deferred_reads = deferred_reads
        self._polled_ids: set[EndpointId] = set()  # endpoints whose answers are collected, not awaited
        self._polled: dict[str, PolledGetter] = {}  # {metrics URL: its client}
        self._turns: dict[EndpointId, asyncio.Event] = {}  # a polled endpoint's loop is needed (see _poll_round)
        self._awaited: set[EndpointId] = set()  # polled endpoints with a GET out: what a decision may collect
        self._discovered: dict[EndpointId, int] = {}  # the round of each endpoint's last discovery
        self._last_page: dict[EndpointId, tuple[bytes, EngineMetrics]] = {}  # each one's last page, as parsed
        for eid, url in urls.items():
            self._add(eid, url, (metrics_urls or {}).get(eid) or f"{url}/metrics")
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._timeout_s = timeout_s
        self._discover_every = max(1, round(discover_interval_s / interval_s))
        self._on_send = on_send  # called as a metrics request goes out (the page shows what was routed before)
        self._on_scrape = on_scrape
        self._on_down = on_down  # called once when an endpoint turns unhealthy (its engine died or restarts)
        self._on_round = on_round  # called at each round's start, in the wake-up it costs (KvEventSubscriber.pace)
        self._loops: dict[EndpointId, asyncio.Task[None]] = {}  # one per endpoint, for its lifetime here
        self._round = asyncio.Event()  # set when a round starts; replaced by a fresh one for the next
        self._rounds = 0  # rounds started
        self._leaving: set[asyncio.Task[None]] = set()  # loops of endpoints set_targets removed, until they end
        self._ticker: asyncio.Handle | None = None  # the next round, once started
        self._session: aiohttp.ClientSession | None = None
        self._getters: dict[str, HttpGetter] = {}  # {plain-http metrics URL: its lean client}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        self._ticker = asyncio.get_running_loop().call_soon(self._tick)

    def set_targets(self, urls: Mapping[EndpointId, str]) -> None:
        """Scrape exactly ``urls`` from now on (discovery): loops start for new endpoints and stop for gone
        ones. Metrics are read at ``<url>/metrics``, except for endpoints given a metrics URL at construction."""
        for eid in set(self._urls) - set(urls):
            task = self._loops.pop(eid, None)
            if task is not None:
                task.cancel()
                self._leaving.add(task)  # stop() still awaits it; it ends itself too (it no longer owns eid)
                task.add_done_callback(self._leaving.discard)
            for page in (self._narrow_urls.pop(eid, None), self._metrics_urls.get(eid), _models_url(self._urls[eid])):
                self._close_getter(page)
            self._trying_whole.pop(eid, None)
            self._polled_ids.discard(eid)
            self._turns.pop(eid, None)
            self._discovered.pop(eid, None)
            self._awaited.discard(eid)
            self._last_page.pop(eid, None)
            del self._urls[eid]
        for eid, url in urls.items():
            if eid not in self._urls:
                self._add(eid, url, self._metrics_urls.get(eid) or f"{url}/metrics")

    def _add(self, eid: EndpointId, url: str, metrics_url: str) -> None:
        self._urls[eid] = url
        self._metrics_urls[eid] = metrics_url
        narrowed = narrow_url(metrics_url) if self._narrow_pages else None
        if narrowed is not None:
            self._narrow_urls[eid] = narrowed
        if self._deferred_reads and polled_target(metrics_url) is not None:
            self._polled_ids.add(eid)

    def _close_getter(self, url: str | None) -> None:
        if url is None:
            return
        getter = self._getters.pop(url, None)
        if getter is not None:
            getter.close()
        polled = self._polled.pop(url, None)
        if polled is not None:
            polled.close()

    async def stop(self) -> None:
        """Stop the ticker and every endpoint's loop (awaited), close the connections."""
        if self._ticker is not None:
            self._ticker.cancel()
        tasks = [*self._loops.values(), *self._leaving]
        for task in tasks:
            task.cancel()
        for task in tasks:
            await stop_task(task)
        for url in [*self._getters, *self._polled]:
            self._close_getter(url)
        if self._session:
            await self._session.close()

    async def scrape_once(self, eid: EndpointId, *, discover: bool) -> None:
        """One metrics read (and optionally one models read) of ``eid``; updates the registry. Not while
        ``eid``'s own loop runs (one scrape in flight per endpoint: ``on_send`` marks what its answer shows).
        A deferred read (module docstring) applies the last answer, if it is in, and sends the next request."""
        if discover:
            await self._discover(eid)
        if eid in self._polled_ids:
            self._collect(eid)
            await self._send(eid)
            return
        if self._on_send:
            self._on_send(eid)
        taken_at_s = time.monotonic()  # the clock of the app's registry and of the polled getters
        try:
            metrics = await self._read(eid)
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, GetUnreachable) as exc:
            self._fail(eid, exc, unreachable=True)
            return
        except (aiohttp.ClientError, TimeoutError, GetFailed, MetricsParseError, UnicodeDecodeError) as exc:
            self._fail(eid, exc, unreachable=False)
            return
        self._apply(eid, metrics, taken_at_s)

    def collect_answers(self) -> None:
        """Apply every deferred answer that has arrived (never waits): called before each decision, which then
        sees the load as if each answer had been read the moment it came. Costs a look at the endpoints with a
        GET out, not at the fleet: after the first decision of a round has collected, the next find nothing."""
        for eid in list(self._awaited):  # (a failure's on_down may change the targets)
            self._safely(self._collect, eid)

    def _safely(self, step: Callable[..., None], *args: EndpointId) -> None:
        """``step(*args)``, logging a bug instead of raising it: it must stop neither the ticker (which nothing
        restarts) nor a decision."""
        try:
            step(*args)
        except Exception:
            log.exception("scrape step %s%s failed", getattr(step, "__name__", step), args)

    def _apply(self, eid: EndpointId, metrics: EngineMetrics, taken_at_s: float | None) -> None:
        """Record ``eid``'s page, taken (its GET sent) at ``taken_at_s``."""
        state = self._registry.snapshot().get(eid)
        was_failing = state is not None and state.failures > 0
        self._registry.scraped(eid, metrics, taken_at_s)
        if was_failing:
            log.info("metrics of %s readable again", eid)
        if self._on_scrape:
            self._on_scrape(eid)

    def _page(self, eid: EndpointId) -> tuple[str, bool]:
        """The URL ``eid`` is read at now, and whether it is the narrowed page."""
        narrowed = self._narrow_urls.get(eid)
        if narrowed is None or eid in self._trying_whole:
            return self._metrics_urls[eid], False
        return narrowed, True

    async def _send(self, eid: EndpointId) -> None:
        """Send ``eid``'s next deferred read (connecting first if needed), unless its last one is still out (it
        sits the round out)."""
        url, _ = self._page(eid)
        getter = self._polled.get(url)
        if getter is None:
            target = polled_target(url)
            assert target is not None  # the narrowed URL has the whole one's host
            getter = self._polled[url] = PolledGetter(*target, timeout_s=self._timeout_s)
        if getter.busy:
            return
        try:
            await getter.ready()
        except GetFailed as exc:
            self._get_failed(eid, exc)
            return
        if self._polled.get(url) is not getter:  # eid was removed, or widened, while connecting
            getter.close()
        elif not getter.busy:  # (the round may have sent meanwhile)
            self._send_now(eid, getter)

    def _send_now(self, eid: EndpointId, getter: PolledGetter) -> None:
        if self._on_send:
            self._on_send(eid)
        try:
            getter.send()
        except GetFailed as exc:
            self._get_failed(eid, exc)
        else:
            self._awaited.add(eid)

    def _get_failed(self, eid: EndpointId, exc: GetFailed) -> None:
        self._fail(eid, exc, unreachable=isinstance(exc, GetUnreachable))

    def _poll_round(self) -> None:
        """A round of deferred reads, in the ticker's own wake-up: each polled endpoint's answer is collected and
        its next GET sent; an endpoint that needs a discovery or a new connection gets its loop's turn instead."""
        for eid in list(self._polled_ids):
            self._safely(self._collect, eid)
            self._safely(self._send_or_hand_over, eid)

    def _send_or_hand_over(self, eid: EndpointId) -> None:
        if eid not in self._polled_ids:  # removed by the collect's failure
            return
        getter = self._polled.get(self._page(eid)[0])
        if getter is None or not getter.connected or self._discovery_due(eid):
            self._turns.setdefault(eid, asyncio.Event()).set()
        elif not getter.busy:
            self._send_now(eid, getter)

    def _discovery_due(self, eid: EndpointId) -> bool:
        last = self._discovered.get(eid)
        return last is None or self._rounds - last >= self._discover_every

    def _collect(self, eid: EndpointId) -> None:
        """Apply ``eid``'s deferred answer if it is in; a failure is recorded, a refused narrowed page has the
        whole page read next (whose answer then decides, as ``_read`` decides at once)."""
        if eid not in self._polled_ids:  # removed meanwhile
            return
        url, narrowed = self._page(eid)
        getter = self._polled.get(url)
        if getter is None or not getter.busy:
            self._awaited.discard(eid)
            return
        taken_at_s = getter.sent_at_s  # (collecting the answer clears it)
        try:
            body = getter.collect()
            if body is None:
                return
            metrics = self._parsed(eid, body)
        except IdleConnectionLost:
            return  # the server dropped the idle kept-alive connection: the next round asks on a new one
        except (GetFailed, MetricsParseError, UnicodeDecodeError) as exc:
            if narrowed and isinstance(exc, _NARROWED_REFUSED):
                self._trying_whole[eid] = f"{type(exc).__name__}: {exc}"
            else:
                self._trying_whole.pop(eid, None)  # the whole page failed too: narrowed again next round
                self._fail(eid, exc, unreachable=isinstance(exc, GetUnreachable))
            return
        finally:
            if not getter.busy:  # answered, or failed: nothing more to collect until the next GET
                self._awaited.discard(eid)
        refused = self._trying_whole.pop(eid, None)
        if refused is not None:
            self._widen(eid, refused)
        self._apply(eid, metrics, taken_at_s)

    def _parsed(self, eid: EndpointId, body: bytes) -> EngineMetrics:
        """``body`` parsed; the last reading again when it is ``eid``'s last page byte for byte. Raises what
        ``parse_metrics`` and decoding raise (a page that failed is not remembered)."""
        last = self._last_page.get(eid)
        if last is not None and last[0] == body:
            return last[1]
        metrics = parse_metrics(body.decode("utf-8"))
        self._last_page[eid] = (body, metrics)
        return metrics

    def _widen(self, eid: EndpointId, refused: str) -> None:
        log.info("%s does not serve a narrowed metrics page (%s); reading its whole page from now on", eid, refused)
        self._close_getter(self._narrow_urls.pop(eid, None))

    async def _read(self, eid: EndpointId) -> EngineMetrics:
        """``eid``'s metrics: from its narrowed page while it honours one, else from the whole page."""
        narrowed = self._narrow_urls.get(eid)
        if narrowed is None:
            return self._parsed(eid, await self._read_page(self._metrics_urls[eid]))
        try:
            return self._parsed(eid, await self._read_page(narrowed))
        except _NARROWED_REFUSED as exc:
            refused = f"{type(exc).__name__}: {exc}"
        metrics = self._parsed(eid, await self._read_page(self._metrics_urls[eid]))  # raises: both failed
        self._widen(eid, refused)
        return metrics

    async def _read_page(self, url: str) -> bytes:
        """The page's body: the lean client for plain http URLs (the common case), aiohttp otherwise."""
        getter = self._getters.get(url)
        if getter is None and (target := parse_http_url(url)) is not None:
            getter = self._getters[url] = HttpGetter(*target, timeout_s=self._timeout_s)
        if getter is not None:
            return await getter.get()
        assert self._session is not None
        async with self._session.get(url) as resp:
            resp.raise_for_status()
            return await resp.read()

    def _fail(self, eid: EndpointId, exc: BaseException, *, unreachable: bool) -> None:
        state = self._registry.snapshot().get(eid)
        if state is not None and state.failures == 0:
            log.warning("scrape of %s failed (%s: %s); its load is unknown", eid, type(exc).__name__, exc)
        self._registry.failed(eid, unreachable=unreachable)
        after = self._registry.snapshot().get(eid)
        if self._on_down and state is not None and state.endpoint.healthy and after and not after.endpoint.healthy:
            self._on_down(eid)

    async def _discover(self, eid: EndpointId) -> None:
        """``/v1/models`` read (by the lean client where the metrics page is) into what ``eid`` serves."""
        try:
            body = json.loads(await self._read_page(_models_url(self._urls[eid])))
            models: set[str] = set()
            adapters: set[str] = set()
            for item in body.get("data", []):
                # vLLM lists LoRA adapters with "parent" = the base model, "root" = the adapter path.
                (adapters if item.get("parent") else models).add(str(item["id"]))
        except (aiohttp.ClientError, TimeoutError, GetFailed, ValueError, KeyError, TypeError, AttributeError):
            return  # the metrics read reports failures; keep what we knew
        self._registry.discovered(eid, frozenset(models), frozenset(adapters))

    def _tick(self) -> None:
        """A round, then the next one ``interval_s`` later (rescheduled first: a bug here must not end them)."""
        self._ticker = asyncio.get_running_loop().call_later(self._interval_s, self._tick)
        self._safely(self._start_round)

    def _start_round(self) -> None:
        for eid in list(self._urls):
            task = self._loops.get(eid)
            if task is None or task.done():
                if task is not None:  # only cancelling it from outside ends a loop; a stray one did
                    log.warning("the scrape loop of %s ended; starting it again", eid)
                self._loops[eid] = asyncio.create_task(self._endpoint_loop(eid), name=f"scrape {eid}")
        started, self._round = self._round, asyncio.Event()
        self._rounds += 1
        self._poll_round()
        if self._on_round is not None:
            self._safely(self._on_round)
        started.set()

    async def _endpoint_loop(self, eid: EndpointId) -> None:
        """Scrapes ``eid`` once per round it is free for, with discovery first when ``discover_interval_s``
        worth of rounds passed since the last; ends when ``eid`` is no longer this loop's. A polled endpoint's
        loop runs only on the turns ``_poll_round`` gives it (discovery, a new connection)."""
        seen = self._rounds - 1  # a loop starts in its first round, not one interval later
        while self._loops.get(eid) is asyncio.current_task():
            if eid in self._polled_ids:
                turn = self._turns.setdefault(eid, asyncio.Event())
                await turn.wait()
                turn.clear()
            elif seen == self._rounds:
                await self._round.wait()
            discover = self._discovery_due(eid)
            if discover:
                self._discovered[eid] = self._rounds
            await self._scrape_safely(eid, discover=discover)
            seen = self._rounds  # rounds begun while this scrape ran are skipped, not made up

    async def _scrape_safely(self, eid: EndpointId, *, discover: bool) -> None:
        try:
            await self.scrape_once(eid, discover=discover)
        except Exception:  # a bug here must not stop scraping
            log.exception("scrape of %s", eid)


def _models_url(url: str) -> str:
    return f"{url}/v1/models"
