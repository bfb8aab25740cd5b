"""A modern backend that misbehaves, as the client of the gateway sees it: a real client request
through the real gateway (tests/support/gateway.py) to a raw loopback server
(tests/support/raw_http.py) that answers with exactly the bytes each test chooses.

Covered, each with the HTTP status, the JSON-RPC code, `data.backend` and a message that says
what failed (README "Errors the gateway makes"; gateway-made codes sit outside the reserved
range, digest §a.4), and each followed by a call that still works:

- answers that are not MCP: invalid JSON, JSON that is not JSON-RPC, the wrong content type
  (SHTTP: a request is answered `application/json` or `text/event-stream`, digest §a.1) → -31003;
- a 5xx whose body is not a JSON-RPC error (text, HTML, a proxy's own JSON) → -31001; a 4xx
  without a relayable JSON-RPC error → -31001 naming the status (digest §a.3 gives only
  400/404 a JSON-RPC body);
- an answer that is not HTTP, a protocol upgrade, a TLS failure, a connection closed before or
  during the answer → -31001; a body that stalls → -31002, and the backend sees its connection
  closed; a read answered 503 is retried once (idempotent, no byte sent yet);
- on an SSE answer (digest §c): a stream that ends without a response, stalls, or breaks its
  HTTP framing ends with an error event carrying the request id; what a server MUST NOT send on
  a stream (requests; log messages nobody asked for, LOG) and what is not a JSON-RPC object is
  dropped; a quiet stream gets keep-alive comments;
- result rewriting (dispatch.py `modernize`): a result type the client did not negotiate
  (digest §j, Tasks only when declared) and `input_required` outside tools/call, prompts/get and
  resources/read (digest §f) → -31003; a backend's legacy -32002 → -32602 (digest §a.4);
- routing: a list no backend offers → 404 -32601 (digest §a.3); completion refs go to the
  backend that serves the prompt or resource, malformed or unknown ones → -32602; an unknown
  URI whose re-listing fails everywhere (an error, garbage, silence) → -32602 "Resource not
  found" (RES: the answer for a URI nobody is known to serve).

The 4xx statuses a backend refuses the gateway with (401/403/405) are in
test_backend_statuses.py; the lean client's framing in tests/unit/test_backends_http1.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.raw_http import json_answer, read_request, serve, sse_chunk

Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter
# A scripted answer: writes what it likes for the request `msg`; returns False to end the
# connection (the server closes it), True to keep it for the next request.
Script = Callable[[Reader, Writer, dict[str, Any]], Awaitable[bool]]

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
SSE_END = b"0\r\n\r\n"


def event(message: Any) -> bytes:
    """One SSE `message` event as one chunk of a chunked body."""
    return sse_chunk(b"event: message\ndata: " + orjson.dumps(message) + b"\n\n")


def progress(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "p", "progress": n}}


def result(rid: Any, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": {"resultType": "complete", **fields}}


def answer(status: int, content_type: bytes | None, body: bytes) -> Script:
    """A well-framed answer (Content-Length); the connection stays open."""
    async def script(reader: Reader, writer: Writer, msg: dict[str, Any]) -> bool:
        head = b"HTTP/1.1 %d Scripted\r\n" % status
        if content_type is not None:
            head += b"content-type: " + content_type + b"\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        return True
    return script


def raw(data: bytes, *, then: str = "close") -> Script:
    """Write `data` as is, then close the connection or (`then="stall"`) hold it until the
    gateway closes it."""
    async def script(reader: Reader, writer: Writer, msg: dict[str, Any]) -> bool:
        writer.write(data)
        await writer.drain()
        if then == "stall":
            await reader.read()  # until the gateway closes its side
        return False
    return script


class RawBackend:
    """A modern backend over a raw socket. server/discover and the lists are answered
    properly; a tools/call (by tool name), resources/read (by URI) or completion/complete (by
    method) with a script is answered by the script, anything else with a plain result."""

    def __init__(self, scripts: dict[str, Script] | None = None, *,
                 capabilities: dict[str, Any] | None = None, lists: dict[str, Script] | None = None) -> None:
        self.scripts = scripts or {}
        self.capabilities = capabilities if capabilities is not None else {"tools": {}, "resources": {}}
        self.lists = lists or {}
        self.seen: list[tuple[str, str | None]] = []  # (method, key) of every request
        self.bodies: list[bytes] = []  # every request body, as received
        self.closed_by_gateway: list[str] = []  # keys whose connection the gateway closed mid-answer
        self.gateway_closed = asyncio.Event()

    def asked(self, method: str, key: str | None = None) -> int:
        return sum(1 for m, k in self.seen if m == method and (key is None or k == key))

    async def handle(self, reader: Reader, writer: Writer) -> None:
        while True:
            _, _, body = await read_request(reader)
            self.bodies.append(body)
            msg = orjson.loads(body)
            method, params, rid = msg["method"], msg.get("params") or {}, msg.get("id")
            key = {"tools/call": params.get("name"), "resources/read": params.get("uri")}.get(method, method)
            self.seen.append((method, key))
            script = self.lists.get(method) if method.endswith("/list") else self.scripts.get(key)
            if script is not None:
                keep = await script(reader, writer, msg)
                if not keep:
                    if reader.at_eof():
                        self.closed_by_gateway.append(key)
                        self.gateway_closed.set()
                    return
                continue
            writer.write(json_answer(orjson.dumps(self.ordinary(method, params, rid))))

    def ordinary(self, method: str, params: dict[str, Any], rid: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {"ttlMs": 0, "cacheScope": "private"}
        if method == "server/discover":
            fields.update(supportedVersions=["2026-07-28"], capabilities=self.capabilities)
        elif method == "tools/list":
            fields["tools"] = [{"name": n, "inputSchema": {"type": "object"}}
                               for n in ["echo", *self.scripts] if "/" not in n]
        elif method.endswith("/list"):
            fields[{"prompts/list": "prompts", "resources/list": "resources",
                    "resources/templates/list": "resourceTemplates"}[method]] = []
        elif method == "tools/call":
            fields["content"] = [{"type": "text", "text": f"echo {params.get('arguments')}"}]
        elif method == "resources/read":
            fields["contents"] = [{"uri": params["uri"], "text": "content"}]
        elif method == "completion/complete":
            ref = params["ref"]
            fields["completion"] = {"values": [f"for {ref.get('name') or ref.get('uri')}"]}
        return result(rid, **fields)


@contextlib.asynccontextmanager
async def gateway_before(*backends: tuple[Any, ...], **backend_settings: Any
                         ) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The gateway in front of each raw backend, given as (name, RawBackend[, its own
    settings]) with era pinned modern (no probe), and a client."""
    async with contextlib.AsyncExitStack() as stack:
        configured = []
        for name, backend, *own in backends:
            url, _ = await stack.enter_async_context(serve(backend.handle))
            configured.append({"name": name, "url": url, "era": "modern", **backend_settings, **(own or [{}])[0]})
        # Keep-alive comments at once on a quiet stream (one test waits for one; the others'
        # clients skip them, as clients must, digest §c).
        settings = {"backends": configured, "server": {"keepalive_seconds": 0.05}}
        gw = await stack.enter_async_context(running_gateway(settings))
        client = await stack.enter_async_context(httpx.AsyncClient(trust_env=False, timeout=15))
        yield gw, client


async def call(client: httpx.AsyncClient, gw: Any, tool: str, *, id: Any = 1,
               meta: dict[str, Any] | None = None) -> httpx.Response:
    return await mcp_http.post(client, gw.url, "tools/call", {"name": tool, "arguments": {}}, id=id, meta=meta)


def gateway_error(response: httpx.Response, status: int, code: int, backend: str = "raw", *, id: Any = 1
                  ) -> str:
    """Assert a gateway-made error naming `backend`; returns its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["id"] == id
    assert body["error"]["code"] == code, body
    assert body["error"]["data"]["backend"] == backend
    assert f"{backend!r}" in body["error"]["message"]
    return body["error"]["message"]


async def still_serving(client: httpx.AsyncClient, gw: Any, tool: str = "echo") -> None:
    response = await call(client, gw, tool, id="after")
    assert response.status_code == 200, response.text
    assert response.json()["result"]["content"][0]["text"] == "echo {}"


# -- JSON answers that are not MCP ----------------------------------------------------------


@pytest.mark.parametrize(("script", "says"), [
    (answer(200, b"application/json", b'{"jsonrpc": "2.0", "id": 1, "result": {'), "body is not valid JSON"),
    (answer(200, b"application/json", b'{"hello": "world"}'), "body is not a JSON-RPC response"),
    (answer(200, b"application/json", b"[1, 2]"), "body is not a JSON-RPC response"),
    (answer(200, b"text/html; charset=utf-8", b"<html>hello</html>"), "HTTP 200 with content-type 'text/html'"),
    (answer(200, None, b'{"jsonrpc": "2.0", "id": 1, "result": {}}'), "HTTP 200 with content-type 'none'"),
    (answer(200, b"application/json", b'{"jsonrpc": "2.0", "id": 1, "result": "done"}'),
     "neither a result object nor an error object"),
    (answer(200, b"application/json", b'{"jsonrpc": "2.0", "id": 1, "error": "bad"}'),
     "neither a result object nor an error object"),
], ids=["invalid-json", "not-json-rpc", "json-array", "html", "no-content-type", "result-not-object",
        "error-not-object"])
async def test_an_answer_that_is_not_mcp_is_a_502_protocol_error(script: Script, says: str) -> None:
    async with gateway_before(("raw", RawBackend({"odd": script}))) as (gw, client):
        message = gateway_error(await call(client, gw, "odd"), 502, -31003)
        assert says in message
        await still_serving(client, gw)


async def test_a_streamed_answer_that_is_not_mcp_ends_the_stream_with_a_protocol_error() -> None:
    """The stream has begun (200) when its last event turns out to be no JSON-RPC response: it
    ends with -31003 for the call instead of relaying `"result": ["done"]` as the answer."""
    odd = answer(200, b"text/event-stream", b'data: {"jsonrpc": "2.0", "id": 1, "result": ["done"]}\n\n')
    async with gateway_before(("raw", RawBackend({"odd": odd}))) as (gw, client):
        response = await call(client, gw, "odd")
        assert response.status_code == 200, response.text
        final = mcp_http.sse_messages(response.text)[-1]
        assert final["id"] == 1 and final["error"]["code"] == -31003, final
        assert "neither a result object nor an error object" in final["error"]["message"]
        await still_serving(client, gw)


@pytest.mark.parametrize(("script", "status"), [
    (answer(500, b"text/plain", b"boom"), 500),
    (answer(502, b"text/html", b"<html><h1>502 Bad Gateway</h1></html>"), 502),
    # A proxy in front of the backend (Kong, an API gateway) answers its 5xx in JSON.
    (answer(503, b"application/json", b'{"message": "failure to get a peer from the ring-balancer"}'), 503),
    (answer(500, b"application/json", b'{"error": "Internal Server Error"}'), 500),
    (answer(500, b"text/plain", b"{not json at all"), 500),
], ids=["500-text", "502-html", "503-json-not-rpc", "500-error-not-object", "500-brace-not-json"])
async def test_a_5xx_without_a_json_rpc_error_is_the_backend_unavailable(script: Script, status: int) -> None:
    async with gateway_before(("raw", RawBackend({"down": script}))) as (gw, client):
        message = gateway_error(await call(client, gw, "down"), 502, -31001)
        assert f"HTTP {status}" in message
        await still_serving(client, gw)


@pytest.mark.parametrize(("script", "status", "says"), [
    # A framework's own 404 for a wrong path (FastAPI's default body).
    (answer(404, b"application/json", b'{"detail": "Not Found"}'), 404, "HTTP 404"),
    (answer(400, b"application/json", b'{"jsonrpc": "2.0", "id": 1, "error": "bad"}'), 400, "HTTP 400"),
    (answer(400, b"text/plain", b"bad request"), 400, "HTTP 400"),
    (answer(400, b"application/json", b"{bad request"), 400, "HTTP 400"),
    (answer(403, b"text/plain", b"{forbidden"), 403, "HTTP 403: the gateway's credentials for it"),
], ids=["404-framework-json", "400-error-not-object", "400-text", "400-brace-not-json", "403-brace-not-json"])
async def test_a_4xx_without_a_json_rpc_error_is_the_backend_refusing(script: Script, status: int,
                                                                      says: str) -> None:
    async with gateway_before(("raw", RawBackend({"refused": script}))) as (gw, client):
        response = await call(client, gw, "refused")
        message = gateway_error(response, 502, -31001)
        assert response.json()["error"]["data"] == {"backend": "raw", "status": status}
        assert "refused the request" in message and says in message
        await still_serving(client, gw)


# -- what the backend is sent -------------------------------------------------------------------


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a first-wins parser reads it (the gateway's orjson keeps the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


async def test_the_backend_is_sent_the_message_the_gateway_checked_not_the_clients_bytes() -> None:
    """A name said twice: the gateway reads the last (`echo`, which Mcp-Name and the route agree
    with); a backend whose parser keeps the first must not be handed `secret`. The backend gets
    the validated message encoded again, so every parser reads the same call."""
    body = (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "secret", '
            b'"arguments": {"a": 1}, "name": "echo", "_meta": {'
            b'"io.modelcontextprotocol/protocolVersion": "2026-07-28", '
            b'"io.modelcontextprotocol/clientCapabilities": {}}}}')
    backend = RawBackend()
    async with gateway_before(("raw", backend)) as (gw, client):
        response = await client.post(gw.url, content=body, headers={
            "content-type": "application/json", "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo"})
        assert response.status_code == 200, response.text
    sent = backend.bodies[-1]
    assert b"secret" not in sent
    as_first_wins = json.loads(sent, object_pairs_hook=_first_wins)
    assert as_first_wins["method"] == "tools/call"
    assert as_first_wins["params"]["name"] == "echo" and as_first_wins["params"]["arguments"] == {"a": 1}


# -- answers that are not HTTP, or do not arrive ----------------------------------------------


@pytest.mark.parametrize(("script", "says"), [
    (raw(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), "invalid HTTP response"),
    (raw(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", then="stall"),
     "unexpected protocol upgrade"),
    (raw(b""), "connection closed before the response was complete"),
], ids=["not-http", "upgrade", "closed-unanswered"])
async def test_an_answer_that_is_not_http_is_the_backend_unavailable(script: Script, says: str) -> None:
    async with gateway_before(("raw", RawBackend({"odd": script}))) as (gw, client):
        message = gateway_error(await call(client, gw, "odd"), 502, -31001)
        assert says in message
        await still_serving(client, gw)


async def test_a_body_cut_short_is_unavailable() -> None:
    async def cut(reader: Reader, writer: Writer, msg: dict[str, Any]) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
                     b'{"jsonrpc": "2.0", "id": 1, "res')
        await writer.drain()
        await asyncio.sleep(0.2)  # the gateway is reading the body by now (either way: the same answer)
        return False

    async with gateway_before(("raw", RawBackend({"cut": cut}))) as (gw, client):
        message = gateway_error(await call(client, gw, "cut"), 502, -31001)
        assert "connection closed before the response was complete" in message
        await still_serving(client, gw)


async def test_a_body_that_stalls_times_out_and_its_connection_is_closed() -> None:
    stall = raw(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
                b'{"jsonrpc": "2.0", "id": 1, "res', then="stall")
    backend = RawBackend({"stall": stall})
    async with gateway_before(("raw", backend), timeout_seconds=0.5) as (gw, client):
        message = gateway_error(await call(client, gw, "stall"), 504, -31002)
        assert "within 0.5s" in message
        await asyncio.wait_for(backend.gateway_closed.wait(), 10)  # the backend's work is cancelled too
        assert backend.closed_by_gateway == ["stall"]
        await still_serving(client, gw)


async def test_a_tls_failure_says_so() -> None:
    async def plain_http(reader: Reader, writer: Writer) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")  # to a ClientHello
        await writer.drain()

    async with serve(plain_http) as (url, _):
        secure = url.replace("http://", "https://")
        settings = {"backends": [{"name": "tls", "url": secure, "era": "modern"}]}
        async with running_gateway(settings, discover=False) as gw, \
                httpx.AsyncClient(trust_env=False, timeout=15) as client:
            message = gateway_error(await call(client, gw, "anything"), 502, -31001, "tls")
            assert f"TLS to 127.0.0.1:{urlsplit(url).port} failed" in message


@pytest.mark.parametrize("busy", [
    b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "busy"}}',
    b'{"message": "failure to get a peer from the ring-balancer"}',  # a proxy's own 503
], ids=["json-rpc-error", "proxy-json"])
async def test_a_read_answered_503_is_retried_once(busy: bytes) -> None:
    # resources/read is idempotent and no byte reached the client yet (backends[].retries).
    attempts: list[int] = []

    async def busy_once(reader: Reader, writer: Writer, msg: dict[str, Any]) -> bool:
        attempts.append(1)
        if len(attempts) == 1:
            return await answer(503, b"application/json", busy)(reader, writer, msg)
        second = result(msg["id"], contents=[{"uri": "raw://r", "text": "second"}])
        writer.write(json_answer(orjson.dumps(second)))
        return True

    async with gateway_before(("raw", RawBackend({"raw://r": busy_once}))) as (gw, client):
        response = await mcp_http.post(client, gw.url, "resources/read", {"uri": "raw://r"})
        assert response.status_code == 200, response.text
        assert response.json()["result"]["contents"][0]["text"] == "second"
        assert len(attempts) == 2


# -- SSE answers ----------------------------------------------------------------------------


def stream_script(*parts: bytes | Callable[[], Awaitable[Any]], final: dict[str, Any] | None = None,
                  then: str = "close") -> Script:
    """The SSE head, then each part: bytes written as they come, a callable awaited in
    between; then `final` (a result, sent with the request's id) and the end of the body."""
    async def script(reader: Reader, writer: Writer, msg: dict[str, Any]) -> bool:
        writer.write(SSE_HEAD)
        for part in parts:
            if callable(part):
                await part()
            else:
                writer.write(part)
            await writer.drain()
        if final is not None:
            writer.write(event({"jsonrpc": "2.0", "id": msg["id"], "result": final}) + SSE_END)
        if then == "stall":
            await reader.read()
        return then == "keep"
    return script


async def streamed(client: httpx.AsyncClient, gw: Any, tool: str) -> list[dict[str, Any]]:
    """The messages of the SSE answer to a call (id "s1", with a progress token)."""
    response = await call(client, gw, tool, id="s1", meta={"progressToken": "p"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return mcp_http.sse_messages(response.text)


async def streamed_until(client: httpx.AsyncClient, gw: Any, tool: str, seen: bytes, then: asyncio.Event
                         ) -> list[dict[str, Any]]:
    """Read the SSE answer to a call as it arrives; set `then` once `seen` has arrived (the
    backend waits for it before its next move). The messages of the whole answer."""
    body = mcp_http.body("tools/call", {"name": tool, "arguments": {}}, id="s1", meta={"progressToken": "p"})
    received = b""
    async with client.stream("POST", gw.url, content=orjson.dumps(body),
                             headers=mcp_http.headers("tools/call", tool)) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            received += chunk
            if seen in received:
                then.set()
    assert then.is_set(), received
    return mcp_http.sse_messages(received.decode())


def final_error(messages: list[dict[str, Any]], code: int) -> str:
    """Assert the stream's last message is a gateway-made error for request "s1" naming the
    backend (headers were sent: the error travels as the final event); returns its message."""
    final = messages[-1]
    assert final["id"] == "s1" and final["error"]["code"] == code, final
    assert final["error"]["data"]["backend"] == "raw" and "'raw'" in final["error"]["message"]
    return final["error"]["message"]


async def test_a_stream_that_ends_without_a_response_ends_with_an_error() -> None:
    ends = stream_script(event(progress(1)), SSE_END, then="keep")
    async with gateway_before(("raw", RawBackend({"ends": ends}))) as (gw, client):
        messages = await streamed(client, gw, "ends")
        assert messages[0] == progress(1)
        assert "stream ended without a response" in final_error(messages, -31003)
        assert len(messages) == 2
        await still_serving(client, gw)


async def test_a_stream_that_stalls_times_out_and_the_backend_sees_it_closed() -> None:
    backend = RawBackend({"stalls": stream_script(event(progress(1)), then="stall")})
    async with gateway_before(("raw", backend), timeout_seconds=0.5) as (gw, client):
        messages = await streamed(client, gw, "stalls")
        assert messages[0] == progress(1)
        assert "within 0.5s" in final_error(messages, -31002)
        await asyncio.wait_for(backend.gateway_closed.wait(), 10)
        assert backend.closed_by_gateway == ["stalls"]
        await still_serving(client, gw)


async def test_a_stream_whose_http_framing_breaks_ends_with_an_error() -> None:
    relayed = asyncio.Event()
    broken = stream_script(event(progress(1)), relayed.wait, b"zz not a chunk size\r\n", then="stall")
    async with gateway_before(("raw", RawBackend({"broken": broken}))) as (gw, client):
        messages = await streamed_until(client, gw, "broken", b"notifications/progress", relayed)
        assert messages[0] == progress(1)
        message = final_error(messages, -31001)
        assert "stream broke" in message and "invalid HTTP response" in message
        assert len(messages) == 2
        await still_serving(client, gw)


async def test_what_must_not_travel_on_a_stream_is_dropped() -> None:
    sampling = {"jsonrpc": "2.0", "id": 99, "method": "sampling/createMessage", "params": {"messages": []}}
    log_message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    noisy = stream_script(
        event(progress(1)),
        event(sampling),  # servers MUST NOT send requests on any stream (SHTTP)
        event(log_message),  # the request set no logLevel (LOG)
        sse_chunk(b"event: message\ndata: {not json\n\n"),
        event(42),
        event([progress(2), "not an object"]),  # a 2025-03-26 batch
        final={"resultType": "complete"}, then="keep")
    async with gateway_before(("raw", RawBackend({"noisy": noisy}))) as (gw, client):
        messages = await streamed(client, gw, "noisy")
        assert messages == [progress(1), progress(2),
                            {"jsonrpc": "2.0", "id": "s1", "result": {"resultType": "complete"}}]
        await still_serving(client, gw)


async def test_a_quiet_stream_gets_keepalive_comments() -> None:
    commented = asyncio.Event()
    quiet = stream_script(event(progress(1)), commented.wait, final={"resultType": "complete", "content": []},
                          then="keep")
    async with gateway_before(("raw", RawBackend({"quiet": quiet}))) as (gw, client):
        # The backend sends its result only once a comment line followed the progress event.
        messages = await streamed_until(client, gw, "quiet", b"\n:\r\n", commented)
        assert messages == [progress(1), {"jsonrpc": "2.0", "id": "s1",
                                          "result": {"resultType": "complete", "content": []}}]


# -- answers too large to buffer ----------------------------------------------------------------


LIMIT = 4096  # backends[].max_response_bytes for these tests
BIG = b"x" * (2 * LIMIT)


def _chunked_json(reader: Reader, writer: Writer, msg: dict[str, Any]) -> Awaitable[bool]:
    """A JSON answer without a length (chunked), larger than the limit."""
    async def script() -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                     + sse_chunk(orjson.dumps(result(msg["id"], pad=BIG.decode()))) + SSE_END)
        return True
    return script()


def _huge_event(reader: Reader, writer: Writer, msg: dict[str, Any]) -> Awaitable[bool]:
    """A stream whose one event is larger than the limit, sent whole."""
    async def script() -> bool:
        writer.write(SSE_HEAD + event(progress(1)) + event(result(msg["id"], pad=BIG.decode())) + SSE_END)
        return True
    return script()


def _endless_line(reader: Reader, writer: Writer, msg: dict[str, Any]) -> Awaitable[bool]:
    """A stream whose data line never ends: it must not be buffered for ever."""
    async def script() -> bool:
        writer.write(SSE_HEAD + sse_chunk(b"data: "))
        for _ in range(2 * LIMIT // 256 + 1):
            writer.write(sse_chunk(b"y" * 256))
            await writer.drain()
        await asyncio.sleep(5)  # still "sending" when the gateway gives up on it
        return False
    return script()


@pytest.mark.parametrize(("script", "streamed"), [
    (answer(200, b"application/json", orjson.dumps(result(1, pad=BIG.decode()))), False),
    (_chunked_json, False),
    (_huge_event, True),
    (_endless_line, True),
], ids=["json", "chunked-json", "sse-event", "sse-endless-line"])
async def test_an_answer_larger_than_max_response_bytes_is_refused_unbuffered(script: Script, streamed: bool):
    """A broken or hostile backend cannot make the gateway buffer without bound: past
    `max_response_bytes` (a whole JSON body, or one SSE event) the call fails with -31003 naming
    the setting, the connection is closed, and the next call is served."""
    async with gateway_before(("raw", RawBackend({"huge": script}), {"max_response_bytes": LIMIT})) as (gw, client):
        response = await call(client, gw, "huge")
        if streamed:
            assert response.status_code == 200, response.text
            final = mcp_http.sse_messages(response.text)[-1]
            assert final["id"] == 1 and final["error"]["code"] == -31003, final
            message = final["error"]["message"]
        else:
            message = gateway_error(response, 502, -31003)
        assert f"exceeds {LIMIT} bytes (backends[].max_response_bytes)" in message
        await still_serving(client, gw)


# -- results the client cannot take ------------------------------------------------------------


def answers(message: dict[str, Any]) -> Script:
    async def script(reader: Reader, writer: Writer, msg: dict[str, Any]) -> bool:
        writer.write(json_answer(orjson.dumps({**message, "id": msg["id"]})))
        return True
    return script


TASK = {"jsonrpc": "2.0", "result": {"resultType": "task", "task": {"taskId": "t1", "status": "working"}}}


@pytest.mark.parametrize("extensions", [None, {}, {"com.example/other": {}}], ids=["none", "empty", "another"])
async def test_a_task_result_the_client_did_not_negotiate_is_a_protocol_error(extensions: Any) -> None:
    caps = {} if extensions is None else {"extensions": extensions}
    async with gateway_before(("raw", RawBackend({"tasky": answers(TASK)}))) as (gw, client):
        response = await call(client, gw, "tasky", meta={"io.modelcontextprotocol/clientCapabilities": caps})
        message = gateway_error(response, 502, -31003)
        assert "result type 'task' the client did not negotiate" in message
        await still_serving(client, gw)


@pytest.mark.parametrize("extensions", [5, "io.modelcontextprotocol/tasks"], ids=["a-number", "a-string"])
async def test_extensions_that_are_no_object_are_refused_at_the_front_door(extensions: Any) -> None:
    # They declare nothing (a number was a 500, a string matched by substring): now the
    # malformed ClientCapabilities is the client's -32602, naming the field.
    backend = RawBackend({"tasky": answers(TASK)})
    async with gateway_before(("raw", backend)) as (gw, client):
        response = await call(client, gw, "tasky",
                              meta={"io.modelcontextprotocol/clientCapabilities": {"extensions": extensions}})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == -32602
        assert error["data"] == {"field": "_meta['io.modelcontextprotocol/clientCapabilities'].extensions"}
        await still_serving(client, gw)


async def test_a_task_result_passes_when_the_client_declared_tasks() -> None:
    caps = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    async with gateway_before(("raw", RawBackend({"tasky": answers(TASK)}))) as (gw, client):
        response = await call(client, gw, "tasky", meta={"io.modelcontextprotocol/clientCapabilities": caps})
        assert response.status_code == 200, response.text
        assert response.json() == {**TASK, "id": 1}


async def test_input_required_outside_the_mrtr_methods_is_a_protocol_error() -> None:
    asks = answers({"jsonrpc": "2.0", "result": {"resultType": "input_required", "requestState": "s"}})
    backend = RawBackend({"completion/complete": asks}, capabilities={"tools": {}, "completions": {}})
    async with gateway_before(("raw", backend)) as (gw, client):
        response = await mcp_http.post(client, gw.url, "completion/complete", {
            "ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": ""}})
        message = gateway_error(response, 502, -31003)
        assert "input_required is not allowed for completion/complete" in message
        await still_serving(client, gw)


async def test_a_legacy_resource_not_found_code_becomes_invalid_params() -> None:
    gone = answers({"jsonrpc": "2.0", "error": {"code": -32002, "message": "no such resource",
                                                 "data": {"uri": "raw://gone"}}})
    async with gateway_before(("raw", RawBackend({"raw://gone": gone}))) as (gw, client):
        response = await mcp_http.post(client, gw.url, "resources/read", {"uri": "raw://gone"})
        assert response.status_code == 400
        assert response.json()["error"] == {"code": -32602, "message": "no such resource",
                                             "data": {"uri": "raw://gone"}}


# -- routing around what backends offer ---------------------------------------------------------


async def test_a_list_no_backend_offers_is_method_not_found() -> None:
    async with gateway_before(("raw", RawBackend(capabilities={"tools": {}}))) as (gw, client):
        response = await mcp_http.post(client, gw.url, "prompts/list")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == -32601
        assert (await mcp_http.post(client, gw.url, "tools/list")).status_code == 200


async def test_completion_refs_are_routed_or_refused() -> None:
    caps = {"tools": {}, "prompts": {}, "resources": {}, "completions": {}}
    a, b = RawBackend(capabilities=caps), RawBackend(capabilities=caps)
    async with gateway_before(("a", a), ("b", b)) as (gw, client):
        async def complete(ref: Any) -> httpx.Response:
            return await mcp_http.post(client, gw.url, "completion/complete",
                                       {"ref": ref, "argument": {"name": "x", "value": ""}})

        prompt = await complete({"type": "ref/prompt", "name": "b__greet"})
        assert prompt.json()["result"]["completion"]["values"] == ["for greet"]
        assert (b.asked("completion/complete"), a.asked("completion/complete")) == (1, 0)
        for bad, says in [("not an object", '"ref" must be an object'),
                          ({"type": "ref/prompt", "name": "nobody__greet"}, "Unknown prompt"),
                          ({"type": "ref/resource", "uri": "nowhere://x"}, "Resource not found"),
                          ({"type": "ref/tool", "name": "a__echo"}, '"ref" must be a ref/prompt')]:
            refused = await complete(bad)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == -32602 and says in refused.json()["error"]["message"]
        assert a.asked("completion/complete") + b.asked("completion/complete") == 1  # none of those went out


async def test_a_completion_for_a_resource_goes_to_the_backend_that_serves_it() -> None:
    caps = {"resources": {}, "completions": {}}
    a, b = RawBackend(capabilities=caps), RawBackend(capabilities=caps)
    async with gateway_before(("a", a), ("b", b, {"resource_prefixes": ["b-files://"]})) as (gw, client):
        response = await mcp_http.post(client, gw.url, "completion/complete", {
            "ref": {"type": "ref/resource", "uri": "b-files://x/{id}"}, "argument": {"name": "id", "value": ""}})
        assert response.status_code == 200, response.text
        assert response.json()["result"]["completion"]["values"] == ["for b-files://x/{id}"]
        assert (b.asked("completion/complete"), a.asked("completion/complete")) == (1, 0)


async def test_an_unknown_uri_whose_relisting_fails_is_not_found() -> None:
    rpc_error = answers({"jsonrpc": "2.0", "error": {"code": -32603, "message": "index broken"}})
    garbage = answer(200, b"application/json", b"{oops")
    silent = raw(b"", then="stall")
    backends = [("a", RawBackend(lists={"resources/list": rpc_error})),
                ("b", RawBackend(lists={"resources/list": garbage})),
                ("c", RawBackend(lists={"resources/list": silent}))]
    async with gateway_before(*backends, list_timeout_seconds=0.5) as (gw, client):
        response = await mcp_http.post(client, gw.url, "resources/read", {"uri": "lost://thing"})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == -32602 and error["data"] == {"uri": "lost://thing"}
        assert "Resource not found" in error["message"]
        assert all(backend.asked("resources/list") >= 1 for _, backend in backends)  # each was asked
        await still_serving(client, gw, "a__echo")


async def test_a_tools_list_that_pages_forever_is_followed_a_bounded_number_of_pages() -> None:
    # The first call of a tool the gateway has not listed reads the backend's tools/list (for
    # its x-mcp-header rules); a cursor that never ends must not hold the call forever.
    forever = answers({"jsonrpc": "2.0", "result": {
        "resultType": "complete", "tools": [{"name": "echo", "inputSchema": {"type": "object"}}],
        "nextCursor": "again"}})
    backend = RawBackend(lists={"tools/list": forever})
    async with gateway_before(("raw", backend)) as (gw, client):
        await still_serving(client, gw)
        assert backend.asked("tools/list") == 100
