"""Read one labelled Prometheus histogram from a ``/metrics`` scrape, diff two scrapes, summarize.

Shape: ``{label_value: Hist}``; ``Hist.buckets`` is ``[(upper_bound_s, cumulative_count), ...]`` in
ascending order, ``+Inf`` last, as the exposition format gives them.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Hist:
    buckets: tuple[tuple[float, float], ...]
    sum_s: float
    count: float

    def minus(self, before: Hist) -> Hist:
        """This scrape minus an earlier one (same bucket bounds)."""
        prior = dict(before.buckets)
        buckets = tuple((le, n - prior.get(le, 0.0)) for le, n in self.buckets)
        return Hist(buckets, self.sum_s - before.sum_s, self.count - before.count)

    def plus(self, other: Hist) -> Hist:
        """The sum of two histograms (bucket bounds merged; a bound missing on one side counts 0 there)."""
        mine, theirs = dict(self.buckets), dict(other.buckets)
        buckets = tuple((le, mine.get(le, 0.0) + theirs.get(le, 0.0)) for le in sorted({*mine, *theirs}))
        return Hist(buckets, self.sum_s + other.sum_s, self.count + other.count)

    @property
    def mean_s(self) -> float:
        return self.sum_s / self.count if self.count else math.nan

    def quantile_s(self, q: float) -> float:
        """Estimated quantile, linear within the bucket (``inf`` if it falls in the ``+Inf`` bucket)."""
        if not self.count:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return math.inf
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside else 0.0)
            lower, below = le, cumulative
        return math.inf


EMPTY = Hist((), 0.0, 0.0)


def scrape(url: str, name: str, label: str, timeout_s: float = 5.0) -> dict[str, Hist]:
    """``{label_value: Hist}`` of histogram ``name`` (without ``_bucket``/``_sum``/``_count``) at ``url``."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text = resp.read().decode()
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            key = sample.labels.get(label, "")
            if sample.name.endswith("_bucket"):
                buckets.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                sums[key] = sample.value
            elif sample.name.endswith("_count"):
                counts[key] = sample.value
    return {key: Hist(tuple(sorted(b)), sums.get(key, 0.0), counts.get(key, 0.0)) for key, b in buckets.items()}


def diff(after: dict[str, Hist], before: dict[str, Hist]) -> dict[str, Hist]:
    """Per label, ``after - before`` (a label new in ``after`` counts from zero)."""
    return {key: hist.minus(before.get(key, EMPTY)) for key, hist in after.items()}
