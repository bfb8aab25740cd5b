"""OpenTelemetry tracing after the MCP semantic conventions (OpenTelemetry GenAI conventions,
`gen-ai/mcp.md`, Development): a SERVER span per MCP request, a CLIENT span per backend call,
INTERNAL spans for the work that takes time, and trace context carried in `params._meta`
(`traceparent`, `tracestate`, `baggage`) as well as in HTTP headers (docs/observability.md).

Off unless configured; when off, no span object is made and nothing is injected. The provider
honours the standard variables: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (the service is
"mcp-gateway" only when neither names one), OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
(the SDK reads them), OTEL_EXPORTER_OTLP_* for the otlp exporter.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from gateway import __version__
from gateway.observability import metrics
from gateway.observability.record import CURRENT, RequestRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from gateway.protocol.request import Call

log = logging.getLogger("gateway.tracing")
F = TypeVar("F", bound=Callable[..., Any])

TRACER_NAME = "mcp-gateway"
_CONTEXT_KEYS = ("traceparent", "tracestate", "baggage")
_tracer: trace.Tracer | None = None
_provider: Any = None


def configure(enabled: bool, exporter: str = "console", *, span_exporter: SpanExporter | None = None) -> None:
    """Make the gateway's tracer. `exporter`: console (one JSON line per span, on stderr), or
    otlp (OTLP/HTTP, from the optional `otlp` extra). `span_exporter` replaces it with an
    exporter object that gets each span as it ends (tests, debugging).

    The tracer comes from the gateway's own SDK provider, which is also installed as the global
    one the first time (OpenTelemetry allows that once per process): a later `configure` still
    takes effect for the gateway's spans."""
    global _tracer, _provider
    if _provider is not None:
        # Flushed, not shut down: shutting the provider down would stop its exporter, which a
        # caller may hand to the next `configure` (tests do).
        _provider.force_flush()
        _provider = None
    if not enabled:
        _tracer = None
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=resource(Resource))  # sampler: OTEL_TRACES_SAMPLER*
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(exporter)))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME, __version__)


def resource(resource_cls: Any) -> Any:
    """The SDK resource: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win; the gateway only
    fills what they leave out (service.name, service.version)."""
    detected = resource_cls.create({})
    own = {"service.version": __version__}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        own["service.name"] = "mcp-gateway"
    return resource_cls(own).merge(detected) if "service.name" not in own else detected.merge(resource_cls(own))


def _exporter(exporter: str) -> SpanExporter:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise RuntimeError("observability.tracing_exporter=otlp needs the package "
                               "opentelemetry-exporter-otlp-proto-http: pip install 'mcp-gateway[otlp]'") from None
        return OTLPSpanExporter()
    # One line per span, on stderr: stdout carries the logs, one JSON object per line.
    return ConsoleSpanExporter(out=sys.stderr, formatter=span_line)


def span_line(span: Any) -> str:
    """One span as one JSON line: the fields of the SDK's `to_json` that say what happened
    (without the resource, the same on every line), encoded by orjson: `to_json` cost ~5x more
    per span, in the exporter thread that shares the interpreter with the requests."""
    ctx = span.context
    parent = span.parent
    return orjson.dumps({
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "kind": span.kind.name,
        "start_time_ns": span.start_time,
        "end_time_ns": span.end_time,
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [{"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x"),
                   "attributes": dict(link.attributes or {})} for link in span.links],
    }, default=str).decode() + "\n"


def enabled() -> bool:
    return _tracer is not None


# -- the SERVER span ----------------------------------------------------------------------------

def open_server_span(record: RequestRecord, headers: dict[str, str]) -> Any:
    """Start the request's SERVER span (start time: the request's arrival); returns the context
    to make current (`attach`) while the request's work runs, in the task that runs it.
    Parent: the context in `params._meta` when there is one, else the HTTP headers' (the
    conventions: "use context extracted from MCP params._meta as a parent ... and link the
    ambient context"); the HTTP context becomes a link when both are there and differ."""
    assert _tracer is not None
    ambient = extract(headers)
    parent = ambient
    links: list[Link] = []
    meta = record.meta
    if meta and isinstance(meta.get("traceparent"), str):
        carrier = {k: meta[k] for k in _CONTEXT_KEYS if isinstance(meta.get(k), str)}
        from_meta = extract(carrier)
        meta_span = trace.get_current_span(from_meta).get_span_context()
        if meta_span.is_valid:
            parent = from_meta
            http_span = trace.get_current_span(ambient).get_span_context()
            if http_span.is_valid and (http_span.trace_id, http_span.span_id) != (meta_span.trace_id,
                                                                                   meta_span.span_id):
                links.append(Link(http_span, {"mcp.gateway.link": "http"}))
    started_ns = time.time_ns() - int((time.perf_counter() - record.started) * 1e9)
    span = _tracer.start_span(record.method or "mcp", context=parent, kind=SpanKind.SERVER, links=links,
                              start_time=started_ns, attributes=_server_attributes(record, record.scope))
    record.span = span
    return trace.set_span_in_context(span, parent)


def attach(ctx: Any) -> Any:
    return otel_context.attach(ctx)


def _server_attributes(record: RequestRecord, scope: dict[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "network.transport": "tcp",
        "network.protocol.name": "http",
        "network.protocol.version": scope.get("http_version", "1.1"),
        "mcp.gateway.request_id": record.request_id,
        "mcp.gateway.client.era": record.era,
        "mcp.gateway.client.transport": record.transport,
    }
    client = scope.get("client")
    if client:
        attributes["client.address"], attributes["client.port"] = client[0], client[1]
    return attributes


def close_server_span(record: RequestRecord) -> None:
    """Name the span and give it what the request turned out to be; end it."""
    span = record.span
    if span is None:
        return
    # A method the gateway does not know is "other", in the name and the attribute alike: both
    # must stay low-cardinality whatever a client sends.
    method = metrics.method_label(record.method)
    target = record.name if method in ("tools/call", "prompts/get") and record.name else None
    span.update_name(f"{method} {target}" if target else method)
    attributes: dict[str, Any] = {"mcp.method.name": method, "http.response.status_code": record.status}
    if record.jsonrpc_id is not None:
        attributes["jsonrpc.request.id"] = str(record.jsonrpc_id)
    if record.version:
        attributes["mcp.protocol.version"] = record.version
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
        if record.name:
            attributes["gen_ai.tool.name"] = record.name
    elif method == "prompts/get" and record.name:
        attributes["gen_ai.prompt.name"] = record.name
    elif method == "resources/read" and record.name:
        attributes["mcp.resource.uri"] = record.name
    attributes.update(gateway_attributes(record))
    error = error_type(record)
    if error is not None:
        attributes["error.type"] = error
        if record.code is not None:
            attributes["rpc.response.status_code"] = str(record.code)
        span.set_status(Status(StatusCode.ERROR, record.message or error))
    span.set_attributes(attributes)
    span.end()


def gateway_attributes(record: RequestRecord) -> dict[str, Any]:
    """The `mcp.gateway.*` attributes (docs/observability.md "The mcp.gateway.* convention")."""
    out: dict[str, Any] = {}
    if record.backend:
        out["mcp.gateway.backend.name"] = record.backend
    if record.cache:
        out["mcp.gateway.cache.outcome"] = record.cache
        if record.cache_scope:
            out["mcp.gateway.cache.scope"] = record.cache_scope
    if record.translation:
        out["mcp.gateway.translation"] = record.translation
    if record.result_type:
        out["mcp.gateway.result_type"] = record.result_type
    if record.subject:
        out["mcp.gateway.principal.subject"] = record.subject
    if record.authorization is not None:
        out["mcp.gateway.authorization.decision"] = record.authorization
        out["mcp.gateway.authorization.rule"] = record.authorization_rule
    if record.rate_limit is not None:
        out["mcp.gateway.rate_limit.decision"] = record.rate_limit
        out["mcp.gateway.rate_limit.limit"] = [limit.label for limit in record.rate_limits]
    return out


def error_type(record: RequestRecord) -> str | None:
    """error.type per the conventions: the JSON-RPC code as a string (`_OTHER` for a code no
    one defined), `tool_error` for an isError result, the HTTP status for a refusal without a
    JSON-RPC answer; None on success."""
    if record.code is not None:
        label = metrics.code_label(record.code)
        return "_OTHER" if label == metrics.OTHER else label
    if record.tool_error:
        return metrics.TOOL_ERROR
    if record.status >= 400:
        return str(record.status)
    return None


# -- CLIENT spans and what is injected toward backends ------------------------------------------

def open_client_span(backend: Any, call: Call, attempt: int = 1) -> tuple[Any, Any, Call]:
    """Start the CLIENT span of one attempt of a backend call (`attempt`: 1, then one more for
    each retry or move to another endpoint), current until `detach(token)`, and the call to
    send: `params._meta` and the relayed headers carry the span's context, so that every
    backend kind gets it (HTTP in headers and body; stdio and legacy backends in `_meta`, which
    their translators keep)."""
    assert _tracer is not None
    name = call.name if call.method in ("tools/call", "prompts/get") and call.name else None
    attributes: dict[str, Any] = {
        "mcp.method.name": call.method,
        "mcp.protocol.version": call.version,
        "mcp.gateway.backend.name": backend.name,
        "mcp.gateway.backend.era": getattr(backend, "era", None) or backend.settings.era,
        "mcp.gateway.backend.transport": _backend_transport(backend.settings),
        "mcp.gateway.attempt": attempt,
    }
    attributes.update(server_address(backend.settings))
    if call.id is not None:
        attributes["jsonrpc.request.id"] = str(call.id)
    if call.method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
        if call.name:
            attributes["gen_ai.tool.name"] = call.name
    elif call.method == "prompts/get" and call.name:
        attributes["gen_ai.prompt.name"] = call.name
    span = _tracer.start_span(f"{call.method} {name}" if name else call.method, kind=SpanKind.CLIENT,
                              attributes=attributes)
    ctx = trace.set_span_in_context(span)
    token = otel_context.attach(ctx)
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    params = dict(call.params)
    meta = dict(params.get("_meta") or {}) if isinstance(params.get("_meta"), dict) else {}
    for key in _CONTEXT_KEYS:
        meta.pop(key, None)
    meta.update(carrier)
    params["_meta"] = meta
    headers = {k: v for k, v in call.headers.items() if k not in _CONTEXT_KEYS}
    headers.update(carrier)
    return span, token, replace(call, params=params, headers=headers)


def close_failed_attempt(span: Any, error: str, message: str) -> None:
    """End the CLIENT span of an attempt that failed and is followed by another: `error` is
    its error.type (the gateway's JSON-RPC code, or the HTTP status of a 5xx answer)."""
    span.set_attribute("error.type", error)
    span.set_status(Status(StatusCode.ERROR, message[:200]))
    span.end()


def note_endpoint(url: str) -> None:
    """server.address/server.port of the endpoint an HTTP backend actually POSTs to, on the
    current CLIENT span (a backend with several endpoints picks one per attempt)."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if span.is_recording() and getattr(span, "kind", None) is SpanKind.CLIENT:
        span.set_attributes(_url_address(url))


def close_client_span(span: Any, code: int | None, message: str | None, tool_error: bool) -> None:
    if code is not None:
        label = metrics.code_label(code)
        span.set_attribute("error.type", "_OTHER" if label == metrics.OTHER else label)
        span.set_attribute("rpc.response.status_code", str(code))
        span.set_status(Status(StatusCode.ERROR, message or label))
    elif tool_error:
        span.set_attribute("error.type", metrics.TOOL_ERROR)
        span.set_status(Status(StatusCode.ERROR, metrics.TOOL_ERROR))
    span.end()


def detach(token: Any) -> None:
    """Undo `attach`, in the same task (context) that attached."""
    otel_context.detach(token)


def _backend_transport(settings: Any) -> str:
    if settings.command is not None:
        return "stdio"
    return "sse" if settings.transport == "sse" else "streamable-http"


def server_address(settings: Any) -> dict[str, Any]:
    """server.address/server.port of an HTTP backend (from its URL), network.transport."""
    if settings.command is not None:
        return {"network.transport": "pipe"}
    return _url_address(settings.url)


@functools.lru_cache(maxsize=256)
def _url_address(url: str) -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"network.transport": "tcp", "server.address": parts.hostname or "", "server.port": port}


@contextmanager
def internal_span(name: str, **attributes: Any) -> Iterator[Any]:
    """A child span of whatever is current, for work that takes time (cache lookup, legacy
    session initialize, MRTR park and resume, fan-out). A no-op when tracing is off."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=attributes or None) as span:
        yield span


def add_outgoing_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add traceparent/tracestate/baggage for an upstream call made inside the current span, and
    the request's X-Request-Id, to `headers` (what every backend kind that speaks HTTP sends)."""
    if _tracer is not None:
        inject(headers)
    record = CURRENT.get()
    if record is not None:
        headers["x-request-id"] = record.request_id
    return headers


def outgoing_headers() -> dict[str, str]:
    return add_outgoing_headers({})


def current_trace_id() -> str | None:
    if _tracer is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def traced(name: str | None, *, translation: str | None = None) -> Callable[[F], F]:
    """Decorate an async method: run it in an INTERNAL span `name` when tracing is on, and note
    the era `translation` it performs on the request's record (`mcp.gateway.translation`). One
    line at the call's definition, so that backend modules need no tracing code of their own."""
    from gateway.observability.record import note_translation

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            if translation is not None:
                note_translation(translation)
            if _tracer is None or name is None:
                return await fn(*args, **kwargs)
            with _tracer.start_as_current_span(name, kind=SpanKind.INTERNAL):
                return await fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap
