"""RequestTelemetry: the outermost step of the pipeline. Every MCP request gets a request id
(the client's `X-Request-Id` when it is plain and short, else a new one; echoed in the answer),
a `RequestRecord` the inner layers fill in (record.py), and when it ends: its metrics, its
SERVER span and its access line. Requests refused by a policy are seen too.

Modern requests name their method in the `Mcp-Method` header, so nothing is parsed here; the
span opens when the dispatcher has the validated call (its `params._meta` holds the parent).
Initialize-era clients (no `Mcp-Method`) and HTTP+SSE messages are read as the app reads them:
the method, name and id come from their body (`_peek`), which costs them one more decode.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

import orjson

from gateway import asgi
from gateway.observability import loop_metrics, metrics, otel_metrics, tracing
from gateway.observability.logs import AccessLog
from gateway.observability.metrics import METHOD_LABELS
from gateway.observability.record import CURRENT, RequestRecord, new_request_id, request_id_from

# Combinations of a record's raw values remembered with their metric children and access line
# shape (`_finish`).
_MAX_RECORD_KEYS = 4096
# Read and written inline (`.own`): two method calls per request were a measurable share.
_in_flight = metrics.in_flight


class RequestTelemetry:
    def __init__(self, app: asgi.ASGIApp, *, path: str, legacy_paths: tuple[str, ...] = (),
                 access_log: AccessLog | None = None, max_body_bytes: int = 4 * 1024 * 1024,
                 view_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self.path = path
        # The MCP endpoints (the main path and the views'), then the HTTP+SSE message paths.
        self.mcp_paths = frozenset((path, *view_paths))
        self.legacy_paths = frozenset(legacy_paths)
        self.access_log = access_log
        self.max_body_bytes = max_body_bytes
        # label tuple → its loop-owned metric children: one dict probe per request instead of
        # several label lookups (every label set is bounded: metrics.py).
        self._children: dict[tuple[Any, ...], tuple[loop_metrics.Event, dict[str, Any]]] = {}
        # The record's raw values → the same children: no label worked out per request (`_finish`).
        self._by_record: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # (Event, attributes[, line shape])

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or (
                scope["path"] not in self.mcp_paths and scope["path"] not in self.legacy_paths):
            await self.app(scope, receive, send)
            return
        headers = asgi.request_headers(scope)
        header_method = headers.get("mcp-method")
        given_id = headers.get("x-request-id")
        request_id = new_request_id() if given_id is None else request_id_from(given_id)
        era = "modern" if header_method is not None else "legacy"
        record = RequestRecord(request_id, time.perf_counter(), era, scope, send)
        if header_method is not None:
            # metrics.method_label, inline (once per request)
            record.method = header_method if header_method in METHOD_LABELS else metrics.OTHER
        else:
            if scope["path"] not in self.mcp_paths:
                record.transport = "sse"
            record.version = headers.get("mcp-protocol-version")
            receive = self._peek(record, receive)
        token = CURRENT.set(record)
        _in_flight.own += 1
        try:
            await self.app(scope, receive, record.send_noting)
        finally:
            _in_flight.own -= 1
            record.finished = True
            CURRENT.reset(token)
            self._finish(record, scope, headers)

    def _finish(self, record: RequestRecord, scope: asgi.Scope, headers: dict[str, str]) -> None:
        seconds = time.perf_counter() - record.started
        # The record's own values are the key (the labels and the access line's bounded fields
        # are functions of them, worked out by `_series` and `shape_of` once per combination):
        # nothing is worked out per request. Raw values may come from the client (a method, a
        # version) or a backend (a code), so at most `_MAX_RECORD_KEYS` are kept; past that,
        # the labels and the shape are worked out per request.
        key = (record.method, record.era, record.status, record.code, record.tool_error, record.version,
               record.tool_label, record.backend, record.cache)
        found = self._by_record.get(key)
        if found is None:
            found = self._series(record)
            if self.access_log is not None:
                found = (*found, self.access_log.shape_of(record))
            if len(self._by_record) < _MAX_RECORD_KEYS:
                self._by_record[key] = found
        event = found[0]  # the request counter and both duration histograms: Event.add, inline
        event.counts[bisect_left(event.bounds, seconds)] += 1
        event.sum += seconds
        if otel_metrics.server_duration is not None:
            otel_metrics.server_duration.record(seconds, found[1])
        if record.era == "legacy" and record.translation is None:
            record.translation = "legacy-client"
        trace_id = None
        if tracing._tracer is not None:
            if record.span is None:
                # Never dispatched (refused by a policy, unparseable, answered by the gateway
                # session itself): the span is made now, with the request's arrival as its start.
                tracing.open_server_span(record, headers)
            trace_id = format(record.span.get_span_context().trace_id, "032x")
            tracing.close_server_span(record)
        if self.access_log is not None:
            self.access_log.log(record, seconds, trace_id, found[2])  # sampling decided inside, first

    def _series(self, record: RequestRecord) -> tuple[loop_metrics.Event, dict[str, Any]]:
        """The request's metric labels, from the record, and their loop-owned children (one
        Event for the counter and the two histograms, the OTLP attributes)."""
        method = metrics.method_label(record.method)
        if record.code is not None:
            code = metrics.code_label(record.code)
        elif record.tool_error:
            code = metrics.TOOL_ERROR
        else:
            code = metrics.OK if record.status < 400 else metrics.NONE
        # tools/call: the tool's own series when the route table knows the name (dispatch
        # sets `tool_label`), else "other".
        tool = (record.tool_label or metrics.OTHER) if method == "tools/call" else ""
        version = _version_label(record.version)  # a legacy client's is its raw header
        key = (method, record.era, record.status, code, version, tool)
        children = self._children.get(key)
        if children is None:
            error = {metrics.OK: "", metrics.OTHER: "_OTHER", metrics.NONE: str(record.status)}.get(code, code)
            children = self._children[key] = (
                loop_metrics.event([metrics.requests_child(method, record.era, metrics.status_label(record.status), code)],
                                   [metrics.request_seconds_child(method, record.era),
                                    metrics.SERVER_OPERATION.labels(method, error, tool, version, "tcp")]),
                otel_metrics.attributes(method, error, tool, version, "tcp"),
            )
        return children

    def _peek(self, record: RequestRecord, receive: asgi.Receive) -> asgi.Receive:
        """`receive`, noting the method, name, id and `_meta` of the body it delivers."""
        chunks: list[bytes] = []
        size = 0

        async def peeking() -> asgi.Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request" and size >= 0:
                body = message.get("body", b"")
                size += len(body)
                if size > self.max_body_bytes:
                    size = -1  # refused by the size limit: not read here either
                    chunks.clear()
                else:
                    chunks.append(body)
                    if not message.get("more_body", False):
                        _note_body(record, b"".join(chunks))
                        chunks.clear()
            return message

        return peeking


_VERSIONS: dict[str | None, str] = {None: ""}


def _version_label(version: str | None) -> str:
    """mcp.protocol.version as a label: only the versions the gateway speaks."""
    label = _VERSIONS.get(version)
    if label is None:
        from gateway.protocol.versions import BACKEND_LEGACY_VERSIONS, MODERN_VERSIONS

        label = version if version in (*MODERN_VERSIONS, *BACKEND_LEGACY_VERSIONS) else metrics.OTHER  # type: ignore[assignment]
        if len(_VERSIONS) < 64:
            _VERSIONS[version] = label  # type: ignore[assignment]
    return label  # type: ignore[return-value]


def _note_body(record: RequestRecord, body: bytes) -> None:
    """What an initialize-era message says about itself (a batch: its first request)."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(message, list):
        message = next((m for m in message if isinstance(m, dict) and "method" in m), None)
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return
    record.method = metrics.method_label(message["method"])
    record.jsonrpc_id = message.get("id") if isinstance(message.get("id"), (str, int)) else None
    params = message.get("params")
    if isinstance(params, dict):
        name = params.get("uri") if record.method == "resources/read" else params.get("name")
        record.name = name if isinstance(name, str) else None
        meta = params.get("_meta")
        record.meta = meta if isinstance(meta, dict) else None
        version = params.get("protocolVersion")
        if record.method == "initialize" and isinstance(version, str):
            record.version = version
