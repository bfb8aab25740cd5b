"""BackendCall's metrics (observability/backend_call.py): a whole answer's time to its first byte
and its duration are observed by one Event with one clock read; a stream's at its start and at
its end. Checked against the families' own children, value by value."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.observability import metrics
from gateway.observability.backend_call import BackendCall
from gateway.protocol import jsonrpc as rpc

VERSION = "2026-07-28"
ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "resultType": "complete"}}


def _backend(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, settings=SimpleNamespace(command=None, url="http://127.0.0.1:9/mcp"))


def _values(backend: str, outcome: str = metrics.OK, label: str = metrics.OK, error: str = ""):
    """Every test has a backend and a tool of its own (the duration's labels have no backend)."""
    first = metrics.BACKEND_SECONDS.labels(backend, "tools/call")
    duration = metrics.CLIENT_OPERATION.labels("tools/call", error, backend, VERSION, "tcp", "127.0.0.1")
    return (metrics.BACKEND_REQUESTS.labels(backend, "tools/call", outcome, label).value,
            metrics.TOOL_CALLS.labels(backend, backend, label).value,
            (first.counts[:], first.sum), (duration.counts[:], duration.sum))


def test_a_whole_answer_counts_once_and_observes_first_byte_and_duration_alike():
    for round_ in range(1, 4):  # the first call makes the Event, the later ones reuse it
        BackendCall(_backend("bc-whole"), SimpleNamespace(method="tools/call", version=VERSION), "bc-whole").sent(ANSWER)
        calls, tools, (first, first_sum), (duration, duration_sum) = _values("bc-whole")
        assert calls == tools == round_
        assert sum(first) == sum(duration) == round_ and first_sum == duration_sum > 0


def test_a_stream_observes_its_first_byte_at_its_start_and_its_duration_at_its_end():
    probe = BackendCall(_backend("bc-stream"), SimpleNamespace(method="tools/call", version=VERSION), "bc-stream")
    probe.sent(None)
    calls, _, (first, first_sum), (duration, _) = _values("bc-stream")
    assert (calls, sum(first), sum(duration)) == (0, 1, 0)
    probe.complete(ANSWER)
    probe.complete(ANSWER)  # a second final message changes nothing
    calls, tools, (first, first_sum_after), (duration, duration_sum) = _values("bc-stream")
    assert (calls, tools, sum(first), sum(duration)) == (1, 1, 1, 1)
    assert first_sum_after == first_sum and duration_sum >= first_sum


def test_a_whole_error_answer_and_a_gateway_failure_are_counted_by_their_code():
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}
    BackendCall(_backend("bc-error"), SimpleNamespace(method="tools/call", version=VERSION), "bc-error").sent(error)
    calls, tools, (first, _), (duration, _) = _values("bc-error", "error", "-32602", "-32602")
    assert (calls, tools, sum(first), sum(duration)) == (1, 1, 1, 1)
    failed = BackendCall(_backend("bc-failed"), SimpleNamespace(method="tools/call", version=VERSION), "bc-failed")
    failed.failed(rpc.McpError(rpc.BACKEND_TIMEOUT, "timed out"))
    label = metrics.code_label(rpc.BACKEND_TIMEOUT)
    calls, tools, (first, _), (duration, _) = _values("bc-failed", "timeout", label, label)
    assert (calls, tools, sum(first), sum(duration)) == (1, 1, 0, 1)  # no answer: no first byte


def test_a_whole_answer_lands_in_the_buckets_observe_would_put_it_in(monkeypatch):
    """The end of a backend call writes its Event inline: each histogram moves by one in the
    bucket `observe` would have chosen, a value on a bound included."""
    from gateway.observability import backend_call
    from gateway.observability import loop_metrics

    for n, seconds in enumerate([0.0, 0.0001, 0.01, 0.0123, 60.0, 61.0]):
        backend = f"bc-buckets-{n}"
        clock = iter([0.0, seconds])
        monkeypatch.setattr(backend_call.time, "perf_counter", lambda clock=clock: next(clock))
        BackendCall(_backend(backend), SimpleNamespace(method="tools/call", version=VERSION), backend).sent(ANSWER)
        first = metrics.BACKEND_SECONDS.labels(backend, "tools/call")
        duration = metrics.CLIENT_OPERATION.labels("tools/call", "", backend, VERSION, "tcp", "127.0.0.1")
        for child in (first, duration):
            expected = loop_metrics.HistogramValue(child.bounds)
            expected.observe(seconds)
            assert child.counts == expected.counts and child.sum == pytest.approx(seconds)


def _series_values():
    families = (metrics.BACKEND_REQUESTS, metrics.TOOL_CALLS, metrics.BACKEND_SECONDS, metrics.CLIENT_OPERATION)
    return {(family.name, values): (child.value if hasattr(child, "value") else (tuple(child.counts), child.sum))
            for family in families for values, child in family.items()}


def test_a_whole_answer_counted_without_the_object_moves_what_the_object_moves(monkeypatch):
    """dispatch.py `_send` counts an untraced whole answer with `answered`: for every kind of
    answer, the same series move by the same amounts as with `BackendCall(...).sent`."""
    from gateway.observability import backend_call

    answers = [ANSWER, {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "isError": True}},
               {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}},
               {"jsonrpc": "2.0", "id": 1, "error": {"code": "nope", "message": 7}}, {"jsonrpc": "2.0", "id": 1},
               ["not", "an", "object"]]
    for n, answer in enumerate(answers):
        moved = []
        for way in ("object", "function"):
            name = f"bc-same-{n}-{way}"  # its backend and its tool: series of its own
            call = SimpleNamespace(method="tools/call", version=VERSION)
            clock = iter([0.0, 0.0123] if way == "object" else [0.0123])  # sent at 0.0, answered at 0.0123
            monkeypatch.setattr(backend_call.time, "perf_counter", lambda clock=clock: next(clock))
            before = _series_values()
            if way == "object":
                BackendCall(_backend(name), call, name).sent(answer)
            else:
                backend_call.answered(_backend(name), call, name, 0.0, answer)
            after = _series_values()
            moved.append({(family, tuple(v.replace(name, "B") for v in values)): value
                          for (family, values), value in after.items() if before.get((family, values)) != value})
        assert moved[0] == moved[1] and len(moved[0]) == 4, (answer, moved)
