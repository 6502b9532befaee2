"""DNS endpoint discovery (``extproc/backends/dns.py``) against a real DNS server on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extproc.backends.dns import DnsDiscovery, DnsError, DnsResolver, encode_query, parse_response, system_nameserver
from extproc.backends.registry import EndpointRegistry
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.config import RouterConfig
from extproc.types import Endpoint, EndpointId
from tests.deploy.dns_server import LoopbackDns
from tests.support.polling import until

NAME = "vllm-pods.llm.svc.cluster.local"


async def test_a_records_nxdomain_and_servfail() -> None:
    async with LoopbackDns({NAME: ["10.0.0.7", "10.0.0.8"]}) as dns:
        resolver = DnsResolver(("127.0.0.1", dns.port), timeout_s=1.0)
        assert await resolver.resolve(NAME) == ("10.0.0.7", "10.0.0.8")
        assert await resolver.resolve(NAME + ".") == ("10.0.0.7", "10.0.0.8"), "a trailing dot is the same name"
        assert await resolver.resolve("nothing.llm.svc.cluster.local") == ()
        dns.servfail.add(NAME)
        with pytest.raises(DnsError, match="rcode 2"):
            await resolver.resolve(NAME)


async def test_a_truncated_udp_answer_is_asked_again_over_tcp() -> None:
    pods = [f"10.1.0.{i}" for i in range(1, 41)]  # 40 pods: past what the server sends over UDP
    async with LoopbackDns({NAME: pods}, udp_max_records=8) as dns:
        assert await DnsResolver(("127.0.0.1", dns.port)).resolve(NAME) == tuple(pods)
        assert [t for t, _ in dns.queries] == ["udp", "tcp"]


async def test_a_silent_server_is_a_timeout_error() -> None:
    async with LoopbackDns({NAME: ["10.0.0.7"]}) as dns:
        dns.silent = True
        with pytest.raises(DnsError, match="failed"):
            await DnsResolver(("127.0.0.1", dns.port), timeout_s=0.2).resolve(NAME)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00" * 11, encode_query(7, NAME), encode_query(7, NAME)[:-3]],
    ids=["empty", "short-header", "a-query-not-an-answer", "cut-question"],
)
def test_garbage_is_a_dns_error_never_another_exception(data: bytes) -> None:
    with pytest.raises(DnsError):
        parse_response(data, 7)


def test_the_system_nameserver_comes_from_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("search llm.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n")
    assert system_nameserver(conf) == ("10.96.0.10", 53)
    conf.write_text("search x\n")
    with pytest.raises(DnsError):
        system_nameserver(conf)


async def test_discovery_reports_changes_and_keeps_the_last_set_while_dns_fails() -> None:
    seen: list[frozenset[EndpointId]] = []
    async with LoopbackDns({NAME: ["10.0.0.7"]}) as dns:
        discovery = DnsDiscovery(
            DnsResolver(("127.0.0.1", dns.port), timeout_s=0.2), NAME, 8000, interval_s=0.05, on_change=seen.append
        )
        await discovery.start()
        try:
            assert seen == [frozenset({EndpointId("10.0.0.7:8000")})]
            dns.records[NAME] = ["10.0.0.7", "10.0.0.9"]
            await until(lambda: len(seen) == 2)
            assert seen[-1] == {EndpointId("10.0.0.7:8000"), EndpointId("10.0.0.9:8000")}
            dns.silent = True  # DNS down: no change reported, the last set stands
            await asyncio.sleep(0.5)
            assert len(seen) == 2 and discovery.current == seen[-1]
            dns.silent = False
            del dns.records[NAME]  # the Service has no ready pod: NXDOMAIN empties the set
            await until(lambda: len(seen) == 3)
            assert seen[-1] == frozenset()
        finally:
            await discovery.stop()


def test_registry_sync_keeps_known_state_and_ignores_updates_for_dropped_endpoints() -> None:
    a, b, c = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
    registry = EndpointRegistry([Endpoint(a), Endpoint(b)])
    registry.scraped(a, EngineMetrics(running=3, waiting=0, kv_usage=0.5, models=frozenset()))
    registry.sync([Endpoint(a), Endpoint(c)])
    snap = registry.snapshot()
    assert set(snap) == {a, c}
    assert snap[a].metrics is not None and snap[a].metrics.running == 3
    assert snap[c].metrics is None
    registry.scraped(
        b, EngineMetrics(running=1, waiting=0, kv_usage=0.1, models=frozenset())
    )  # a late scrape of a dropped one
    registry.failed(b, unreachable=True)
    assert set(registry.snapshot()) == {a, c}


def test_config_needs_endpoints_or_discovery() -> None:
    models = [{"name": "m"}]
    with pytest.raises(ValueError, match="discovery"):
        RouterConfig.model_validate({"models": models})
    config = RouterConfig.model_validate(
        {
            "models": models,
            "discovery": {
                "dns": {
                    "name": NAME,
                    "port": 8000,
                    "nameserver": "127.0.0.1:5353",
                    "kv_events": {"endpoint": "tcp://{ip}:5557", "replay_endpoint": "tcp://{ip}:6557", "topic": "kv"},
                }
            },
        }
    )
    assert config.discovery.dns is not None
    kv = config.discovery.dns.kv_events_for("10.0.0.7")
    assert kv is not None and (kv.endpoint, kv.replay_endpoint) == ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:6557")
