"""Counters and histograms for the per-request hot path, exported through prometheus_client.

prometheus_client's metric values are thread-safe: every `inc()` and `observe()` takes a lock
(and a histogram takes two plus a walk over its buckets). The gateway updates about eight of
them per call, all from the one event-loop thread, and paid ~1.4 µs per update for locking it
never needed (bench/README.md "Profile"). These are plain Python numbers instead, written only
by the event loop, read at scrape time by a `prometheus_client` custom collector (the
documented extension point, "Custom Collectors"). `/metrics` is served on the same loop, so a
scrape never sees a half-made update; a scrape from another thread (a test, an exporter
thread) may read a value one update old, never a torn one (the GIL makes each `+=` atomic with
respect to readers).

Exposition is exactly what `prometheus_client.Counter/Histogram/Gauge` would write: same
names, `_total`/`_bucket`/`_sum`/`_count` samples, cumulative buckets with `+Inf`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


V = TypeVar("V")


class CounterValue:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class GaugeValue(CounterValue):
    __slots__ = ()

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class HistogramValue:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # `le` buckets: a value equal to a bound belongs to that bound's bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class Event:
    """The counters and histograms that one event updates together (a request: its count and
    its two duration histograms): one call per event instead of one `inc`/`observe` per value,
    each a Python call the hot path paid for (bench/README.md "Observability"). The updates are
    `CounterValue.inc()` and `HistogramValue.observe()` written out, here beside them
    (tests/unit/test_observability_loop_metrics.py holds them to the same results)."""

    __slots__ = ("counters", "histograms")

    def __init__(self, counters: Sequence[CounterValue] = (), histograms: Sequence[HistogramValue] = ()) -> None:
        self.counters = tuple(counters)
        self.histograms = tuple(histograms)

    def add(self, seconds: float) -> None:
        for counter in self.counters:
            counter.value += 1.0
        for histogram in self.histograms:
            histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
            histogram.sum += seconds


class _Family(Generic[V]):
    """One metric name with a fixed list of label names; children memoized by label values
    (the label sets are bounded: metrics.py module docstring)."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], V] = {}

    def _new(self) -> V:
        raise NotImplementedError

    def labels(self, *values: str) -> V:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values!r}")
            child = self._children[values] = self._new()
        return child

    def items(self) -> list[tuple[tuple[str, ...], V]]:
        return list(self._children.items())  # a copy: the loop may add a child meanwhile


class Counter(_Family[CounterValue]):
    kind = "counter"

    def _new(self) -> CounterValue:
        return CounterValue()


class Gauge(_Family[GaugeValue]):
    kind = "gauge"

    def _new(self) -> GaugeValue:
        return GaugeValue()


class Histogram(_Family[HistogramValue]):
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float]) -> None:
        super().__init__(name, documentation, labelnames)
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{self.name}: buckets must be strictly increasing")
        self.bounds = bounds

    def _new(self) -> HistogramValue:
        return HistogramValue(self.bounds)


class LoopMetricsCollector(Collector):
    """Exports a set of loop-owned families in the text format prometheus_client writes."""

    def __init__(self, families: Sequence[_Family[Any]]) -> None:
        self.families = tuple(families)

    def describe(self) -> Iterator[Metric]:
        # Names only (no samples), so that the registry can refuse a duplicate name at start-up.
        for family in self.families:
            yield self._exposed(family)

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            out: Any = self._exposed(family)
            for values, child in family.items():
                labels = list(values)
                if isinstance(child, HistogramValue):
                    cumulative, buckets = 0, []
                    for bound, count in zip((*child.bounds, float("inf")), child.counts):
                        cumulative += count
                        buckets.append((floatToGoString(bound), cumulative))
                    out.add_metric(labels, buckets, child.sum)
                else:
                    out.add_metric(labels, child.value)
            yield out

    @staticmethod
    def _exposed(family: _Family[Any]) -> Metric:
        """The family as prometheus_client exposes it, without samples yet."""
        kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
        return kinds[family.kind](family.name, family.documentation, labels=list(family.labelnames))


def register(families: Sequence[_Family[Any]], registry: CollectorRegistry = REGISTRY) -> LoopMetricsCollector:
    collector = LoopMetricsCollector(families)
    registry.register(collector)
    return collector
