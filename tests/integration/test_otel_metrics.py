"""mcp.server.operation.duration and mcp.client.operation.duration (OpenTelemetry MCP
conventions): through /metrics always, as OTel instruments when `otlp_metrics` is on (read here
with the SDK's in-memory reader), with the conventions' buckets and attributes. The client
duration runs until the answer is complete: a streamed answer is timed to its last message."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gateway.observability import metrics, otel_metrics
from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.scripted import Scripted

CONVENTION_BUCKETS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300]


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    with Scripted("om") as scripted:
        yield scripted


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    otel_metrics.configure(True, reader=reader)
    try:
        yield reader
    finally:
        otel_metrics.configure(False)


def _points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict, object, str]]:
    out = []
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    out.extend((dict(p.attributes), p, metric.unit) for p in metric.data.data_points)
    return out


async def test_both_durations_by_their_conventional_names_buckets_and_attributes(backend, reader):
    settings = {"backends": [{"name": "om", "url": backend.url, "prefix": ""}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        await mcp_http.post(client, gw.url, "tools/list")
        ok = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
        failed = await mcp_http.post(client, gw.url, "tools/call",
                                     {"name": "fail", "arguments": {"code": -32602, "message": "no"}})
        tool_error = await mcp_http.post(client, gw.url, "tools/call", {"name": "is_error", "arguments": {}})
        # Streamed (progress): timed until the final message, not until its headers.
        slow = await mcp_http.post(client, gw.url, "resources/read", {"uri": "scripted://om/stream/0.3"},
                                   meta={"progressToken": "p1"})
        exposition = (await client.get(f"{gw.base}/metrics")).text
    assert ok.status_code == 200 and failed.json()["error"]["code"] == -32602
    assert tool_error.json()["result"]["isError"] is True

    server = _points(reader, "mcp.server.operation.duration")
    client_points = _points(reader, "mcp.client.operation.duration")
    assert server and client_points
    for _, point, unit in server + client_points:
        assert unit == "s" and list(point.explicit_bounds) == CONVENTION_BUCKETS
    calls = {a.get("error.type"): a for a, _, _ in server if a["mcp.method.name"] == "tools/call"}
    assert set(calls) == {None, "-32602", "tool_error"}
    assert calls[None] == {"mcp.method.name": "tools/call", "gen_ai.tool.name": "echo",
                           "mcp.protocol.version": mcp_http.VERSION, "network.transport": "tcp"}
    # A tool never listed by its backend has no name of its own (bounded).
    assert "gen_ai.tool.name" not in calls["tool_error"]
    upstream = {a.get("error.type") for a, _, _ in client_points if a["mcp.method.name"] == "tools/call"}
    assert upstream == {None, "-32602", "tool_error"}
    assert all(a["server.address"] == "127.0.0.1" for a, _, _ in client_points)

    assert "text/event-stream" in slow.headers["content-type"], slow.text
    [(_, point, _)] = [(a, p, u) for a, p, u in client_points if a["mcp.method.name"] == "resources/read"]
    assert point.sum >= 0.3  # until the last message of the stream, not its headers

    # The same families in the Prometheus exposition, with dots as underscores.
    bounds = re.findall(r'mcp_server_operation_duration_seconds_bucket\{[^}]*le="([^"]+)"[^}]*mcp_method_name="tools/call"',
                        exposition) or re.findall(
        r'mcp_server_operation_duration_seconds_bucket\{[^}]*mcp_method_name="tools/call"[^}]*le="([^"]+)"', exposition)
    assert {float(b) for b in bounds if b != "+Inf"} == {float(b) for b in CONVENTION_BUCKETS}
    assert 'mcp_client_operation_duration_seconds_count{' in exposition
    assert re.search(r'mcp_server_operation_duration_seconds_count\{[^}]*error_type="-32602"', exposition)


def test_labels_never_come_from_raw_input():
    assert metrics.method_label("tools/call") == "tools/call"
    assert metrics.method_label("tools/call\nx") == "other" and metrics.method_label(None) == "other"
    assert metrics.code_label(-32602) == "-32602"
    assert metrics.code_label(-1) == "other" and metrics.code_label("-32602") == "other"
    assert metrics.code_label(True) == "other"
