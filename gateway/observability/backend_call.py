"""BackendCall: one call to a backend, measured from its sending until its answer is complete
(a stream: its final message), the one seam every backend kind passes (dispatch.py `_send`).

It counts the call by backend, method, outcome and JSON-RPC code, observes
`mcp.client.operation.duration` (OpenTelemetry MCP conventions) and, with tracing on, holds
the CLIENT span and hands the dispatcher the call to send, with the span's context injected
(tracing.py `open_client_span`).
"""

from __future__ import annotations

import contextvars
import time
from bisect import bisect_left
from typing import Any

from gateway.observability import loop_metrics, metrics, otel_metrics, tracing
from gateway.protocol import jsonrpc as rpc

_GATEWAY_OUTCOMES = {
    rpc.BACKEND_UNAVAILABLE: "unavailable",
    rpc.BACKEND_TIMEOUT: "timeout",
    rpc.BACKEND_PROTOCOL_ERROR: "protocol",
}
# (backend, method, outcome, code, version, tool, whole answer) → its metric children: one
# probe per call.
_children: dict[tuple[Any, ...], tuple[loop_metrics.Event, dict[str, Any]]] = {}
# backend name → (network.transport, server.address) labels, made once.
_peers: dict[str, tuple[str, str]] = {}
# (backend, method) → the time-to-first-byte histogram child.
_first_byte: dict[tuple[str, str], Any] = {}


def _peer(backend: Any) -> tuple[str, str]:
    peer = _peers.get(backend.name)
    if peer is None:
        address = tracing.server_address(backend.settings)
        peer = _peers[backend.name] = (address["network.transport"], address.get("server.address", ""))
    return peer


# The BackendCall whose attempts are being sent in this task, while tracing is on: what the
# retry loop (backends/retry.py) and a backend moving to another endpoint reach through
# `next_attempt` and `note_endpoint`, without a parameter threaded through every send.
_SENDING: contextvars.ContextVar[BackendCall | None] = contextvars.ContextVar("mcp_gateway_backend_call",
                                                                              default=None)


def next_attempt(call: Any, error: str, message: str) -> Any:
    """The call is sent again (a retry, or another endpoint after one that could not be
    reached): with tracing on, the attempt that failed ends as its own CLIENT span (`error`:
    its error.type) and the next one opens; returns the call to send, with the new span's
    context injected. Without tracing, or outside a traced call: `call` as it is."""
    probe = _SENDING.get()
    if probe is None or probe.span is None:
        return call
    return probe.retry(error, message)


def note_endpoint(url: str) -> None:
    """The URL an HTTP backend POSTs this attempt to (server.address/server.port)."""
    if tracing._tracer is not None:
        tracing.note_endpoint(url)


class BackendCall:
    """One backend call; with tracing on, a CLIENT span per attempt (`retry`)."""

    __slots__ = ("backend", "call", "method", "tool", "started", "span", "token", "done", "original", "attempt",
                 "sending")

    def __init__(self, backend: Any, call: Any, tool: str = "", started: float | None = None) -> None:
        """`started`: the clock read when the call was sent, for an untraced call whose object
        is made only once its answer turns out to be a stream, or it failed (dispatch.py
        `_send`, `answered`); such a call opens no span."""
        self.backend = backend
        method = call.method
        self.method = method if method in metrics.METHOD_LABELS else metrics.OTHER  # method_label, inline
        self.tool = tool
        self.span = None
        self.token = None
        self.done = False
        self.sending = None
        if started is not None:
            self.call, self.started = call, started
            return
        if tracing._tracer is not None:
            self.original, self.attempt = call, 1
            self.span, self.token, call = tracing.open_client_span(backend, call)
            self.sending = _SENDING.set(self)
        self.call = call
        self.started = time.perf_counter()

    def retry(self, error: str, message: str) -> Any:
        """End this attempt's span as failed, open the next attempt's (a sibling: the parent is
        what was current before the first, the SERVER or a fan-out span); the call to send."""
        assert self.span is not None
        if self.token is not None:
            tracing.detach(self.token)
        tracing.close_failed_attempt(self.span, error, message)
        self.attempt += 1
        self.span, self.token, self.call = tracing.open_client_span(self.backend, self.original, self.attempt)
        return self.call

    def sent(self, message: Any) -> None:
        """The backend's answer has started; `message` is the whole answer when not a stream.
        A whole answer is complete at the moment it starts: one clock read, and its time to
        the first byte and its duration observed together (`_end`, `whole`)."""
        seconds = time.perf_counter() - self.started
        if self.sending is not None:  # traced and not detached yet (a token implies it)
            self._detach()
        if message is not None:
            self.complete(message, seconds)
            return
        key = (self.backend.name, self.method)
        child = _first_byte.get(key)
        if child is None:
            child = _first_byte[key] = metrics.backend_seconds_child(*key)
        child.observe(seconds)

    def complete(self, message: Any, seconds: float | None = None) -> None:
        """The final answer arrived (a backend's JSON-RPC error included). `seconds`: given by
        `sent` for a whole answer (its first byte not observed yet), None at a stream's end."""
        if self.done:
            return
        outcome, label, code, text, tool_error = _outcome(message)
        self._end(outcome, label, code, text, tool_error, seconds)

    def failed(self, exc: rpc.McpError) -> None:
        """The gateway made the error (unreachable, timeout, protocol violation)."""
        self._detach()
        if self.done:
            return
        self._end(_GATEWAY_OUTCOMES.get(exc.code, "error"), metrics.code_label(exc.code), exc.code, exc.message, False)

    def abandoned(self) -> None:
        """Closed or cancelled before its final answer (the client went away)."""
        self._detach()
        if not self.done:
            self._end("cancelled", metrics.OTHER, None, "cancelled before the answer was complete", False)

    def _end(self, outcome: str, label: str, code: int | None, message: str | None, tool_error: bool,
             seconds: float | None = None) -> None:
        """The call's counters and duration; `seconds` given: a whole answer, whose time to the
        first byte is these same seconds, observed by the same Event."""
        whole = seconds is not None
        self.done = True
        if seconds is None:
            seconds = time.perf_counter() - self.started
        _count(self.backend, self.method, self.call.version, self.tool, outcome, label, seconds, whole)
        if self.span is not None:
            tracing.close_client_span(self.span, code, message, tool_error)
            self.span = None

    def _detach(self) -> None:
        if self.token is not None:
            tracing.detach(self.token)
            self.token = None
        if self.sending is not None:
            _SENDING.reset(self.sending)
            self.sending = None


_OK = (metrics.OK, metrics.OK, None, None, False)
_TOOL_ERROR = (metrics.TOOL_ERROR, metrics.TOOL_ERROR, None, None, True)


def _outcome(message: Any) -> tuple[str, str, int | None, str | None, bool]:
    """A final answer's (outcome, code label, JSON-RPC code, error message, isError)."""
    if not isinstance(message, dict):
        return _OK
    error = message.get("error")
    if isinstance(error, dict):
        code = error.get("code") if type(error.get("code")) is int else rpc.INTERNAL_ERROR
        return "error", metrics.code_label(code), code, error.get("message"), False
    result = message.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return _TOOL_ERROR
    return _OK


def _count(backend: Any, method: str, version: str, tool: str, outcome: str, label: str, seconds: float,
           whole: bool) -> None:
    """One call's counters and duration (and its first byte, `whole`), by its labels' Event."""
    key = (backend.name, method, outcome, label, version, tool, whole)
    children = _children.get(key)
    if children is None:
        children = _new_children(key, backend)
    event = children[0]  # the call and tool counters, its duration (and first byte): Event.add, inline
    event.counts[bisect_left(event.bounds, seconds)] += 1
    event.sum += seconds
    if otel_metrics.client_duration is not None:
        otel_metrics.client_duration.record(seconds, children[1])


def _new_children(key: tuple[Any, ...], backend: Any) -> tuple[loop_metrics.Event, dict[str, Any]]:
    """The metric children of a combination of labels (`_count`'s key), made and kept."""
    name, method, outcome, label, version, tool, whole = key
    transport, address = _peer(backend)
    error = "" if label == metrics.OK else "_OTHER" if label == metrics.OTHER else label
    if outcome == "cancelled":
        error = "cancelled"
    counters = [metrics.backend_requests_child(name, method, outcome, label)]
    if method == "tools/call":
        counters.append(metrics.TOOL_CALLS.labels(name, tool or metrics.OTHER, label))
    histograms = [metrics.CLIENT_OPERATION.labels(method, error, tool, version, transport, address)]
    if whole:
        histograms.append(metrics.backend_seconds_child(name, method))
    children = _children[key] = (
        loop_metrics.event(counters, histograms),
        otel_metrics.attributes(method, error, tool, version, transport, address),
    )
    return children


def answered(backend: Any, call: Any, tool: str, started: float, message: Any) -> None:
    """An untraced call's whole answer, counted as `BackendCall(backend, call, tool).sent(message)`
    counts it, without the object (dispatch.py `_send`): most calls, and an object per call
    with its attribute writes and a method call per step was a measurable share of each."""
    seconds = time.perf_counter() - started
    method = call.method
    outcome, label = _outcome(message)[:2]
    _count(backend, method if method in metrics.METHOD_LABELS else metrics.OTHER, call.version, tool, outcome, label,
           seconds, True)
