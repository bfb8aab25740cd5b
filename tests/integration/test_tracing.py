"""OpenTelemetry through a running gateway, after the MCP semantic conventions (docs/observability.md):
real HTTP clients, modern and initialize-era, through the gateway to a modern HTTP backend, a
legacy HTTP backend and a legacy stdio backend, each of which reports the trace context it
received. Spans are read from the SDK's in-memory exporter; once from a real OTLP/HTTP receiver.

One trace runs from the client's `_meta.traceparent` through the gateway's SERVER span and its
CLIENT span to each backend; names, kinds, attributes and statuses are checked for a success, a
JSON-RPC error, an `isError` result, a cache hit and a legacy client's call."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway import __version__
from gateway.observability import tracing
from tests.support import legacy_venv, mcp_http
from tests.support.asgi import read_body, serving
from tests.support.gateway import running_gateway
from tests.support.procs import FIXTURE_SERVERS, gateway_process
from tests.support.scripted import Scripted
from tests.support.spans import spans  # noqa: F401  (the module's fixture)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
HTTP_TRACE = "0af7651916cd43dd8448eb211c80319c"
HTTP_SPAN = "b7ad6b7169203331"
META_CONTEXT = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01", "tracestate": "rojo=00f067aa0ba902b7",
                "baggage": "tenant=acme"}
LEGACY = "2025-06-18"
ACCEPT = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def modern() -> Iterator[Scripted]:
    with Scripted("modern") as scripted:
        yield scripted


@pytest.fixture(scope="module")
def legacy_http() -> Iterator[Any]:
    server = legacy_venv.legacy_server(name="legacy-http").start()
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(modern, legacy_http, spans) -> AsyncIterator[Any]:
    settings = {"backends": [
        {"name": "m", "url": modern.url, "era": "modern", "resource_prefixes": ["scripted://modern/"]},
        {"name": "l", "url": legacy_http.url, "era": "legacy"},
        {"name": "s", "command": [legacy_venv.legacy_python(), str(FIXTURE_SERVERS / "legacy_everything.py"),
                                  "--stdio"], "era": "legacy"},
    ]}
    async with running_gateway(settings) as gw:
        yield gw


@pytest_asyncio.fixture(loop_scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        yield http


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def reconfigures(spans) -> Iterator[None]:
    """For a test that configures tracing itself: the module's exporter is back afterwards."""
    yield
    tracing.configure(True, span_exporter=spans)


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _traceparent(span: ReadableSpan) -> str:
    return f"00-{_hex(span.context.trace_id, 32)}-{_hex(span.context.span_id, 16)}-01"


def _trace(spans: InMemorySpanExporter, trace_id: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if _hex(s.context.trace_id, 32) == trace_id]


def _one(spans: list[ReadableSpan], kind: SpanKind, name: str | None = None) -> ReadableSpan:
    found = [s for s in spans if s.kind is kind and (name is None or s.name == name)]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


async def _call(client: httpx.AsyncClient, gw: Any, tool: str, arguments: dict[str, Any], *, id: Any = 7,
                meta: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
    return await mcp_http.post(client, gw.url, "tools/call", {"name": tool, "arguments": arguments}, id=id,
                               meta=META_CONTEXT if meta is None else meta, extra_headers=headers)


def _server_basics(server: ReadableSpan, method: str, jsonrpc_id: str) -> None:
    a = server.attributes
    assert a["mcp.method.name"] == method
    assert a["jsonrpc.request.id"] == jsonrpc_id
    assert a["network.transport"] == "tcp" and a["network.protocol.name"] == "http"
    assert a["network.protocol.version"] == "1.1"
    assert a["client.address"] == "127.0.0.1" and isinstance(a["client.port"], int)
    assert len(a["mcp.gateway.request_id"]) > 8


async def test_a_tool_call_is_one_trace_from_the_clients_meta_to_the_modern_backend(gateway, client, modern, spans):
    spans.clear()
    response = await _call(client, gateway, "m__echo", {"text": "hi"},
                           headers={"traceparent": f"00-{HTTP_TRACE}-{HTTP_SPAN}-01", "x-request-id": "req-modern-1"})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "req-modern-1"

    trace = _trace(spans, TRACE_ID)
    server = _one(trace, SpanKind.SERVER)
    # The conventions: `{mcp.method.name} {target}`, the parent from params._meta, and the HTTP
    # context (another trace here) as a link.
    assert server.name == "tools/call m__echo"
    assert server.parent is not None and _hex(server.parent.span_id, 16) == CLIENT_SPAN
    assert [(_hex(link.context.trace_id, 32), _hex(link.context.span_id, 16)) for link in server.links] == [
        (HTTP_TRACE, HTTP_SPAN)]
    _server_basics(server, "tools/call", "7")
    a = server.attributes
    assert a["gen_ai.tool.name"] == "m__echo" and a["gen_ai.operation.name"] == "execute_tool"
    assert a["mcp.protocol.version"] == mcp_http.VERSION
    assert a["mcp.gateway.backend.name"] == "m" and a["mcp.gateway.client.era"] == "modern"
    assert a["mcp.gateway.request_id"] == "req-modern-1"
    assert a["mcp.gateway.result_type"] == "complete"
    assert "error.type" not in a and server.status.status_code is StatusCode.UNSET

    # (A first call of a tool the table has not indexed yet also reads tools/list: other spans.)
    call = _one(trace, SpanKind.CLIENT, "tools/call echo")  # the backend's own name for the tool
    assert call.parent is not None and call.parent.span_id == server.context.span_id
    c = call.attributes
    assert c["mcp.method.name"] == "tools/call" and c["gen_ai.tool.name"] == "echo"
    assert c["server.address"] == "127.0.0.1" and c["server.port"] == modern.proc.port
    assert c["network.transport"] == "tcp" and c["mcp.gateway.backend.era"] == "modern"
    assert call.status.status_code is StatusCode.UNSET

    # What the backend received: the CLIENT span as the parent, in the header and in _meta,
    # the client's tracestate and baggage carried along, and the request id.
    [received] = [c for c in await modern.calls("tools/call") if c["id"] == 7 and c["name"] == "echo"][-1:]
    assert received["traceparent"] == _traceparent(call)
    assert received["meta"]["traceparent"] == _traceparent(call)
    assert received["meta"]["tracestate"] == "rojo=00f067aa0ba902b7"
    assert received["meta"]["baggage"] == "tenant=acme"
    assert received["x-request-id"] == "req-modern-1"


async def test_a_json_rpc_error_marks_both_spans(gateway, client, spans):
    spans.clear()
    response = await _call(client, gateway, "m__fail", {"code": -32602, "message": "no such city"}, id="e1")
    assert response.json()["error"]["code"] == -32602
    trace = _trace(spans, TRACE_ID)
    server = _one(trace, SpanKind.SERVER)
    assert server.name == "tools/call m__fail"
    assert server.attributes["error.type"] == "-32602"
    assert server.attributes["rpc.response.status_code"] == "-32602"
    assert server.attributes["jsonrpc.request.id"] == "e1"
    assert server.status.status_code is StatusCode.ERROR and server.status.description == "no such city"
    call = _one(trace, SpanKind.CLIENT, "tools/call fail")
    assert call.attributes["error.type"] == "-32602"
    assert call.status.status_code is StatusCode.ERROR


async def test_an_unknown_backend_code_is_other_and_a_gateway_error_is_its_own_code(gateway, client, spans):
    spans.clear()
    await _call(client, gateway, "m__fail", {"code": -32099, "message": "custom"}, id="e2")
    server = _one(_trace(spans, TRACE_ID), SpanKind.SERVER)
    assert server.attributes["error.type"] == "_OTHER"  # not a code anyone defined
    assert server.attributes["rpc.response.status_code"] == "-32099"
    spans.clear()
    response = await _call(client, gateway, "nobody__tool", {}, id="e3")
    assert response.json()["error"]["code"] == -32602
    server = _one(_trace(spans, TRACE_ID), SpanKind.SERVER)
    assert server.attributes["error.type"] == "-32602" and server.status.status_code is StatusCode.ERROR
    assert not [s for s in _trace(spans, TRACE_ID) if s.kind is SpanKind.CLIENT]  # never forwarded


async def test_an_is_error_result_is_a_tool_error(gateway, client, spans):
    spans.clear()
    response = await _call(client, gateway, "m__is_error", {}, id="t1")
    assert response.json()["result"]["isError"] is True
    trace = _trace(spans, TRACE_ID)
    server = _one(trace, SpanKind.SERVER)
    assert server.attributes["error.type"] == "tool_error" and "rpc.response.status_code" not in server.attributes
    assert server.status.status_code is StatusCode.ERROR
    call = _one(trace, SpanKind.CLIENT, "tools/call is_error")
    assert call.attributes["error.type"] == "tool_error" and call.status.status_code is StatusCode.ERROR


async def test_a_cache_hit_has_no_client_span_and_says_hit(gateway, client, spans):
    read = {"uri": "scripted://modern/doc-1"}
    first = await mcp_http.post(client, gateway.url, "resources/read", read, meta=META_CONTEXT)
    assert first.status_code == 200, first.text
    spans.clear()
    again = await mcp_http.post(client, gateway.url, "resources/read", read, meta=META_CONTEXT)
    assert again.headers["x-cache"] == "hit"
    trace = _trace(spans, TRACE_ID)
    server = _one(trace, SpanKind.SERVER)
    assert server.name == "resources/read"  # URIs are never in span names (high cardinality)
    assert server.attributes["mcp.resource.uri"] == "scripted://modern/doc-1"
    assert server.attributes["mcp.gateway.cache.outcome"] == "hit"
    assert server.attributes["mcp.gateway.cache.scope"] in ("public", "private")
    assert not [s for s in trace if s.kind is SpanKind.CLIENT]
    lookup = _one(trace, SpanKind.INTERNAL, "cache lookup")
    assert lookup.parent is not None and lookup.parent.span_id == server.context.span_id


async def test_a_fanned_out_list_has_a_span_per_backend(gateway, client, spans):
    spans.clear()
    response = await mcp_http.post(client, gateway.url, "tools/list", meta=META_CONTEXT)
    assert response.status_code == 200, response.text
    trace = _trace(spans, TRACE_ID)
    server = _one(trace, SpanKind.SERVER, "tools/list")
    fanout = {s.name for s in trace if s.kind is SpanKind.INTERNAL and s.name.startswith("fanout ")}
    assert fanout == {"fanout m", "fanout l", "fanout s"}
    assert all(s.parent.span_id == server.context.span_id for s in trace if s.name.startswith("fanout "))


@pytest.mark.parametrize("backend", ["l", "s"])
async def test_legacy_http_and_stdio_backends_get_the_context_in_meta(gateway, client, spans, backend):
    spans.clear()
    response = await _call(client, gateway, f"{backend}__trace_context", {}, id=f"ctx-{backend}",
                           headers={"x-request-id": f"req-{backend}"})
    assert response.status_code == 200, response.text
    received = json.loads(response.json()["result"]["content"][0]["text"])
    trace = _trace(spans, TRACE_ID)
    server = _one(trace, SpanKind.SERVER)
    assert server.attributes["mcp.gateway.translation"] == "legacy-session"
    call = _one(trace, SpanKind.CLIENT, "tools/call trace_context")
    assert call.parent.span_id == server.context.span_id
    assert call.attributes["mcp.gateway.backend.era"] == "legacy"
    # The backend's own work continues the client's trace, parented by the CLIENT span.
    assert received["meta"]["traceparent"] == _traceparent(call)
    assert received["meta"]["baggage"] == "tenant=acme"
    if backend == "l":
        assert call.attributes["server.address"] == "127.0.0.1"
        assert received["headers"] == {"traceparent": _traceparent(call), "x-request-id": "req-l"}
    else:
        assert call.attributes["network.transport"] == "pipe" and "server.address" not in call.attributes


async def test_a_new_legacy_session_is_initialized_inside_the_calls_trace(gateway, client, spans):
    # A client capability set no session has yet: the legacy backend opens one for this call.
    spans.clear()
    meta = {**META_CONTEXT, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    response = await _call(client, gateway, "l__echo", {"text": "new session"}, meta=meta, id="init-1")
    assert response.status_code == 200, response.text
    trace = _trace(spans, TRACE_ID)
    call = _one(trace, SpanKind.CLIENT, "tools/call echo")
    initialize = _one(trace, SpanKind.INTERNAL, "legacy-session initialize")
    assert initialize.parent.span_id == call.context.span_id


async def test_a_legacy_clients_call_is_traced_with_the_method_from_its_body(gateway, client, spans):
    spans.clear()
    init = await client.post(gateway.url, content=orjson.dumps({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"},
                   "_meta": META_CONTEXT}}), headers={"content-type": "application/json", "accept": ACCEPT})
    assert init.status_code == 200, init.text
    session = init.headers["mcp-session-id"]
    legacy_headers = {"content-type": "application/json", "accept": ACCEPT, "mcp-session-id": session,
                      "mcp-protocol-version": LEGACY}
    await client.post(gateway.url, content=orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                      headers=legacy_headers)
    answer = await client.post(gateway.url, content=orjson.dumps({
        "jsonrpc": "2.0", "id": 41, "method": "tools/call",
        "params": {"name": "m__echo", "arguments": {"text": "old"}, "_meta": META_CONTEXT}}), headers=legacy_headers)
    assert answer.status_code == 200, answer.text
    trace = _trace(spans, TRACE_ID)
    initialize = _one(trace, SpanKind.SERVER, "initialize")
    assert initialize.attributes["mcp.protocol.version"] == LEGACY
    assert initialize.attributes["mcp.gateway.client.era"] == "legacy"
    server = _one(trace, SpanKind.SERVER, "tools/call m__echo")
    assert server.parent is not None and _hex(server.parent.span_id, 16) == CLIENT_SPAN
    assert server.attributes["mcp.gateway.client.era"] == "legacy"
    assert server.attributes["gen_ai.tool.name"] == "m__echo"
    assert server.attributes["jsonrpc.request.id"] == "41"
    call = _one(trace, SpanKind.CLIENT, "tools/call echo")
    assert call.parent.span_id == server.context.span_id


async def test_a_request_refused_before_dispatch_still_has_its_span(gateway, client, spans):
    spans.clear()
    refused = await mcp_http.post(client, gateway.url, "tools/call", {"name": "m__echo", "arguments": {}},
                                  extra_headers={"origin": "https://evil.example",
                                                 "traceparent": f"00-{HTTP_TRACE}-{HTTP_SPAN}-01"})
    assert refused.status_code == 403
    server = _one(_trace(spans, HTTP_TRACE), SpanKind.SERVER)
    assert server.name == "tools/call"
    assert server.attributes["http.response.status_code"] == 403
    assert server.attributes["error.type"] == "-32600" and server.status.status_code is StatusCode.ERROR


def test_tracing_off_makes_no_spans_and_sends_only_the_request_id(reconfigures):
    tracing.configure(False)
    assert not tracing.enabled()
    assert tracing.outgoing_headers() == {}
    with tracing.internal_span("nothing") as span:
        assert span is None


def test_the_console_exporter_writes_one_json_line_per_span_to_stderr(reconfigures, capsys):
    tracing.configure(True, "console")
    try:
        for name in ("first", "second"):
            with tracing.internal_span(name):
                pass
        tracing._provider.force_flush()
    finally:
        tracing.configure(False)
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["first", "second"]


def test_the_resource_honours_otel_service_name_and_resource_attributes(monkeypatch):
    from opentelemetry.sdk.resources import Resource

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    own = tracing.resource(Resource).attributes
    assert own["service.name"] == "mcp-gateway" and own["service.version"] == __version__
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fleet-a")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    named = tracing.resource(Resource).attributes
    assert named["service.name"] == "fleet-a" and named["deployment.environment"] == "staging"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=sidecar-b")
    assert tracing.resource(Resource).attributes["service.name"] == "sidecar-b"


def test_the_sampler_follows_otel_traces_sampler(reconfigures, monkeypatch):
    exporter = InMemorySpanExporter()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    tracing.configure(True, span_exporter=exporter)
    try:
        with tracing.internal_span("dropped"):
            pass
    finally:
        tracing.configure(False)
    assert exporter.get_finished_spans() == ()


async def test_spans_reach_an_otlp_collector_with_the_configured_service(modern, tmp_path):
    """`tracing_exporter: otlp` in a gateway process of its own, configured only through the
    standard OTEL_* variables: the spans arrive at an OTLP/HTTP receiver as protobuf, with the
    client's trace id, the service OTEL_SERVICE_NAME names and the tracer's version."""
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
            "backends": [{"name": "traced", "url": modern.url, "prefix": ""}],
            "observability": {"tracing": True, "tracing_exporter": "otlp"},
        }))
        gateway = gateway_process(config, env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_SERVICE_NAME": "fleet-a", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"}).start()
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                response = await mcp_http.post(
                    client, gateway.url, "tools/call", {"name": "echo", "arguments": {"text": "otlp"}},
                    meta=META_CONTEXT)
                assert response.status_code == 200, response.text
            for _ in range(100):
                await asyncio.wait_for(arrived.wait(), 10)
                arrived.clear()
                if any(s.name == "tools/call echo" and s.kind == 2 for r in received for rs in r.resource_spans
                       for ss in rs.scope_spans for s in ss.spans):
                    break
        finally:
            gateway.stop()

    exported = [(resource, scoped, span) for request in received for resource in request.resource_spans
                for scoped in resource.scope_spans for span in scoped.spans]
    [(resource, scoped, span)] = [(r, sc, s) for r, sc, s in exported if s.name == "tools/call echo" and s.kind == 2]
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == CLIENT_SPAN
    attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert attributes["service.name"] == "fleet-a" and attributes["deployment.environment"] == "test"
    assert scoped.scope.name == "mcp-gateway" and scoped.scope.version == __version__
    assert sys.executable  # the gateway ran as `python -m gateway serve`


# A CLIENT span per attempt when a call is retried: test_tracing_attempts.py.
