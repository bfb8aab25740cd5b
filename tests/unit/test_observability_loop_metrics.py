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
