"""One ``/metrics`` for N front workers and the decider: the fronts' latest rows summed into the decider's own.

Each front sends its registry's families every second (``frames.metric_rows``); ``MergedMetrics.collect``
yields the decider's families with the fronts' samples added: counters, histograms and size gauges are summed
per (sample, labels); ``_created`` timestamps take the earliest; the gauges in ``_MAX_GAUGES`` take the
largest (a model's encoder is "fast" if any front uses it; a fallback anywhere shows; the worst front's
prefix-stability finding). A front that exits is
forgotten, so its counters leave the sums: a restart resets them, as a process restart would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from extproc.workers.frames import MetricRows

# 0/1 flags, and per-front diagnostics whose sum would mean nothing (each front diagnoses its own share)
_MAX_GAUGES = frozenset({
    "router_tokenizer_encoder", "router_tokenizer_fallback",
    "router_prefix_lost_hit_share", "router_prefix_varying_span_offset_tokens",
})  # fmt: skip
_Key = tuple[str, tuple[tuple[str, str], ...]]


class MergedMetrics:
    """``collect()`` over the decider's registry plus every live front's last rows (a ``Collector``)."""

    def __init__(self, own: CollectorRegistry) -> None:
        self._own = own
        self._fronts: dict[int, MetricRows] = {}

    def update(self, front: int, rows: MetricRows) -> None:
        self._fronts[front] = rows

    def forget(self, front: int) -> None:
        self._fronts.pop(front, None)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, tuple[str, str, dict[_Key, float]]] = {}
        for family in self._own.collect():
            values = families.setdefault(family.name, (family.type, family.documentation, {}))[2]
            for s in family.samples:
                _add(values, family.name, family.type, s.name, dict(s.labels), float(s.value))
        for rows in list(self._fronts.values()):
            for name, kind, doc, samples in rows:
                values = families.setdefault(name, (kind, doc, {}))[2]
                for sample, labels, value in samples:
                    _add(values, name, kind, sample, labels, value)
        for name, (kind, doc, values) in families.items():
            metric = Metric(name, doc, kind)
            for (sample, label_pairs), value in values.items():
                metric.add_sample(sample, dict(label_pairs), value)
            yield metric


def _add(values: dict[_Key, float], family: str, kind: str, sample: str, labels: dict[str, Any], value: float) -> None:
    key = (sample, tuple(sorted(labels.items())))
    old = values.get(key)
    if old is None:
        values[key] = value
    elif sample.endswith("_created"):
        values[key] = min(old, value)
    elif kind == "gauge" and family in _MAX_GAUGES:
        values[key] = max(old, value)
    else:
        values[key] = old + value
