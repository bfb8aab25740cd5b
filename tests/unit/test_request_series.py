"""RequestTelemetry's end of request (observability/middleware.py `_finish`): the metric children
found by the record's raw values (remembered per combination) are the ones the labels name
(`_series`, worked out every time past the limit); and what a client or a backend sends cannot
grow either map past its bound."""

from __future__ import annotations

import itertools

import pytest

from gateway.observability import metrics, middleware
from gateway.observability.middleware import RequestTelemetry
from gateway.observability.record import RequestRecord


def _records():
    values = itertools.product(["tools/call", "tools/list", "initialize", "made/up", None], ["modern", "legacy"],
                               [200, 400, 502], [None, -32602, -32001, 777], [False, True],
                               ["2026-07-28", None, "garbage-version"], ["echo", None])
    for method, era, status, code, tool_error, version, tool in values:
        record = RequestRecord("rid", 0.0, era, {})
        record.method, record.status, record.code, record.tool_error = method, status, code, tool_error
        record.version, record.tool_label = version, tool
        yield record


def _snapshot():
    return {(family.name, values): (child.value if hasattr(child, "value") else (tuple(child.counts), child.sum))
            for family in (metrics.REQUESTS, metrics.REQUEST_SECONDS, metrics.SERVER_OPERATION)
            for values, child in family.items()}


def _delta(before, after):
    return {key: value for key, value in after.items() if before.get(key) != value}


@pytest.mark.parametrize("limit", [5, 2000])
def test_remembered_children_are_the_ones_the_labels_name(monkeypatch, limit):
    remembered = RequestTelemetry(None, path="/mcp")  # type: ignore[arg-type]
    worked_out = RequestTelemetry(None, path="/mcp")  # type: ignore[arg-type]
    count = 0
    for record in _records():
        count += 1
        monkeypatch.setattr(middleware, "_MAX_RECORD_KEYS", limit)
        before = _snapshot()
        remembered._finish(record, {}, {})
        remembered._finish(record, {}, {})  # the second time from the remembered map (within the limit)
        by_record = _delta(before, _snapshot())
        monkeypatch.setattr(middleware, "_MAX_RECORD_KEYS", 0)  # labels worked out every time
        before = _snapshot()
        worked_out._finish(record, {}, {})
        worked_out._finish(record, {}, {})
        by_labels = _delta(before, _snapshot())
        # The same three series (counter, two histograms) moved, whichever way they were found.
        assert by_record.keys() == by_labels.keys() and len(by_record) == 3, (record.__dict__, by_record)
    assert not worked_out._by_record and len(remembered._by_record) == min(limit, count) and count == 1440


def test_raw_values_do_not_grow_the_label_map():
    telemetry = RequestTelemetry(None, path="/mcp")  # type: ignore[arg-type]
    for i in range(middleware._MAX_RECORD_KEYS + 1000):
        record = RequestRecord("rid", 0.0, "legacy", {})
        record.method, record.status, record.version, record.code = f"m{i}", 200, f"v{i}", 100_000 + i
        telemetry._finish(record, {}, {})
    assert len(telemetry._by_record) == middleware._MAX_RECORD_KEYS
    assert len(telemetry._children) == 1  # other, legacy, 200, other code, other version


@pytest.mark.parametrize("seconds", [0.0, 0.0001, 0.00010001, 0.01, 0.0123, 60.0, 61.0])
def test_a_request_lands_in_the_buckets_observe_would_put_it_in(monkeypatch, seconds):
    """The end of a request writes its Event inline: each histogram it feeds moves by one in
    the bucket `observe` would have chosen (a value on a bound included), and its counter by one."""
    from gateway.observability import loop_metrics

    telemetry = RequestTelemetry(None, path="/mcp")  # type: ignore[arg-type]
    record = RequestRecord("rid", 0.0, "modern", {})
    record.method, record.status, record.version = "tools/list", 200, "2026-07-28"
    monkeypatch.setattr(middleware.time, "perf_counter", lambda: seconds)
    children = [metrics.REQUEST_SECONDS.labels("tools/list", "modern"),
                metrics.SERVER_OPERATION.labels("tools/list", "", "", "2026-07-28", "tcp")]
    counter = metrics.REQUESTS.labels("tools/list", "modern", "2xx", metrics.OK)
    before = [(child.counts, child.sum) for child in children], counter.value
    telemetry._finish(record, {}, {})
    for child, (counts, total) in zip(children, before[0], strict=True):
        expected = loop_metrics.HistogramValue(child.bounds)
        expected.observe(seconds)
        assert [a - b for a, b in zip(child.counts, counts, strict=True)] == expected.counts
        assert child.sum - total == pytest.approx(seconds, abs=1e-6)  # onto sums other tests left
    assert counter.value == before[1] + 1
