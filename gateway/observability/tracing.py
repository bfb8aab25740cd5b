"""OpenTelemetry tracing: one server span per MCP request, continued from the client's W3C
`traceparent`, and the gateway's span context sent on to the backend (digest §j: propagate
trace context). Off unless configured; when off, no span objects are made on the hot path."""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject

log = logging.getLogger("gateway.tracing")

_tracer: trace.Tracer | None = None


def configure(enabled: bool, exporter: str = "console", service_name: str = "mcp-gateway") -> None:
    """Install an SDK tracer provider. `exporter`: console, or otlp when the
    opentelemetry-exporter-otlp package is installed (it is optional)."""
    global _tracer
    if not enabled:
        _tracer = None
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    span_exporter: SpanExporter
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise RuntimeError("observability.tracing_exporter=otlp needs the package opentelemetry-exporter-otlp"
                               ) from None
        span_exporter = OTLPSpanExporter()
    else:
        span_exporter = ConsoleSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("mcp-gateway")


def enabled() -> bool:
    return _tracer is not None


def start_request_span(method: str, headers: dict[str, str]) -> tuple[Any, Any] | None:
    """Start the server span for one request; returns (span, context token) or None."""
    if _tracer is None:
        return None
    parent = extract(headers)
    span = _tracer.start_span(f"mcp {method}", context=parent, kind=trace.SpanKind.SERVER,
                              attributes={"mcp.method.name": method, "rpc.system": "jsonrpc"})
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    return span, token


def end_request_span(handle: tuple[Any, Any] | None, status: int) -> None:
    if handle is None:
        return
    span, token = handle
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(trace.Status(trace.StatusCode.ERROR))
    span.end()
    otel_context.detach(token)


def outgoing_headers() -> dict[str, str]:
    """traceparent/tracestate for an upstream call made inside the current span."""
    if _tracer is None:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier
