"""The HTTP+SSE client (gateway/backends/legacy/sse.py) and its detection, against a tiny
real server on loopback written to the 2024-11-05 transport page: a GET stream whose first
event names the POST endpoint, 202 for every POST, every answer on the stream. It can answer
`initialize` with 2024-11-05, which no SDK server still does, and name any endpoint."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.backends.base import internal_call
from gateway.backends.detect import probe_http
from gateway.backends.legacy.sse import LegacySseBackend, endpoint_uri
from gateway.protocol import jsonrpc as rpc
from gateway.settings import BackendSettings
from tests.support.asgi import App, read_body, serving


class OldServer:
    """One session at a time; records what reached its endpoint."""

    def __init__(self, *, version: str = "2024-11-05", endpoint: str = "/messages?session=1") -> None:
        self.version = version
        self.endpoint = endpoint
        self.posts: list[dict[str, Any]] = []
        self.stream: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["method"] == "GET" and scope["path"] == "/mcp":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": f"event: endpoint\ndata: {self.endpoint}\n\n".encode(),
                        "more_body": True})
            while True:
                message = await self.stream.get()
                await send({"type": "http.response.body", "more_body": True,
                            "body": b"event: message\ndata: " + orjson.dumps(message) + b"\n\n"})
        if scope["method"] == "POST" and scope["path"] == "/messages":
            message = orjson.loads(await read_body(receive))
            self.posts.append(message)
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b"Accepted"})
            self.answer(message)
            return
        await read_body(receive)
        await send({"type": "http.response.start", "status": 405, "headers": [(b"allow", b"GET")]})
        await send({"type": "http.response.body", "body": b"Method Not Allowed"})

    def answer(self, message: dict[str, Any]) -> None:
        method, request_id = message.get("method"), message.get("id")
        if request_id is None or method is None:
            return
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": self.version, "capabilities": {"tools": {}},
                                      "serverInfo": {"name": "old-server", "version": "0.1"}}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": message["params"]["arguments"]["text"]}]}
        else:
            self.stream.put_nowait({"jsonrpc": "2.0", "id": request_id,
                                    "error": {"code": -32601, "message": f"no {method}"}})
            return
        self.stream.put_nowait({"jsonrpc": "2.0", "id": request_id, "result": result})


def _backend(url: str, **extra: Any) -> LegacySseBackend:
    return LegacySseBackend(BackendSettings(name="old", url=url, transport="sse", connect_timeout_seconds=2, **extra))


async def test_a_2024_11_05_server_is_served() -> None:
    server = OldServer()
    async with serving(server) as url:
        backend = _backend(url)
        await backend.start()
        try:
            reply = await backend.send(internal_call("tools/call", {"name": "echo", "arguments": {"text": "hi"}},
                                                     request_id=7))
            assert reply.message is not None
            assert reply.message["id"] == 7
            assert reply.message["result"]["content"] == [{"type": "text", "text": "hi"}]
            assert reply.message["result"]["resultType"] == "complete"
            (session,) = backend.pool.sessions()
            assert session.version == "2024-11-05"
            assert [m.get("method") for m in server.posts] == ["initialize", "notifications/initialized", "tools/call"]
        finally:
            await backend.aclose()


async def test_an_endpoint_on_another_origin_is_refused() -> None:
    server = OldServer(endpoint="http://attacker.example:9/messages")
    async with serving(server) as url:
        backend = _backend(url, headers={"authorization": "Bearer backend-secret"})
        await backend.start()
        try:
            with pytest.raises(rpc.McpError) as info:
                await backend.send(internal_call("tools/call", {"name": "echo", "arguments": {"text": "x"}}))
            assert info.value.code == rpc.BACKEND_PROTOCOL_ERROR
            assert "attacker.example" in info.value.message and "origin" in info.value.message
            assert server.posts == []
        finally:
            await backend.aclose()


class RefusingServer(OldServer):
    """Takes the handshake, then answers every POST of a tools/call with `status`."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.status, self.body = status, body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["method"] == "POST" and scope["path"] == "/messages":
            body = await read_body(receive)
            if orjson.loads(body).get("method") == "tools/call":
                await send({"type": "http.response.start", "status": self.status,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": self.body})
                return
            receive = _replay(body)
        await super().__call__(scope, receive, send)


def _replay(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


@pytest.mark.parametrize(("status", "code", "says"), [
    (401, rpc.BACKEND_UNAVAILABLE, "refused tools/call: HTTP 401: the gateway's credentials"),
    (503, rpc.BACKEND_UNAVAILABLE, "HTTP 503 from the message endpoint"),
], ids=["401", "503"])
async def test_a_refused_post_to_the_message_endpoint_names_what_the_backend_answered(
        status: int, code: int, says: str) -> None:
    """As for Streamable HTTP backends: a 4xx without a JSON-RPC answer is the backend refusing
    the gateway (-31001 with data.status), a 5xx the backend unavailable (-31001)."""
    async with serving(RefusingServer(status, b"no")) as url:
        backend = _backend(url)
        await backend.start()
        try:
            with pytest.raises(rpc.McpError) as info:
                await backend.send(internal_call("tools/call", {"name": "echo", "arguments": {"text": "x"}}))
            assert info.value.code == code and says in info.value.message, info.value.message
        finally:
            await backend.aclose()


async def test_an_unknown_version_is_refused_by_name() -> None:
    async with serving(OldServer(version="2023-01-01")) as url:
        backend = _backend(url)
        await backend.start()
        try:
            with pytest.raises(rpc.McpError) as info:
                await backend.send(internal_call("tools/call", {"name": "echo", "arguments": {"text": "x"}}))
            assert "2023-01-01" in info.value.message and "2024-11-05" in info.value.message
        finally:
            await backend.aclose()


async def test_the_probe_tells_the_old_transport_by_its_endpoint_event() -> None:
    async with serving(OldServer()) as url:
        assert await probe_http(BackendSettings(name="old", url=url)) == "legacy-sse"
        # Pinned to Streamable HTTP: the 405 is just a legacy answer.
        assert await probe_http(BackendSettings(name="old", url=url, transport="streamable-http")) == "legacy"


async def test_a_405_without_an_event_stream_is_plain_legacy() -> None:
    async def refuses(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await read_body(receive)
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app: App = refuses
    async with serving(app) as url:
        assert await probe_http(BackendSettings(name="old", url=url, connect_timeout_seconds=2)) == "legacy"


def test_endpoint_uri_resolves_relative_and_refuses_other_origins() -> None:
    base = "http://127.0.0.1:8000/sse"
    assert endpoint_uri(base, "/messages/?session_id=ab") == "http://127.0.0.1:8000/messages/?session_id=ab"
    assert endpoint_uri(base, " messages?x=1\n") == "http://127.0.0.1:8000/messages?x=1"
    assert endpoint_uri(base, "http://127.0.0.1:8000/m") == "http://127.0.0.1:8000/m"
    for foreign in ("http://127.0.0.1:8001/m", "https://127.0.0.1:8000/m", "//evil.example/m"):
        with pytest.raises(ValueError):
            endpoint_uri(base, foreign)
