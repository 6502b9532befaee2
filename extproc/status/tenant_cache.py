"""``TenantCacheCollector``: the prefix cache by tenant class and endpoint, as Prometheus families at scrape time.

Names (labels ``tenant_class``, ``endpoint``; the classes are the configured ones plus ``default`` and
``unattributed``, so the cardinality is bounded by the config times the fleet):

* ``router_tenant_cache_blocks``: blocks the class put there that the engine's events confirm it still holds;
* ``router_tenant_evictions_caused_total``: blocks the engine removed there while the class's prefill was the
  latest we routed there (the likeliest cause; see ``kvcache/occupancy.py``);
* ``router_tenant_blocks_evicted_total``: the class's own blocks the engine removed there;
* ``router_tenant_protected_hits_total``: requests of a protected class that hit blocks their class owns there;
* ``router_tenant_hit_blocks_total``: leading blocks the router predicted cached for the class's requests there.

``render_section`` is the same, for people: the status page's ``tenant-cache`` section (``app.py`` adds it when
tenant classes are configured).
"""

from __future__ import annotations

from collections.abc import Iterator
from html import escape

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.kvcache.occupancy import Occupancy

_LABELS = ["tenant_class", "endpoint"]


class TenantCacheCollector(Collector):
    def __init__(self, occupancy: Occupancy) -> None:
        self._occupancy = occupancy

    def collect(self) -> Iterator[Metric]:
        blocks = GaugeMetricFamily("router_tenant_cache_blocks", "KV blocks the tenant class holds on the endpoint "
                                   "(attributed by routing, confirmed by KV events)", labels=_LABELS)  # fmt: skip
        for cls, endpoint, n in self._occupancy.occupancy():
            blocks.add_metric([cls, endpoint], n)
        yield blocks
        families = {
            "evictions_caused": CounterMetricFamily(
                "router_tenant_evictions_caused", "Blocks evicted there while the class's prefill was the latest",
                labels=_LABELS),
            "blocks_evicted": CounterMetricFamily(
                "router_tenant_blocks_evicted", "The class's own blocks evicted there", labels=_LABELS),
            "protected_hits": CounterMetricFamily(
                "router_tenant_protected_hits", "Requests of a protected class hitting its own blocks there",
                labels=_LABELS),
            "hit_blocks": CounterMetricFamily(
                "router_tenant_hit_blocks", "Leading blocks predicted cached for the class's requests there",
                labels=_LABELS),
        }  # fmt: skip
        for cls, endpoint, c in self._occupancy.counters():
            for field, family in families.items():
                family.add_metric([cls, endpoint], getattr(c, field))
        yield from families.values()


def render_section(occupancy: Occupancy) -> str:
    """The status page's ``<section id="tenant-cache">``: per endpoint and class, blocks held, evictions caused and
    suffered, protected hits."""
    counters = {(cls, ep): c for cls, ep, c in occupancy.counters()}
    held = {(cls, ep): n for cls, ep, n in occupancy.occupancy()}
    rows = []
    for cls, ep in sorted(held.keys() | counters.keys(), key=lambda k: (k[1], k[0])):
        c = counters.get((cls, ep))
        caused, evicted, hits = (c.evictions_caused, c.blocks_evicted, c.protected_hits) if c else (0, 0, 0)
        rows.append(f"<tr><td>{escape(ep)}</td><td>{escape(cls)}</td><td>{held.get((cls, ep), 0):,}</td>"
                    f"<td>{caused:,}</td><td>{evicted:,}</td><td>{hits:,}</td></tr>")  # fmt: skip
    empty = "<tr><td colspan=6>no attributed blocks yet (needs the endpoints' KV events)</td></tr>"
    return (
        '<section id="tenant-cache"><h2>Prefix cache by tenant class</h2>'
        "<table><tr><th>endpoint</th><th>class</th><th>blocks held</th><th>evictions caused</th>"
        f"<th>own blocks evicted</th><th>protected hits</th></tr>{''.join(rows) or empty}</table></section>"
    )
