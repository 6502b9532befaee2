"""``deploy/grafana/router-fleet.json``: every PromQL query names metrics the picker's registry really exports.

The exported names come from a real ``App``'s registry (built, not started: the collectors answer from empty
state), expanded as Prometheus exposes them (counters ``_total``, summaries ``_sum``/``_count``, histograms
``_bucket`` too). The dashboard charts only our own ``router_*`` names, never ``vllm:*`` ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.app import App
from tests.support.config import router_config

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "router-fleet.json"
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "summary": ("_sum", "_count"),
             "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}  # fmt: skip
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    app = App(router_config())
    try:
        return {f.name + s for f in app.metrics.registry.collect() for s in _SUFFIXES[f.type]}
    finally:
        app.front.shutdown()


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers that are neither functions, keywords, nor
    inside label matchers, grouping clauses, ranges or strings."""
    e = re.sub(r"label_values\(\s*([^,)]+)(,[^)]*)?\)", r"\1", expr)  # a Grafana variable query
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", e)
    e = re.sub(r"\boffset\s+\w+", " ", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = {m.group(1) for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", e) if not m.group(2)}
    return names - _KEYWORDS


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield f"variable {var['name']}", var["query"]["query"]


DASH = json.loads(DASHBOARD.read_text())
QUERIES = list(_queries(DASH))


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (endpoint) (rate(router_x_total{endpoint=~"$endpoint"}[$__rate_interval]))', {"router_x_total"}),
        ("histogram_quantile(0.99, sum by (le, phase) (rate(a_bucket[5m])))", {"a_bucket"}),
        ("max by (endpoint) (a) / on (endpoint) group_left b offset 5m", {"a", "b"}),
        ("label_values(router_y, endpoint)", {"router_y"}),
    ],
    ids=["matchers-and-ranges", "functions", "keywords", "label-values"],
)
def test_the_name_extractor(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(("where", "expr"), QUERIES, ids=[f"{w}:{i}" for i, (w, _) in enumerate(QUERIES)])
def test_every_query_names_exported_metrics(exported: set[str], where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    assert names <= exported, f"{where}: not exported: {sorted(names - exported)}"
    assert not any(n.startswith("vllm:") for n in names)


def test_the_dashboard_is_importable() -> None:
    """The shape Grafana needs: unique panel ids, a datasource variable every query uses, and no row left empty."""
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids)) and DASH["uid"] and DASH["schemaVersion"] >= 36
    assert any(v["type"] == "datasource" for v in DASH["templating"]["list"])
    for panel in DASH["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]


def test_every_fleet_metric_is_charted(exported: set[str]) -> None:
    charted = set().union(*(metric_names(e) for _, e in QUERIES))
    fleet = {
        n for n in exported if n.startswith(("router_endpoint_", "router_model_", "router_index_", "router_ceiling_"))
    }
    uncharted = fleet - charted - {"router_endpoint_healthy", "router_endpoint_load_known",
                                   "router_model_routed_requests_total",
                                   "router_model_predicted_hit_ratio", "router_model_cached_share_ceiling_ratio"}  # fmt: skip
    assert not uncharted, sorted(uncharted)
