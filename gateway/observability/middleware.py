"""RequestTelemetry: the outermost step of the pipeline. It reads the method from the
`Mcp-Method` header (header-first: no body needed), times the answer to its last byte, and
counts it by status, so that even requests refused by a policy are seen."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

from gateway import asgi
from gateway.observability import metrics, tracing


class RequestTelemetry:
    def __init__(self, app: asgi.ASGIApp, *, path: str) -> None:
        self.app = app
        self.path = path
        # (method label, status) → its request counter and duration histogram: one dict probe
        # per request instead of two label lookups and a status string (both label sets are
        # bounded: metrics.py).
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        headers = asgi.request_headers(scope)
        method = metrics.method_label(headers.get("mcp-method"))
        status = 500
        started = time.perf_counter()
        span = tracing.start_request_span(method, headers) if tracing.enabled() else None

        def send_noting_status(message: asgi.Message) -> Awaitable[None]:
            # A plain function handing back the server's own awaitable: an `async def` here
            # would make one more coroutine per message sent (bench/README.md "Third round").
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            return send(message)

        metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            metrics.in_flight.dec()
            children = self._children.get((method, status))
            if children is None:
                label = metrics.status_label(status)
                children = self._children[(method, status)] = (
                    metrics.requests_child(method, label), metrics.request_seconds_child(method))
            children[0].inc()
            children[1].observe(time.perf_counter() - started)
            if span is not None:
                tracing.end_request_span(span, status)
