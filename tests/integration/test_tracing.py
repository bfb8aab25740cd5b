"""OpenTelemetry through a running gateway (gateway/observability/tracing.py): one server span
per MCP request, continued from the client's `traceparent`, and the gateway's own span sent on
to the backend as the parent of the backend's work (digest §j). Spans are read from the SDK's
in-memory exporter, and once from a real OTLP/HTTP receiver; the scripted backend records the
`traceparent` it received."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.observability import tracing
from tests.support import mcp_http
from tests.support.asgi import read_body, serving
from tests.support.gateway import running_gateway
from tests.support.procs import gateway_process
from tests.support.scripted import Scripted

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    scripted = Scripted("traced").start()
    yield scripted
    scripted.stop()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure(True, span_exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.configure(False)


async def test_a_call_continues_the_clients_trace_and_parents_the_backends_work(backend, spans):
    settings = {"backends": [{"name": "traced", "url": backend.url, "prefix": ""}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        spans.clear()
        response = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "t"}},
                                       extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert response.status_code == 200, response.text

    [span] = [s for s in spans.get_finished_spans() if s.name == "mcp tools/call"]
    assert span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == CLIENT_SPAN
    assert span.attributes["mcp.method.name"] == "tools/call"
    assert span.attributes["http.response.status_code"] == 200
    assert span.status.status_code is not StatusCode.ERROR
    # The backend's parent is the gateway's span, in the client's trace.
    [call] = await backend.calls("tools/call")
    assert call["traceparent"] == f"00-{TRACE_ID}-{format(span.context.span_id, '016x')}-01"


async def test_a_request_without_trace_context_starts_a_trace_and_errors_are_marked(backend, spans):
    settings = {"backends": [{"name": "traced", "url": backend.url, "prefix": ""}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        spans.clear()
        ok = await mcp_http.post(client, gw.url, "tools/list")
        assert ok.status_code == 200
        # The scripted backend answers HTTP 503 to the first attempt of this tool; a tool call
        # is not retried (not idempotent), so the gateway answers 502 -31001.
        failed = await mcp_http.post(client, gw.url, "tools/call",
                                     {"name": "flaky_tool", "arguments": {"key": "trace-503"}})
        assert failed.status_code == 502 and failed.json()["error"]["code"] == -31001

    by_name = {s.name: s for s in spans.get_finished_spans()}
    listed = by_name["mcp tools/list"]
    assert listed.parent is None  # a root: nothing to continue
    assert listed.status.status_code is not StatusCode.ERROR
    call = by_name["mcp tools/call"]
    assert call.attributes["http.response.status_code"] == 502
    assert call.status.status_code is StatusCode.ERROR


def test_tracing_off_makes_no_spans_and_sends_no_context():
    tracing.configure(False)
    assert not tracing.enabled()
    assert tracing.start_request_span("tools/call", {}) is None
    assert tracing.outgoing_headers() == {}


async def test_spans_reach_an_otlp_collector(backend, tmp_path):
    """`tracing_exporter: otlp` in a gateway process of its own, configured only through the
    standard OTEL_* variables: the spans arrive at an OTLP/HTTP receiver as protobuf, with
    the client's trace id and the gateway's service name."""
    received: list[ExportTraceServiceRequest] = []
    arrived = asyncio.Event()

    async def collector(scope, receive, send):  # noqa: ANN001 - an OTLP/HTTP trace receiver
        if scope["type"] != "http":
            return
        assert scope["path"] == "/v1/traces" and scope["method"] == "POST"
        request = ExportTraceServiceRequest()
        request.ParseFromString(await read_body(receive))
        received.append(request)
        arrived.set()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": b""})

    async with serving(collector) as url:
        endpoint = url.removesuffix("/mcp")
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "backends": [{"name": "traced", "url": backend.url, "prefix": ""}],
            "observability": {"tracing": True, "tracing_exporter": "otlp"},
        }))
        gateway = gateway_process(config, env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                response = await mcp_http.post(
                    client, gateway.url, "tools/call", {"name": "echo", "arguments": {"text": "otlp"}},
                    extra_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
                assert response.status_code == 200, response.text
            await asyncio.wait_for(arrived.wait(), 10)
        finally:
            gateway.stop()

    exported = [(resource, span) for request in received for resource in request.resource_spans
                for scoped in resource.scope_spans for span in scoped.spans]
    [(resource, span)] = [(r, s) for r, s in exported if s.name == "mcp tools/call"]
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == CLIENT_SPAN
    service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
    assert service == "mcp-gateway"
