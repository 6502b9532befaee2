"""Front workers' pieces with hand-written fakes: the frame stream, the merged ``/metrics``, the socket between
``RemoteDecider`` and ``DeciderServer`` (a real Unix socket), and the router's re-hash on ``SchemeChanged``."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from extproc.decider import Ask, SchemeChanged
from extproc.errors import Overloaded, RouterError
from extproc.types import EndpointId, HashScheme, PassThrough, Route
from extproc.workers import frames
from extproc.workers.decider_server import DeciderServer
from extproc.workers.metrics import MergedMetrics
from extproc.workers.remote import RemoteDecider
from tests.support.router_fakes import A, make_router, post

ASK = Ask("r1", "m", "m", None, 32, HashScheme(), [1, 2])


# -- frames ---------------------------------------------------------------------------------------------------
def test_frames_arrive_whole_and_in_order_however_the_bytes_are_cut() -> None:
    got: list[frames.Frame] = []
    stream = frames.FrameStream(got.append, lambda: None)
    wire = b"".join(frames.encode(f) for f in [("a", 1), ("b", list(range(1000))), ("c",)])
    rng = random.Random(0)
    i = 0
    while i < len(wire):
        step = rng.randint(1, 700)
        stream.data_received(wire[i : i + step])
        i += step
    assert got == [("a", 1), ("b", list(range(1000))), ("c",)]


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_an_oversized_or_malformed_frame_closes_the_connection() -> None:
    for wire in (frames._LENGTH.pack(frames.MAX_FRAME_BYTES + 1), frames._LENGTH.pack(2) + b"N."):
        got: list[frames.Frame] = []
        stream = frames.FrameStream(got.append, lambda: None)
        transport = _Transport()
        stream.connection_made(transport)
        stream.data_received(wire)
        assert transport.closed and not got


# -- merged metrics ------------------------------------------------------------------------------------------
def _front_rows(checks: float, encoder: float) -> frames.MetricRows:
    registry = CollectorRegistry()
    Counter("router_tokenizer_checks", "checks", ["model"], registry=registry).labels("m").inc(checks)
    Gauge("router_tokenizer_encoder", "encoder", ["model"], registry=registry).labels("m").set(encoder)
    return frames.metric_rows([registry])


def test_the_fronts_counters_are_summed_and_their_flags_are_not() -> None:
    own = CollectorRegistry()
    Counter("router_decisions", "decisions", ["reason"], registry=own).labels("cache").inc(5)
    merged = MergedMetrics(own)
    merged.update(0, _front_rows(2, 1))
    merged.update(1, _front_rows(3, 1))
    text = generate_latest(merged).decode()  # type: ignore[arg-type]
    assert 'router_decisions_total{reason="cache"} 5.0' in text
    assert 'router_tokenizer_checks_total{model="m"} 5.0' in text
    assert 'router_tokenizer_encoder{model="m"} 1.0' in text
    merged.forget(1)
    assert 'router_tokenizer_checks_total{model="m"} 2.0' in generate_latest(merged).decode()  # type: ignore[arg-type]


# -- the socket ----------------------------------------------------------------------------------------------
class _Decider:
    def __init__(self, answer: object, delay_s: float = 0.0) -> None:
        self.answer, self.delay_s = answer, delay_s
        self.served: list[tuple[str, str]] = []

    async def decide(self, ask: Ask) -> Route | PassThrough:
        await asyncio.sleep(self.delay_s)
        if isinstance(self.answer, BaseException):
            raise self.answer
        assert isinstance(self.answer, (Route, PassThrough))
        return self.answer

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        self.served.append((request_id, endpoint))

    async def drain(self) -> None: ...


async def _pair(tmp_path: Path, decider: _Decider, timeout_s: float = 1.0) -> tuple[DeciderServer, RemoteDecider,
                                                                                  list[tuple[str, HashScheme]],
                                                                                  list[int]]:  # fmt: skip
    learned: list[tuple[str, HashScheme]] = []
    unavailable: list[int] = []
    ready: list[int] = []
    server = DeciderServer(decider, MergedMetrics(CollectorRegistry()), ready.append)
    path = str(tmp_path / "d.sock")
    await server.start(path)
    remote = await RemoteDecider.connect(
        path, timeout_s=timeout_s, on_scheme=lambda m, s: learned.append((m, s)),
        on_unavailable=lambda: unavailable.append(1),
    )  # fmt: skip
    return server, remote, learned, unavailable


@pytest.mark.parametrize(
    "answer", [Route((EndpointId("a:1"), EndpointId("b:2")), {"x-router-reason": "cache"}), PassThrough()]
)
async def test_a_decision_crosses_the_socket_unchanged(tmp_path: Path, answer: Route | PassThrough) -> None:
    server, remote, _, _ = await _pair(tmp_path, _Decider(answer))
    try:
        assert await remote.decide(ASK) == answer
    finally:
        await remote.close()
        await server.stop()


async def test_a_refusal_is_raised_in_the_front_as_the_same_error(tmp_path: Path) -> None:
    server, remote, _, _ = await _pair(tmp_path, _Decider(Overloaded("busy", param="x")))
    try:
        with pytest.raises(Overloaded) as raised:
            await remote.decide(ASK)
        assert raised.value.status == 429 and raised.value.message == "busy" and raised.value.param == "x"
        assert isinstance(raised.value, RouterError)
    finally:
        await remote.close()
        await server.stop()


async def test_a_changed_scheme_is_learned_and_raised(tmp_path: Path) -> None:
    scheme = HashScheme(block_size=32)
    server, remote, learned, _ = await _pair(tmp_path, _Decider(SchemeChanged(scheme)))
    try:
        with pytest.raises(SchemeChanged):
            await remote.decide(ASK)
        assert learned == [("m", scheme)]
    finally:
        await remote.close()
        await server.stop()


async def test_a_slow_or_gone_decider_passes_the_request_through(tmp_path: Path) -> None:
    server, remote, _, unavailable = await _pair(tmp_path, _Decider(PassThrough(), delay_s=1.0), timeout_s=0.05)
    try:
        assert isinstance(await remote.decide(ASK), PassThrough) and unavailable == [1]
        await server.stop()
        await asyncio.wait_for(remote.closed.wait(), 2.0)
        assert isinstance(await remote.decide(ASK), PassThrough) and unavailable == [1, 1]
    finally:
        await remote.close()


async def test_served_reports_and_readiness_reach_the_decider_side(tmp_path: Path) -> None:
    decider = _Decider(PassThrough())
    ready: list[int] = []
    server = DeciderServer(decider, MergedMetrics(CollectorRegistry()), ready.append)
    path = str(tmp_path / "d.sock")
    await server.start(path)
    remote = await RemoteDecider.connect(path, timeout_s=1.0, on_scheme=lambda m, s: None)
    try:
        remote.send(("ready", 3))
        remote.on_served("r1", EndpointId("a:1"))
        await asyncio.wait_for(_until(lambda: bool(ready and decider.served)), 2.0)
        assert ready == [3] and decider.served == [("r1", "a:1")]
    finally:
        await remote.close()
        await server.stop()


async def _until(cond: object) -> None:
    while not cond():  # type: ignore[operator]
        await asyncio.sleep(0.005)


# -- the router's side of SchemeChanged ---------------------------------------------------------------------
async def test_the_router_hashes_again_with_the_scheme_the_decider_names() -> None:
    router, _, _ = make_router()
    asked: list[Ask] = []

    class Once:
        async def decide(self, ask: Ask) -> Route | PassThrough:
            asked.append(ask)
            if len(asked) == 1:
                raise SchemeChanged(HashScheme(block_size=32))
            return Route((A,))

        def on_served(self, request_id: str, endpoint: EndpointId) -> None: ...

        async def drain(self) -> None: ...

    router.decider = Once()
    route = await router.route(post())
    assert (isinstance(route, Route) and route.endpoints[0] == A) or route.endpoints[0] != A  # routed
    assert [a.scheme.block_size for a in asked] == [16, 32]
    assert len(asked[0].block_hashes) == 1000 // 16 and len(asked[1].block_hashes) == 1000 // 32
