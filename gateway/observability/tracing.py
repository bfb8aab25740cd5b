"""OpenTelemetry tracing: one server span per MCP request, continued from the client's W3C
`traceparent`, and the gateway's span context sent on to the backend (digest §j: propagate
trace context). Off unless configured; when off, no span objects are made on the hot path."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("gateway.tracing")

_tracer: trace.Tracer | None = None


def configure(enabled: bool, exporter: str = "console", service_name: str = "mcp-gateway", *,
              span_exporter: SpanExporter | None = None) -> None:
    """Make the gateway's tracer. `exporter`: console, or otlp (OTLP/HTTP, from the optional
    `otlp` extra). `span_exporter` replaces
    it with an exporter object that gets each span as it ends (tests, debugging).

    The tracer comes from the gateway's own SDK provider, which is also installed as the
    global one the first time (OpenTelemetry allows that once per process): a later
    `configure` still takes effect for the gateway's spans."""
    global _tracer
    if not enabled:
        _tracer = None
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(exporter)))
    if not _provider_installed():
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer("mcp-gateway")


def _provider_installed() -> bool:
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _exporter(exporter: str) -> SpanExporter:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise RuntimeError("observability.tracing_exporter=otlp needs the package "
                               "opentelemetry-exporter-otlp-proto-http: pip install 'mcp-gateway[otlp]'") from None
        return OTLPSpanExporter()
    return ConsoleSpanExporter()


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
