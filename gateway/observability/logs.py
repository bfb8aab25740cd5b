"""Logs: the gateway's and uvicorn's on one stream in one format, and the access log.

`observability.log_format: json` writes one JSON object per line (`time`, `level`, `logger`,
`message`, and `request_id` / `trace_id` when the line was logged while a request was being
answered); `text` keeps the one-line human format with the request id appended. Both go to
stdout; spans of the console exporter go to stderr (tracing.py), so neither interleaves the
other.

The access line is not a `logging` record: a record, its formatting and the handler's lock and
flush cost ~10 µs, a per-request price the pass-through budget cannot pay. Lines are written
from pieces encoded once (their start per millisecond, their bounded fields per combination;
orjson for the rest) and held for one write per batch (`AccessLog`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import os
import random
import sys
import time
from typing import Any

import orjson

from gateway.observability import tracing
from gateway.observability.record import CURRENT, RequestRecord

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


_last: list[Any] = [-1, ""]  # the last millisecond formatted, and its text
_second: list[Any] = [-1, ""]  # the last second formatted, and its text


def _timestamp(created: float) -> str:
    """ISO 8601 UTC with milliseconds (truncated). Made once per millisecond, its date and
    time part once per second: a datetime per line cost more than the rest of an access line,
    and a busy gateway writes many lines per millisecond."""
    ms = int(created * 1000)
    if ms == _last[0]:
        return _last[1]
    second = ms // 1000
    if second != _second[0]:
        _second[0], _second[1] = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    text = f"{_second[1]}.{ms % 1000:03d}Z"
    _last[0], _last[1] = ms, text
    return text


# The start of an access line up to its request id: the constant fields and the time. Its
# date and time up to the second are encoded once per second; the milliseconds and the rest
# once per millisecond (`_new_access_head`), rather than joined per line.
_ACCESS_HEAD = b'{"level":"info","logger":"gateway.access","message":"mcp request","time":"'
_last_head: list[Any] = [-1, b""]  # the millisecond of the last line, and its start
_head_second: list[Any] = [-1, b""]  # the second of the last line, and its start to the "."


def _new_access_head(ms: int) -> bytes:
    """The start of the lines of millisecond `ms` (since the epoch), made once for all of them:
    the time as `_timestamp` writes it (ISO 8601 UTC, milliseconds truncated)."""
    second = ms // 1000
    if second != _head_second[0]:
        _head_second[0] = second
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _head_second[1] = b"%s%s." % (_ACCESS_HEAD, text.encode())
    _last_head[0], _last_head[1] = ms, b'%s%03dZ","request_id":"' % (_head_second[1], ms % 1000)
    return _last_head[1]


# True in the task serving a listener other than the MCP one (lifecycle.Listener `secondary`).
SECONDARY_LISTENER: contextvars.ContextVar[bool] = contextvars.ContextVar("mcp_gateway_secondary_listener",
                                                                          default=False)


class OneBanner(logging.Filter):
    """On uvicorn's loggers: the start and stop lines of a secondary listener (the operations
    listener, the demo backend) are dropped, so that one process says "Started server process"
    once. uvicorn's servers share their logger (and its level: each `uvicorn.Config` sets it),
    so neither a handler nor a level can tell the listeners apart; the serving task can."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not SECONDARY_LISTENER.get()


class RequestContext(logging.Filter):
    """Adds the current request's id and trace id to every record logged while it runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = CURRENT.get()
        record.request_id = current.request_id if current is not None else None
        record.trace_id = tracing.current_trace_id()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "trace_id"):
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        for key, value in record.__dict__.items():  # `extra=` fields, e.g. uvicorn's
            if key not in _RESERVED and key not in out and not key.startswith("_") and key not in (
                    "request_id", "trace_id", "color_message"):
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [request_id={request_id}]" if request_id else line


def configure(level: str, log_format: str, stream: Any = None) -> logging.Handler:
    """One handler on the root logger for everything (the gateway's loggers and uvicorn's, which
    propagate once uvicorn is run with `log_config=None`)."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestContext())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
        if not any(isinstance(f, OneBanner) for f in uv.filters):
            uv.addFilter(OneBanner())
    # httpx logs every upstream request at INFO: one line per call is noise, not signal.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return handler


# An access line's fields whose values come from small sets (method, backend, HTTP status,
# JSON-RPC code, cache outcome, era) are encoded once per combination, its "shape", and kept;
# per line only the request and trace ids, the name, the duration and the subject are. At most
# this many shapes are kept: past it (a backend sending many codes of its own, say) a line's
# shape is encoded for that line alone, the same bytes, only slower.
_MAX_SHAPES = 512
_NULL = b"null"
_dumps = orjson.dumps


def _shape(method: str | None, backend: str | None, status: int, jsonrpc_code: int | str | None,
           cache: str | None, era: str) -> tuple[bytes, ...]:
    """The encoded fields of a shape, as the runs of bytes between the per-line values: [0] from
    the trace id to the name, with no trace id (tracing off: the common case), [1] the same
    after a trace id, [2] from the name to the duration, [3] from the duration to the end with
    no subject (no authentication: the common case), [4] and [5] before and after a subject."""
    method_to_name = b',"method":%s,"name":' % _dumps(method)
    cache_to_subject = b',"cache":%s,"subject":' % _dumps(cache)
    era_to_end = b',"era":%s}\n' % _dumps(era)
    return (b'","trace_id":null' + method_to_name,
            method_to_name,
            b',"backend":%s,"status":%s,"jsonrpc_code":%s,"duration_ms":' % (
                _dumps(backend), _dumps(status), _dumps(jsonrpc_code)),
            cache_to_subject + _NULL + era_to_end,
            cache_to_subject,
            era_to_end)

# Access lines are held at most this long, or until this many wait: one write per batch, not
# per request (a write per loop pass was most of the access log's cost under load).
_FLUSH_SECONDS = 0.05
_FLUSH_LINES = 256


class AccessLog:
    """One line per MCP request, written in batches (at most `_FLUSH_SECONDS` late; what is
    held is written at exit too)."""

    def __init__(self, *, log_format: str = "json", sample: float = 1.0, fd: int | None = None) -> None:
        self.json = log_format == "json"
        self.sample = sample
        self.fd = sys.stdout.fileno() if fd is None else fd
        self._pending: list[bytes] = []
        self._scheduled = False
        self._shapes: dict[tuple[Any, ...], tuple[bytes, ...]] = {}
        self.written = 0
        # The line's format is chosen once, and so is whether sampling can drop anything: the
        # per-request call is one bound method that builds nothing for a line sampled out.
        self._encode = self._json_line if self.json else self._text_line
        self.log = self._log_all if sample >= 1.0 else self._log_sampled
        atexit.register(self.flush)

    def wants(self, record: RequestRecord) -> bool:
        # Errors are always logged; successes by the configured share.
        return (self.sample >= 1.0 or record.status >= 400 or record.code is not None or record.tool_error
                or random.random() < self.sample)

    def _log_sampled(self, record: RequestRecord, seconds: float, trace_id: str | None,
                     shape: tuple[bytes, ...] | None = None) -> None:
        if (record.status < 400 and record.code is None and not record.tool_error
                and random.random() >= self.sample):
            return  # sampled out, before anything is built
        self._log_all(record, seconds, trace_id, shape)

    def _log_all(self, record: RequestRecord, seconds: float, trace_id: str | None,
                 shape: tuple[bytes, ...] | None = None) -> None:
        """`shape`: the record's `shape_of`, when the caller keeps it already (RequestTelemetry
        does, with the record's metric children: one lookup per request for both)."""
        pending = self._pending
        pending.append(self._encode(record, seconds, trace_id, shape))
        if len(pending) >= _FLUSH_LINES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_later(_FLUSH_SECONDS, self.flush)
            except RuntimeError:
                self.flush()

    def shape_of(self, record: RequestRecord) -> tuple[bytes, ...]:
        """The encoded bounded fields of the record's line (`_shape`), kept per combination."""
        code = record.code
        key = (record.method, record.backend, record.status,
               code if code is not None else "tool_error" if record.tool_error else None, record.cache, record.era)
        shape = self._shapes.get(key)
        if shape is None:
            shape = _shape(*key)
            if len(self._shapes) < _MAX_SHAPES:
                self._shapes[key] = shape
        return shape

    def _json_line(self, record: RequestRecord, seconds: float, trace_id: str | None,
                   shape: tuple[bytes, ...] | None = None) -> bytes:
        """The line, field for field what `orjson.dumps` of the record's fields would write
        (tests/unit/test_access_line.py holds it to that): its start cached per millisecond,
        its shape per combination of bounded values (`shape_of`), and per line one join of the
        rest. The request id needs no JSON escaping: `request_id_from` admits only
        `A-Za-z0-9._:/+=-` and generates hex. The name and the subject come from the request
        and are escaped by orjson."""
        if shape is None:
            shape = self.shape_of(record)
        ms = int(time.time() * 1000)
        name, subject = record.name, record.subject
        return b"".join((
            _last_head[1] if ms == _last_head[0] else _new_access_head(ms),
            record.request_id.encode(),
            shape[0] if trace_id is None else b'","trace_id":"%s"%s' % (trace_id.encode(), shape[1]),
            _NULL if name is None else _dumps(name),
            shape[2], _dumps(seconds * 1000.0),
            shape[3] if subject is None else b"%s%s%s" % (shape[4], _dumps(subject), shape[5])))

    def _text_line(self, record: RequestRecord, seconds: float, trace_id: str | None,
                   shape: tuple[bytes, ...] | None = None) -> bytes:
        fields = orjson.loads(self._json_line(record, seconds, trace_id, shape))
        return (" ".join(f"{k}={v}" for k, v in fields.items() if v is not None and k not in ("level", "logger"))
                + "\n").encode()

    def flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        # Lines counted as held, not by scanning the batch for newlines (which cost more than
        # encoding a line's bounded fields: bench/README.md "The ≤ 5 µs budget, counted right").
        self.written += len(self._pending)
        data, self._pending = b"".join(self._pending), []
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass  # a closed stdout must not break answering
