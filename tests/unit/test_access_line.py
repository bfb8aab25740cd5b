"""The access line's encoder (observability/logs.py `AccessLog._json_line`) writes from cached
pieces (its start per millisecond, the bounded fields per shape); these hold it, byte for byte,
to what one `orjson.dumps` of the record's fields writes: the documented line."""

from __future__ import annotations

import itertools
import json
import os
import time

import orjson
import pytest

from gateway.observability import logs
from gateway.observability.logs import AccessLog
from gateway.observability.record import RequestRecord, request_id_from

NAMES = [None, "echo", "a_b-c.d", 'quote"d', "back\\slash", "new\nline", "tab\tand\x00nul\x1f", "é ü 漢字", "emoji 🙂",
         "</script>", "", "x" * 300, "file:///tmp/a b.txt"]
SUBJECTS = [None, "alice", 'mallory"},"status":500', "ünïcode\u2028sep"]
CODES = [(None, False), (None, True), (-32602, False), (-32000, False), (12345, False)]
REQUEST_IDS = ["abc", "A-Za-z0-9._:/+=", "0123456789abcdef" * 8, None]  # None: a generated one


def reference(record: RequestRecord, seconds: float, trace_id: str | None, now: float) -> bytes:
    """The line as one orjson call over the fields would write it (the encoder before the cache)."""
    code = record.code
    return orjson.dumps({
        "level": "info", "logger": "gateway.access", "message": "mcp request", "time": logs._timestamp(now),
        "request_id": record.request_id, "trace_id": trace_id, "method": record.method, "name": record.name,
        "backend": record.backend, "status": record.status,
        "jsonrpc_code": code if code is not None else "tool_error" if record.tool_error else None,
        "duration_ms": seconds * 1000.0, "cache": record.cache, "subject": record.subject, "era": record.era,
    }, option=orjson.OPT_APPEND_NEWLINE)


def records():
    combos = itertools.product(["tools/call", "resources/read", "other", None], ["bench", None], [200, 404, 502],
                               CODES, [None, "hit", "bypass"], ["modern", "legacy"])
    for i, (method, backend, status, (code, tool_error), cache, era) in enumerate(combos):
        rid = REQUEST_IDS[i % len(REQUEST_IDS)]
        record = RequestRecord(request_id_from(rid), 0.0, era, {})
        record.method, record.backend, record.status, record.cache = method, backend, status, cache
        record.code, record.tool_error = code, tool_error
        record.name, record.subject = NAMES[i % len(NAMES)], SUBJECTS[i % len(SUBJECTS)]
        trace = None if i % 3 else f"{i:032x}"
        seconds = [0.0, 1e-7, 0.000123456789, 0.5, 12.25, 1234567.0][i % 6]
        yield record, seconds, trace


@pytest.fixture
def log():
    fd = os.open(os.devnull, os.O_WRONLY)
    yield AccessLog(log_format="json", fd=fd)
    os.close(fd)


@pytest.fixture
def frozen_clock(monkeypatch):
    now = 1_764_000_000.123
    monkeypatch.setattr(time, "time", lambda: now)
    return now


def test_every_field_is_what_one_orjson_call_over_the_record_writes(log, frozen_clock):
    checked = 0
    for record, seconds, trace in records():
        line = log._json_line(record, seconds, trace)
        assert line == reference(record, seconds, trace, frozen_clock), (record.__dict__, seconds, trace)
        assert json.loads(line)["name"] == record.name  # and it parses back
        checked += 1
    # Again, now every shape is cached: the cached pieces give the same bytes as fresh ones.
    for record, seconds, trace in records():
        assert log._json_line(record, seconds, trace) == reference(record, seconds, trace, frozen_clock)
    assert checked == 720 and 0 < len(log._shapes) <= logs._MAX_SHAPES


def test_past_the_shape_limit_lines_are_the_same_and_nothing_more_is_kept(log, frozen_clock, monkeypatch):
    monkeypatch.setattr(logs, "_MAX_SHAPES", 3)
    for record, seconds, trace in records():
        assert log._json_line(record, seconds, trace) == reference(record, seconds, trace, frozen_clock)
    assert len(log._shapes) == 3


def test_the_line_start_follows_the_clock(log, monkeypatch):
    record, seconds, trace = next(records())
    for now in (86_400.0015, 86_400.0015, 86_400.0029, 86_401.0, 1e9 + 0.999):
        monkeypatch.setattr(time, "time", lambda: now)
        assert log._json_line(record, seconds, trace) == reference(record, seconds, trace, now)


def test_client_request_ids_that_would_need_escaping_are_never_taken():
    # The encoder writes the request id unescaped: request_id_from must never let through a
    # character JSON would escape.
    for bad in ('a"b', "a\\b", "a\nb", "é", "a b", "\x00"):
        taken = request_id_from(bad)
        assert taken != bad and orjson.dumps(taken) == b'"%s"' % taken.encode()
    allowed = "".join(chr(c) for c in range(128) if request_id_from(chr(c)) == chr(c))
    assert orjson.dumps(allowed) == b'"%s"' % allowed.encode() and len(allowed) == 62 + len("._:/+=-")


def test_generated_request_ids_are_the_process_prefix_and_a_hex_counter_taken_as_they_are():
    # record.new_request_id is a C-level iterator's `__next__` (no Python frame per request):
    # still this process's prefix, a dash and the next counter value in hex, unique, and plain
    # enough for the encoder and for request_id_from.
    from gateway.observability import record

    ids = [record.new_request_id() for _ in range(300)]
    prefix, first = ids[0].rsplit("-", 1)
    assert prefix == record._PREFIX and len(prefix) == 12
    assert ids == [f"{prefix}-{int(first, 16) + n:x}" for n in range(300)]
    assert all(request_id_from(rid) == rid for rid in ids)


def test_lines_written_through_the_end_of_a_request_are_the_same(log, frozen_clock, monkeypatch):
    """RequestTelemetry keeps each line's shape with the record's metric children (one lookup
    for both): the lines it has written are the reference's, remembered or past the limit."""
    from gateway.observability import middleware
    from gateway.observability.middleware import RequestTelemetry

    monkeypatch.setattr(time, "perf_counter", lambda: 2.5)  # every request took 2.5 s
    for limit in (middleware._MAX_RECORD_KEYS, 7):
        monkeypatch.setattr(middleware, "_MAX_RECORD_KEYS", limit)
        telemetry = RequestTelemetry(None, path="/mcp", access_log=log)  # type: ignore[arg-type]
        log._scheduled = True  # lines held, not written (no loop runs here to flush them)
        for _ in range(2):  # the second time from the remembered shapes
            for record, _seconds, _trace in records():
                log._pending.clear()
                telemetry._finish(record, {}, {})
                assert log._pending == [reference(record, 2.5, None, frozen_clock)], record.__dict__
        assert len(telemetry._by_record) == min(limit, 720)
