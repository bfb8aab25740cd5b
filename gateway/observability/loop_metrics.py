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
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from operator import add, itemgetter, sub
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
    """A counter: its own increments (`inc`) plus the events that feed it (`Event`), summed when
    read (`value`: at scrape time, not per update)."""

    __slots__ = ("own", "events")

    def __init__(self) -> None:
        self.own = 0.0
        self.events: list[Event] = []

    def inc(self, amount: float = 1.0) -> None:
        self.own += amount

    @property
    def value(self) -> float:
        return self.own + sum(sum(event.counts) for event in self.events)


class GaugeValue(CounterValue):
    __slots__ = ()

    def dec(self, amount: float = 1.0) -> None:
        self.own -= amount


class HistogramValue:
    """A histogram: its own observations (`observe`) plus those of the events that feed it,
    each event's finer buckets folded into this one's when read (`cumulative`, `counts`,
    `sum`)."""

    __slots__ = ("bounds", "own_counts", "own_sum", "sources")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.own_counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.own_sum = 0.0
        # (event, what picks this histogram's cumulative counts out of the event's: `event`)
        self.sources: list[tuple[Event, Callable[[list[int]], tuple[int, ...]]]] = []

    def observe(self, value: float) -> None:
        # `le` buckets: a value equal to a bound belongs to that bound's bucket.
        self.own_counts[bisect_left(self.bounds, value)] += 1
        self.own_sum += value

    def cumulative(self) -> list[int]:
        """Observations at or below each bound, +Inf last (what the exposition writes). An
        event's cumulative count at one of its bounds is this histogram's at the same bound,
        so folding is a pick and an addition per source, all in C: a scrape of thousands of
        series stays short on the event loop that also answers requests."""
        total = list(accumulate(self.own_counts))
        for event, pick in self.sources:
            total = list(map(add, total, pick(list(accumulate(event.counts)))))
        return total

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative), +Inf last."""
        cumulative = self.cumulative()
        return [cumulative[0], *map(sub, cumulative[1:], cumulative[:-1])]

    @property
    def sum(self) -> float:
        return self.own_sum + sum(event.sum for event, _ in self.sources)


class Event:
    """One kind of event with its labels fixed (a request of one method, era, status and code;
    a backend call of one backend, method and outcome), feeding several counters and histograms
    at once: a request's counter and its two duration histograms, a backend call's two
    counters and two histograms. Per event it keeps one count and one duration, in the union of
    the buckets of every histogram it feeds; the families read it when scraped (each counter
    its count, each histogram its buckets folded into the histogram's own). So `add` is one
    bucket search, one increment and one addition however many values the event feeds, where
    an `inc`/`observe` per value was a Python call and a search per histogram on every request
    (bench/README.md "Observability"). The folding is exact: every histogram's bounds are
    bounds of the union, so an event's bucket lies wholly inside one bucket of each histogram.

    Made by `event()`, once per set of children: an Event is never dropped (its counts are part
    of every counter it feeds), and the label sets are bounded, so neither are Events."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def add(self, seconds: float) -> None:
        # Written out where a request ends (middleware.py `_finish`) and a backend call ends
        # (backend_call.py `_end`), to save a call on every request; tests/unit/
        # test_request_series.py and test_backend_call.py hold those to the buckets this writes.
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds


_events: dict[tuple[tuple[CounterValue, ...], tuple[HistogramValue, ...]], Event] = {}


def event(counters: Sequence[CounterValue] = (), histograms: Sequence[HistogramValue] = ()) -> Event:
    """The Event that feeds these counters and histograms (children of loop-owned families), made
    and attached to them the first time (children hash by identity: the families keep them)."""
    key = (tuple(counters), tuple(histograms))
    found = _events.get(key)
    if found is None:
        bounds = tuple(sorted({bound for histogram in histograms for bound in histogram.bounds}))
        found = _events[key] = Event(bounds)
        for counter in counters:
            counter.events.append(found)
        for histogram in histograms:
            # The histogram's bounds are among the event's: its cumulative count at each is the
            # event's at that bound's index (+Inf: the event's last, its total).
            at = [bisect_left(bounds, bound) for bound in histogram.bounds] + [len(bounds)]
            pick = itemgetter(*at) if len(at) > 1 else (lambda cumulative, i=at[0]: (cumulative[i],))
            histogram.sources.append((found, pick))
    return found


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
        self.exposed_bounds = tuple(floatToGoString(b) for b in (*bounds, float("inf")))  # `le` values

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
                    buckets = list(zip(family.exposed_bounds, child.cumulative(), strict=True))
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
