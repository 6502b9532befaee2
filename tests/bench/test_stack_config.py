"""The stack's generated configs: Envoy variants validate on real Envoy; the picker YAML validates as a
``RouterConfig``; Prometheus histogram diffs and quantiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.envoy_proc import validate
from bench.prom_hist import Hist
from bench.stack_config import ENVOY_KINDS, UPSTREAM_HOST_HEADER, EnvoyKind, envoy_bootstrap, picker_config
from extproc.config import RouterConfig
from extproc.envoy.filters import EXT_PROC_FILTER
from extproc.envoy_config import EnvoyOptions, to_yaml

BACKENDS = ("127.0.0.1:8001", "127.0.0.1:8002")


def _filters(config: dict) -> list[str]:  # type: ignore[type-arg]
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return [f["name"] for f in hcm["http_filters"]]


@pytest.mark.parametrize("kind", ENVOY_KINDS)
def test_ext_proc_only_in_the_picker_variant(kind: EnvoyKind) -> None:
    config = envoy_bootstrap(kind, EnvoyOptions(endpoints=BACKENDS), [("127.0.0.1", 9002)])
    assert (EXT_PROC_FILTER in _filters(config)) == (kind == "picker")
    assert UPSTREAM_HOST_HEADER in to_yaml(config)


def test_several_pickers_all_go_into_the_ext_proc_cluster() -> None:
    pickers = [("127.0.0.1", 9002), ("127.0.0.1", 9003)]
    config = envoy_bootstrap("picker", EnvoyOptions(endpoints=BACKENDS), pickers)
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "extproc")
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]  # fmt: skip
    assert ports == [9002, 9003]


@pytest.mark.envoy
@pytest.mark.parametrize("kind", ENVOY_KINDS)
def test_every_variant_validates_on_real_envoy(kind: EnvoyKind, tmp_path: Path) -> None:
    config = envoy_bootstrap(kind, EnvoyOptions(endpoints=BACKENDS), [("127.0.0.1", 9002), ("127.0.0.1", 9003)])
    path = tmp_path / "envoy.yaml"
    path.write_text(to_yaml(config))
    done = validate(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_picker_yaml_is_a_valid_router_config() -> None:
    config = picker_config(list(BACKENDS), {BACKENDS[0]: {"endpoint": "ipc:///tmp/kv.pub"}}, block_size=16, hash_seed="0",
                           overrides={"scheduling": {"fallbacks": 1}})  # fmt: skip
    parsed = RouterConfig.model_validate(config)
    assert parsed.endpoints[0].kv_events is not None and parsed.endpoints[1].kv_events is None
    assert parsed.scheduling.fallbacks == 1 and parsed.listen.grpc_port == 0


def test_histogram_diff_mean_and_bucket_quantile() -> None:
    before = Hist(((0.001, 1.0), (0.01, 1.0), (float("inf"), 1.0)), 0.0005, 1.0)
    after = Hist(((0.001, 3.0), (0.01, 5.0), (float("inf"), 5.0)), 0.0205, 5.0)
    delta = after.minus(before)
    assert delta.count == 4 and delta.mean_s == pytest.approx(0.005)
    assert delta.quantile_s(0.5) == pytest.approx(0.001)  # 2 of 4 at or below 1 ms
    assert delta.quantile_s(0.75) == pytest.approx(0.0055)  # halfway through the (1 ms, 10 ms] bucket
    assert Hist((), 0.0, 0.0).plus(delta) == delta
