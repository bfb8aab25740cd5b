"""A CLIENT span per attempt (docs/observability.md "The CLIENT span"): a backend call that is
sent again (a retry of backends/retry.py, or a modern backend's move to its next endpoint after
one that refused the connection) is one CLIENT span per attempt, each a child of the SERVER span
(or of the fan-out span of a list), numbered by `mcp.gateway.attempt`, the failed ones with
their `error.type` and status ERROR, and each one's context is what that attempt carried to the
backend. Real backends that fail the first attempt, one of each kind: a modern HTTP backend
(503 to the first read of a key; an endpoint that refuses connections beside one that
answers), a legacy Streamable HTTP backend and an HTTP+SSE backend (503 to the first
`tools/list`), and a stdio backend of each era whose process is down when the call arrives."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.integration.test_legacy_http_failures import Answer, FlakyLegacy
from tests.integration.test_legacy_sse_transport import OldServer
from tests.support import mcp_http
from tests.support.asgi import read_body, serving
from tests.support.gateway import running_gateway
from tests.support.procs import FIXTURE_SERVERS, refused_url
from tests.support.scripted import Scripted
from tests.support.spans import spans  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def modern() -> Iterator[Scripted]:
    with Scripted("attempts") as scripted:
        yield scripted


@pytest_asyncio.fixture(loop_scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=20) as http:
        yield http


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _traceparent(span: ReadableSpan) -> str:
    return f"00-{_hex(span.context.trace_id, 32)}-{_hex(span.context.span_id, 16)}-01"


def _meta(n: int) -> dict[str, str]:
    """A client trace context of its own per request."""
    return {"traceparent": f"00-{n:032x}-{n:016x}-01"}


def _trace(spans: InMemorySpanExporter, n: int) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.context.trace_id == n]


def _attempts(trace: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in trace if s.kind is SpanKind.CLIENT and s.name == name),
                  key=lambda s: s.attributes["mcp.gateway.attempt"])


def _check_attempts(attempts: list[ReadableSpan], parent: ReadableSpan, failed_error: str) -> None:
    """Attempts numbered 1..n, siblings under `parent`, all but the last failed with
    `failed_error`, the last one a success."""
    assert [a.attributes["mcp.gateway.attempt"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert len(attempts) >= 2
    for attempt in attempts:
        assert attempt.parent is not None and attempt.parent.span_id == parent.context.span_id
    for failed in attempts[:-1]:
        assert failed.attributes["error.type"] == failed_error, failed.attributes
        assert failed.status.status_code is StatusCode.ERROR
    last = attempts[-1]
    assert "error.type" not in last.attributes and last.status.status_code is StatusCode.UNSET
    assert len({a.context.span_id for a in attempts}) == len(attempts)
    # Attempts follow one another: each starts after the one before it ended.
    for before, after in zip(attempts, attempts[1:]):
        assert before.end_time <= after.start_time


async def test_a_read_answered_503_then_200_is_two_client_spans(spans, modern, client):
    async with running_gateway({"backends": [{"name": "m", "url": modern.url, "era": "modern",
                                              "resource_prefixes": ["scripted://attempts/"], "retries": 2}],
                                "cache": {"store": "none"}}) as gw:
        spans.clear()
        response = await mcp_http.post(client, gw.url, "resources/read", {"uri": "scripted://attempts/flaky/a1"},
                                       meta=_meta(1))
        assert response.status_code == 200, response.text
    trace = _trace(spans, 1)
    [server] = [s for s in trace if s.kind is SpanKind.SERVER]
    attempts = _attempts(trace, "resources/read")
    assert len(attempts) == 2
    _check_attempts(attempts, server, "-31001")  # HTTP 503 without a JSON-RPC body
    for attempt in attempts:
        assert attempt.attributes["server.address"] == "127.0.0.1"
        assert attempt.attributes["server.port"] == modern.proc.port
    # Each attempt carried its own span as the backend's parent.
    received = [c for c in await modern.calls("resources/read") if c["params"]["uri"] == "scripted://attempts/flaky/a1"]
    assert [c["meta"]["traceparent"] for c in received] == [_traceparent(a) for a in attempts]
    assert [c["traceparent"] for c in received] == [_traceparent(a) for a in attempts]


async def test_an_endpoint_that_refuses_then_one_that_answers_are_two_client_spans(spans, modern, client):
    refused = refused_url()
    settings = {"backends": [{"name": "two", "urls": [refused, modern.url], "era": "modern", "retries": 0,
                              "health": {"check_interval_seconds": 0, "consecutive_failures": 100}}]}
    async with running_gateway(settings) as gw:
        # The endpoint is chosen at random (two choices): call until one call tried the refusing
        # endpoint first (each call does with probability 1/2).
        for n in range(100, 140):
            spans.clear()
            response = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}},
                                           meta=_meta(n))
            assert response.status_code == 200, response.text
            trace = _trace(spans, n)
            attempts = _attempts(trace, "tools/call echo")
            if len(attempts) > 1:
                break
        else:
            pytest.fail("40 calls and none tried the refusing endpoint first")
    [server] = [s for s in trace if s.kind is SpanKind.SERVER]
    assert len(attempts) == 2
    _check_attempts(attempts, server, "-31001")
    # server.address/server.port: the endpoint each attempt actually used.
    refused_port = int(refused.rsplit(":", 1)[1].split("/")[0])
    assert [a.attributes["server.port"] for a in attempts] == [refused_port, modern.proc.port]
    [received] = [c for c in await modern.calls("tools/call") if c["meta"].get("traceparent", "").startswith(
        f"00-{n:032x}")]
    assert received["meta"]["traceparent"] == _traceparent(attempts[1])


def _service_unavailable(answer: Answer) -> Any:
    return answer.text(503, b"warming up")


async def test_a_legacy_http_list_answered_503_then_served_is_two_client_spans(spans, client):
    server = FlakyLegacy()
    async with serving(server) as url:
        async with running_gateway({"backends": [{"name": "old", "url": url, "era": "legacy", "retries": 2}],
                                    "cache": {"store": "none"}}) as gw:
            server.faults["tools/list"] = [_service_unavailable]
            spans.clear()
            response = await mcp_http.post(client, gw.url, "tools/list", meta=_meta(2))
            assert response.status_code == 200, response.text
            assert [t["name"] for t in response.json()["result"]["tools"]] == ["echo"]
    trace = _trace(spans, 2)
    [fanout] = [s for s in trace if s.name == "fanout old"]
    attempts = _attempts(trace, "tools/list")
    assert len(attempts) == 2
    _check_attempts(attempts, fanout, "-31001")
    assert all(a.attributes["mcp.gateway.backend.era"] == "legacy" for a in attempts)
    lists = [s["message"] for s in server.requests("tools/list")
             if s["message"]["params"].get("_meta", {}).get("traceparent", "").startswith(f"00-{2:032x}")]
    assert [m["params"]["_meta"]["traceparent"] for m in lists] == [_traceparent(a) for a in attempts]


class FlakySse(OldServer):
    """The HTTP+SSE server of test_legacy_sse_transport, whose first `tools/list` POST after
    `fail_next_list` is answered 503, and which lists one tool."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next_list = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["method"] == "POST" and scope["path"] == "/messages":
            body = await read_body(receive)
            message = orjson.loads(body)
            if message.get("method") == "tools/list" and self.fail_next_list:
                self.fail_next_list = False
                self.posts.append(message)
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b"busy"})
                return

            async def replay() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}
            receive = replay
        await super().__call__(scope, receive, send)

    def answer(self, message: dict[str, Any]) -> None:
        if message.get("method") == "tools/list":
            self.stream.put_nowait({"jsonrpc": "2.0", "id": message["id"], "result": {
                "tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}})
            return
        super().answer(message)


async def test_an_http_sse_list_answered_503_then_served_is_two_client_spans(spans, client):
    server = FlakySse()
    async with serving(server) as url:
        settings = {"backends": [{"name": "sse", "url": url, "transport": "sse", "era": "legacy", "retries": 2}],
                    "cache": {"store": "none"}}
        async with running_gateway(settings) as gw:
            server.fail_next_list = True
            spans.clear()
            response = await mcp_http.post(client, gw.url, "tools/list", meta=_meta(3))
            assert response.status_code == 200, response.text
            assert [t["name"] for t in response.json()["result"]["tools"]] == ["echo"]
    trace = _trace(spans, 3)
    [fanout] = [s for s in trace if s.name == "fanout sse"]
    attempts = _attempts(trace, "tools/list")
    assert len(attempts) == 2
    _check_attempts(attempts, fanout, "-31001")
    assert all(a.attributes["mcp.gateway.backend.transport"] == "sse" for a in attempts)
    lists = [m for m in server.posts if m.get("method") == "tools/list"
             and m["params"].get("_meta", {}).get("traceparent", "").startswith(f"00-{3:032x}")]
    assert [m["params"]["_meta"]["traceparent"] for m in lists] == [_traceparent(a) for a in attempts]


# A stdio server of each era that starts in well under the restart backoff (no SDK import),
# and a tool it lists.
_STDIO_SERVERS = {"modern": ("raw_stdio.py", "echo"), "legacy": ("legacy_asking_stdio.py", "ask")}


@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_a_stdio_call_that_finds_the_process_down_is_one_client_span_per_attempt(spans, client, era):
    # The process is restarted 0.4 s after it dies; an attempt waits 0.15 s for it (then fails,
    # never sent) and is retried: at least two attempts, the last one served. Initialize-era:
    # the write that fails is the new session's initialize.
    script, tool = _STDIO_SERVERS[era]
    backend = {"name": "pipe", "command": [sys.executable, str(FIXTURE_SERVERS / script)], "era": era,
               "restart_backoff_seconds": 0.4, "connect_timeout_seconds": 0.15, "retries": 5,
               "retry_backoff_seconds": 0.05, "retry_backoff_max_seconds": 0.1,
               "health": {"check_interval_seconds": 0, "consecutive_failures": 100}}
    async with running_gateway({"backends": [backend], "cache": {"store": "none"}}) as gw:
        process = gw.runtime.backends[0].process
        pid = process.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if process.pid is None and not process._started.is_set():
                break
            await asyncio.sleep(0.01)
        spans.clear()
        response = await mcp_http.post(client, gw.url, "tools/list", meta=_meta(4))
        assert response.status_code == 200, response.text
        assert tool in [t["name"] for t in response.json()["result"]["tools"]]
        assert process.pid not in (None, pid)
    trace = _trace(spans, 4)
    [fanout] = [s for s in trace if s.name == "fanout pipe"]
    attempts = _attempts(trace, "tools/list")
    _check_attempts(attempts, fanout, "-31001")
    assert all(a.attributes["network.transport"] == "pipe" and "server.address" not in a.attributes
               for a in attempts)
