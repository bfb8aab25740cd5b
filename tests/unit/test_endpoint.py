"""gateway/endpoint.py framing, driven with ASGI messages over a Dispatcher on FakeBackends:
202 for notifications, 405, a JSON answer, an SSE answer event by event, keep-alives, and an
error as the last event once the headers are out. Over real sockets and clients:
tests/integration/test_validation.py, test_forwarding.py, test_modern_failures.py."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.backends.base import Reply
from gateway.dispatch import Dispatcher
from gateway.endpoint import McpEndpoint
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse
from gateway.protocol.principal import Principal
from gateway.routing.table import RouteTable, Target
from tests.support.fake_backend import FakeBackend, answers, discover_result, progress, stream

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
LIST = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}], "resultType": "complete"}


class Exchange:
    """One request through the endpoint: what it sent, as ASGI messages."""

    def __init__(self, sent: list[dict[str, Any]]) -> None:
        self.sent = sent

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return self.sent[1:]

    @property
    def body(self) -> bytes:
        return b"".join(c.get("body", b"") for c in self.chunks)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[Any]:
        """The JSON-RPC messages of an SSE body, in order."""
        return [orjson.loads(line[len(b"data: "):]) for line in self.body.split(b"\n") if line.startswith(b"data: ")]


async def exchange(endpoint: McpEndpoint, body: Any = None, *, method: str = "POST", scope: dict | None = None,
                   headers: dict[str, str] | None = None) -> Exchange:
    raw = body if isinstance(body, bytes) else orjson.dumps(body) if body is not None else b""
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    wire = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await endpoint({"type": "http", "method": method, "path": "/mcp", "headers": wire, **(scope or {})},
                   receive, send)
    return Exchange(sent)


def tools_call(request_id: Any = 7, name: str = "a__t") -> tuple[dict[str, Any], dict[str, str]]:
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": name, "arguments": {}, "_meta": META}}
    return body, {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": name}


def endpoint_for(tools_call_answer: Any, *, keepalive_seconds: float = 30.0) -> tuple[McpEndpoint, FakeBackend]:
    backend = FakeBackend(answers({"server/discover": discover_result({"tools": {}}), "tools/list": LIST,
                                   "tools/call": tools_call_answer}), name="a")
    dispatcher = Dispatcher(RouteTable([Target(backend, "a__")]))
    return McpEndpoint(dispatcher, max_body_bytes=1 << 20, keepalive_seconds=keepalive_seconds), backend


async def test_a_notification_is_202_with_no_body_and_reaches_no_backend():
    endpoint, backend = endpoint_for({"content": []})
    answer = await exchange(endpoint, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}})
    assert answer.status == 202 and answer.headers[b"content-length"] == b"0" and answer.body == b""
    assert backend.calls == []


@pytest.mark.parametrize("verb", ["GET", "DELETE", "PUT"])
async def test_anything_but_post_is_405_naming_post(verb):
    endpoint, _ = endpoint_for({"content": []})
    answer = await exchange(endpoint, method=verb)
    assert answer.status == 405 and answer.headers[b"allow"] == b"POST"
    assert answer.json()["error"]["code"] == rpc.INVALID_REQUEST and "id" not in answer.json()


async def test_a_message_answer_is_json_with_the_request_id():
    endpoint, backend = endpoint_for({"content": [{"type": "text", "text": "hi"}], "resultType": "complete"})
    answer = await exchange(endpoint, *tools_call(request_id="r-1")[:1], headers=tools_call()[1])
    assert answer.status == 200 and answer.headers[b"content-type"] == b"application/json"
    assert answer.json() == {"jsonrpc": "2.0", "id": "r-1",
                             "result": {"content": [{"type": "text", "text": "hi"}], "resultType": "complete"}}
    assert int(answer.headers[b"content-length"]) == len(answer.body)
    assert backend.calls[-1].name == "t"


async def test_the_call_carries_the_principal_the_authentication_policy_set():
    endpoint, backend = endpoint_for({"content": [], "resultType": "complete"})
    alice = Principal("alice", "https://idp", True)
    body, headers = tools_call()
    await exchange(endpoint, body, headers=headers, scope={"auth": alice})
    assert backend.calls[-1].principal is alice


async def test_a_stream_answer_is_sse_event_by_event_ending_with_the_response():
    endpoint, backend = endpoint_for(stream(progress(1), progress(2), {"content": [], "resultType": "complete"}))
    body, headers = tools_call()
    answer = await exchange(endpoint, body, headers=headers)
    assert answer.status == 200 and answer.headers[b"content-type"] == b"text/event-stream"
    events = answer.events()
    assert [e.get("method") for e in events] == ["notifications/progress", "notifications/progress", None]
    assert events[-1] == {"jsonrpc": "2.0", "id": 7, "result": {"content": [], "resultType": "complete"}}
    # One event per body message; the final one ends the response.
    assert [c["more_body"] for c in answer.chunks] == [True, True, False]
    assert answer.chunks[0]["body"] == sse.encode(events[0])
    assert backend.closed_streams == backend.released == 1


@pytest.mark.parametrize(("failure", "code"), [
    (rpc.backend_timeout("a", 5), rpc.BACKEND_TIMEOUT),
    (RuntimeError("connection reset"), rpc.BACKEND_PROTOCOL_ERROR),  # never a broken stream
])
async def test_a_failure_after_the_headers_is_the_last_event_with_the_request_id(failure, code):
    endpoint, backend = endpoint_for(stream(progress(1), fail=failure))
    body, headers = tools_call(request_id=11)
    answer = await exchange(endpoint, body, headers=headers)
    assert answer.status == 200  # the headers were out before the failure
    events = answer.events()
    assert events[0]["method"] == "notifications/progress"
    assert events[-1]["id"] == 11 and events[-1]["error"]["code"] == code
    assert events[-1]["error"]["data"]["backend"] == "a"
    assert answer.chunks[-1]["more_body"] is False
    assert backend.closed_streams == 1


async def test_a_quiet_stream_gets_keepalive_comments():
    async def slow() -> Any:
        yield progress(1)
        await asyncio.sleep(0.25)
        yield {"jsonrpc": "2.0", "id": 7, "result": {"content": [], "resultType": "complete"}}

    endpoint, _ = endpoint_for(lambda call: Reply("a", stream=slow()), keepalive_seconds=0.05)
    body, headers = tools_call()
    answer = await exchange(endpoint, body, headers=headers)
    bodies = [c["body"] for c in answer.chunks]
    assert sse.KEEPALIVE in bodies and bodies.index(sse.KEEPALIVE) > 0
    assert answer.events()[-1]["result"]["resultType"] == "complete"


async def test_a_client_gone_at_the_first_write_still_closes_the_backend_stream():
    endpoint, backend = endpoint_for(stream(progress(1), {"content": [], "resultType": "complete"}))
    body, headers = tools_call()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            raise OSError("client gone")

    wire = [(k.encode(), v.encode()) for k, v in headers.items()]
    with pytest.raises(OSError):
        await endpoint({"type": "http", "method": "POST", "path": "/mcp", "headers": wire}, receive, send)
    # The stream was never read: what the backend holds is released all the same.
    assert backend.released == 1


async def test_a_refusal_before_the_headers_is_json_with_its_status():
    endpoint, _ = endpoint_for({"content": []})
    body, headers = tools_call(name="zz__unknown")
    answer = await exchange(endpoint, body, headers=headers)
    assert answer.status == 400 and answer.json()["error"]["code"] == rpc.INVALID_PARAMS
    assert answer.json()["id"] == 7


async def test_an_unexpected_exception_is_500_internal_error_with_the_id():
    def broken(call: Any) -> Any:
        raise ZeroDivisionError

    endpoint, _ = endpoint_for(broken)
    body, headers = tools_call()
    answer = await exchange(endpoint, body, headers=headers)
    assert answer.status == 500
    assert answer.json() == {"jsonrpc": "2.0", "id": 7,
                             "error": {"code": rpc.INTERNAL_ERROR, "message": "Internal error in the gateway"}}


async def test_an_invalid_body_is_refused_before_any_backend():
    endpoint, backend = endpoint_for({"content": []})
    answer = await exchange(endpoint, b"{not json", headers={"mcp-protocol-version": "2026-07-28"})
    assert answer.status == 400 and answer.json()["error"]["code"] == rpc.PARSE_ERROR
    assert backend.calls == []


@pytest.mark.parametrize(("method", "cancelled"), [("tools/call", True), ("tools/list", False)])
async def test_a_client_that_leaves_cancels_a_long_running_call_only(method, cancelled):
    """`MethodSpec.long_running` decides: closing the response stream is the modern
    cancellation (SHTTP §Cancellation); a quick method is answered whatever the client does."""
    outcome: list[str] = []
    finish = asyncio.Event()

    async def work(call: Any) -> Any:
        try:
            await asyncio.wait_for(finish.wait(), 1.0)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        except TimeoutError:
            outcome.append("finished")
        return LIST if call.method == "tools/list" else {"content": [], "resultType": "complete"}

    # tools/call first lists the tools (their x-mcp-header annotations), answered at once.
    backend = FakeBackend(answers({"server/discover": discover_result({"tools": {}}), "tools/call": work,
                                   "tools/list": work if method == "tools/list" else LIST}), name="a")
    await backend.discover()
    dispatcher = Dispatcher(RouteTable([Target(backend, "a__")]))
    endpoint = McpEndpoint(dispatcher, max_body_bytes=1 << 20, keepalive_seconds=30)
    if method == "tools/call":
        body, headers = tools_call()
    else:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"_meta": META}}
        headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    messages = iter([{"type": "http.request", "body": orjson.dumps(body), "more_body": False}])

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})  # the client leaves at once

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    wire = [(k.encode(), v.encode()) for k, v in headers.items()]
    await asyncio.wait_for(endpoint({"type": "http", "method": "POST", "path": "/mcp", "headers": wire},
                                    receive, send), 5)
    assert outcome == (["cancelled"] if cancelled else ["finished"])
    assert bool(sent) is not cancelled  # a cancelled call writes nothing
