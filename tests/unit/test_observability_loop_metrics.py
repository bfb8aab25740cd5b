"""Loop-owned metrics expose exactly what prometheus_client's own metrics would for the same
updates (minus the `_created` samples), and the gateway's request metrics count real requests."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.observability import loop_metrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
OBSERVED = [0.0005, 0.001, 0.002, 0.01, 0.5, 7.0, 0.0999]


def _text(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_exposition_matches_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counter = loop_metrics.Counter("t_requests_total", "Requests.", ["method", "status"])
    histogram = loop_metrics.Histogram("t_seconds", "Seconds.", ["method"], buckets=BUCKETS)
    gauge = loop_metrics.Gauge("t_in_flight", "In flight.")
    loop_metrics.register([counter, histogram, gauge], registry=ours)
    ref_counter = prometheus_client.Counter("t_requests_total", "Requests.", ["method", "status"], registry=theirs)
    ref_histogram = prometheus_client.Histogram("t_seconds", "Seconds.", ["method"], buckets=BUCKETS,
                                                registry=theirs)
    ref_gauge = prometheus_client.Gauge("t_in_flight", "In flight.", registry=theirs)

    for value in OBSERVED:
        for method in ("tools/call", "tools/list"):
            histogram.labels(method).observe(value)
            ref_histogram.labels(method).observe(value)
    counter.labels("tools/call", "2xx").inc()
    counter.labels("tools/call", "2xx").inc(2)
    counter.labels("other", "4xx").inc()
    ref_counter.labels("tools/call", "2xx").inc()
    ref_counter.labels("tools/call", "2xx").inc(2)
    ref_counter.labels("other", "4xx").inc()
    in_flight, ref_in_flight = gauge.labels(), ref_gauge
    in_flight.inc(), in_flight.inc(), in_flight.dec()
    ref_in_flight.inc(), ref_in_flight.inc(), ref_in_flight.dec()

    assert _text(ours) == _text(theirs)
    # Spot-check the semantics rather than only the agreement: `le` is inclusive, cumulative.
    assert 't_seconds_bucket{le="0.001",method="tools/call"} 2.0' in _text(ours)
    assert 't_seconds_bucket{le="+Inf",method="tools/call"} 7.0' in _text(ours)
    assert 't_in_flight 1.0' in _text(ours)


def test_a_duplicate_name_is_refused_at_registration():
    registry = CollectorRegistry()
    loop_metrics.register([loop_metrics.Counter("t_dup_total", "One.")], registry=registry)
    with pytest.raises(ValueError):
        loop_metrics.register([loop_metrics.Counter("t_dup_total", "Two.")], registry=registry)


def test_wrong_label_count_and_unsorted_buckets_are_refused():
    with pytest.raises(ValueError):
        loop_metrics.Counter("t_x_total", "X.", ["a", "b"]).labels("only-one")
    with pytest.raises(ValueError):
        loop_metrics.Histogram("t_y", "Y.", buckets=(1.0, 0.5))


def test_an_event_updates_its_values_as_inc_and_observe_would():
    """An Event's count and its buckets (the union of its histograms') read through each family it
    feeds are what one `inc()` and one `observe()` per value would have written: the same counts,
    sums and buckets, a value on any histogram's bound included (`le`), for every value of a
    sweep across and past the buckets, with the families' own updates added alongside."""
    bounds = (0.0001, 0.001, 0.01, 1, 60)
    one_by_one = loop_metrics.Histogram("one_seconds", "d", ["k"], buckets=bounds)
    together = loop_metrics.Histogram("two_seconds", "d", ["k"], buckets=bounds)
    second = loop_metrics.Histogram("three_seconds", "d", ["k"], buckets=(0.0005, 0.5, 2))
    second_one_by_one = loop_metrics.Histogram("four_seconds", "d", ["k"], buckets=(0.0005, 0.5, 2))
    counted, counted_too = loop_metrics.Counter("one_total", "d", ["k"]), loop_metrics.Counter("two_total", "d", ["k"])
    event = loop_metrics.event([counted_too.labels("a")], [together.labels("a"), second.labels("a")])
    assert loop_metrics.event([counted_too.labels("a")], [together.labels("a"), second.labels("a")]) is event
    assert event.bounds == (0.0001, 0.0005, 0.001, 0.01, 0.5, 1, 2, 60)
    values = [0.0, 0.00005, 0.0001, 0.0005, 0.00099, 0.001, 0.5, 1.0, 2.0, 59.9, 60.0, 61.0, 1e9, *bounds]
    for value in values:
        counted.labels("a").inc()
        one_by_one.labels("a").observe(value)
        second_one_by_one.labels("a").observe(value)
        event.add(value)
    # A child fed by an event still counts its own updates (a stream's first byte, say).
    for child in (together.labels("a"), one_by_one.labels("a")):
        child.observe(0.003)
    counted_too.labels("a").inc(2), counted.labels("a").inc(2)
    expected, got = one_by_one.labels("a"), together.labels("a")
    assert (got.counts, got.sum) == (expected.counts, expected.sum)
    assert counted_too.labels("a").value == counted.labels("a").value == len(values) + 2
    assert (second.labels("a").counts, second.labels("a").sum) == (second_one_by_one.labels("a").counts,
                                                                   second_one_by_one.labels("a").sum)
    assert second.labels("a").counts == [sum(v <= 0.0005 for v in values), sum(0.0005 < v <= 0.5 for v in values),
                                         sum(0.5 < v <= 2 for v in values), sum(v > 2 for v in values)]


def test_families_fed_by_events_expose_what_prometheus_client_would():
    """Through the registry: two events feeding one counter child and one histogram child (a
    request counted by two outcomes' events) expose the sums of both, as prometheus_client's
    own metrics updated value by value."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counter = loop_metrics.Counter("e_requests_total", "Requests.", ["method"])
    histogram = loop_metrics.Histogram("e_seconds", "Seconds.", ["method"], buckets=BUCKETS)
    other = loop_metrics.Histogram("e_other_seconds", "Seconds.", ["method"], buckets=(0.005, 0.05))
    loop_metrics.register([counter, histogram, other], registry=ours)
    ref_counter = prometheus_client.Counter("e_requests_total", "Requests.", ["method"], registry=theirs)
    ref_histogram = prometheus_client.Histogram("e_seconds", "Seconds.", ["method"], buckets=BUCKETS, registry=theirs)
    ref_other = prometheus_client.Histogram("e_other_seconds", "Seconds.", ["method"], buckets=(0.005, 0.05),
                                            registry=theirs)
    ok = loop_metrics.event([counter.labels("call")], [histogram.labels("call"), other.labels("call")])
    failed = loop_metrics.event([counter.labels("call")], [histogram.labels("call")])
    for i, value in enumerate(OBSERVED * 3):
        (ok if i % 2 else failed).add(value)
        ref_counter.labels("call").inc()
        ref_histogram.labels("call").observe(value)
        if i % 2:
            ref_other.labels("call").observe(value)
    assert _text(ours) == _text(theirs)


def test_a_histogram_of_one_bucket_fed_by_an_event_counts_everything_in_it():
    """No bound but +Inf (a pick of one index): every value lands there, as `observe` would."""
    only_inf = loop_metrics.Histogram("inf_seconds", "d", ["k"], buckets=(float("inf"),))
    finer = loop_metrics.Histogram("finer_seconds", "d", ["k"], buckets=(0.1, 1.0))
    event = loop_metrics.event([], [only_inf.labels("a"), finer.labels("a")])
    for value in (0.0, 0.1, 5.0):
        event.add(value)
    only_inf.labels("a").observe(2.0)
    assert only_inf.labels("a").counts == [4] and only_inf.labels("a").cumulative() == [4]
    assert finer.labels("a").counts == [2, 0, 1] and finer.labels("a").cumulative() == [2, 2, 3]
