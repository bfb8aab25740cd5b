"""A legacy Streamable HTTP backend that misbehaves, dies or restarts, behind the real gateway
(gateway/backends/legacy/http.py, http_backend.py, pool.py, backend.py, listen.py).

Each test drives a modern client request through the in-process gateway on a real loopback
socket to `FlakyLegacy`, a hand-written initialize-era server under uvicorn whose every answer
the test scripts: HTTP errors and bodies that are no JSON-RPC answer, POST streams cut before
their response (L-TR §Sending Messages: the client SHOULD poll with GET + `Last-Event-ID`
after `retry`; §Resumability), GET streams refused (405: no stream, L-TR §Listening), failing
(5xx), dropped or expired (404 → new session, L-TR §Session Management), handshakes that stall
or whose `notifications/initialized` is refused. The client always gets the gateway's own error
(README "Errors the gateway makes": -31001 unavailable, -31002 timeout, -31003 invalid answer,
`data.backend` naming the backend, a message that says what failed), and the next call works.

L-TR = the 2025-11-25 specification, basic/transports (Streamable HTTP).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import REGISTRY

from gateway.backends.legacy.http import _MAX_RESUMES
from tests.support import mcp_http
from tests.support.asgi import read_body, serving
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.listen import ListenReader, eventually


def sse_event(message: Any = None, *, id: str | None = None, retry: int | None = None) -> bytes:
    """One SSE event: a JSON-RPC message, or (message None) a priming event with empty data."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if retry is not None:
        lines.append(f"retry: {retry}")
    if message is None:
        lines.append("data: ")
    else:
        lines += ["event: message", "data: " + orjson.dumps(message).decode()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def result(request: dict[str, Any], text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": text}]}}


# What mcp 1.30 answers for an unknown session (tests/fixtures/servers/README-legacy.md).
SESSION_NOT_FOUND = {"jsonrpc": "2.0", "id": "server-error", "error": {"code": -32600, "message": "Session not found"}}
_GONE, _DROP = object(), object()


class Answer:
    """One HTTP exchange at the fake backend. A handler that returns after `start` without
    `end` leaves the response incomplete: uvicorn then closes the connection mid-body, which
    is what a backend that dies or is cut off looks like from the gateway."""

    def __init__(self, receive: Any, send: Any, headers: dict[str, str], message: dict[str, Any] | None
                 ) -> None:
        self._receive, self._send = receive, send
        self.headers = headers
        self.message = message
        self.queue: asyncio.Queue[Any] = asyncio.Queue()  # what a held stream writes next
        self.gone = asyncio.Event()  # the gateway closed the connection

    async def watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone.set()
        self.queue.put_nowait(_GONE)

    async def start(self, status: int, content_type: str = "application/json", *, length: int | None = None,
                    extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        headers = [(b"content-type", content_type.encode()), *extra]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": data})

    async def json(self, message: Any, status: int = 200, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        body = orjson.dumps(message)
        await self.start(status, length=len(body), extra=extra)
        await self.end(body)

    async def text(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        await self.start(status, content_type, length=len(body))
        await self.end(body)

    async def truncated(self, status: int, body: bytes) -> None:
        """Announces more bytes than it sends, then the connection drops."""
        await self.start(status, length=len(body) + 100)
        await self.write(body)

    async def sse(self) -> None:
        await self.start(200, "text/event-stream")

    async def event(self, message: Any = None, *, id: str | None = None, retry: int | None = None) -> None:
        await self.write(sse_event(message, id=id, retry=retry))

    async def hold(self) -> None:
        """Write what the test queues until it drops the connection or the gateway goes away."""
        while (item := await self.queue.get()) is not _GONE and item is not _DROP:
            await self.write(item)


Handler = Callable[[Answer], Awaitable[None]]


async def echo(answer: Answer) -> None:
    assert answer.message is not None
    await answer.json(result(answer.message, answer.message["params"]["arguments"].get("text", "")))


class FlakyLegacy:
    """An initialize-era Streamable HTTP server (2025-11-25) written to L-TR, scriptable per
    request. Sessions are minted at initialize and required on every other request (404 when
    unknown); `tools` answer tools/call by name; `faults[method]` handlers answer the next
    requests of that method instead of the default (one each, in order); `get_faults` answer
    the next GETs; a GET with a `Last-Event-ID` found in `replays` gets those events and ends;
    any other GET is a live stream the test writes to with `push`. Everything that reaches the
    endpoint is recorded in `seen`."""

    def __init__(self) -> None:
        self.capabilities = {"tools": {"listChanged": True}, "logging": {},
                             "resources": {"subscribe": True, "listChanged": True}}
        self.sessions: set[str] = set()
        self._minted = itertools.count(1)
        self.seen: list[dict[str, Any]] = []
        self.tools: dict[str, Handler] = {"echo": echo}
        self.faults: dict[str, list[Handler]] = {}
        self.get_faults: list[Handler] = []
        self.get_refusal: Handler | None = None  # answers every GET (a server without GET streams)
        self.replays: dict[str, list[bytes]] = {}
        self.streams: list[tuple[str, Answer]] = []  # live GET streams: (session id, answer)

    # -- what tests look at and do ----------------------------------------------------------

    def requests(self, method: str | None, verb: str = "POST") -> list[dict[str, Any]]:
        return [s for s in self.seen if s["verb"] == verb and s["method"] == method]

    def gets(self) -> list[dict[str, Any]]:
        return [s for s in self.seen if s["verb"] == "GET"]

    def live_streams(self, session: str | None = None) -> list[Answer]:
        return [a for sid, a in self.streams if session is None or sid == session]

    def push(self, message: dict[str, Any], *, id: str | None = None, session: str | None = None) -> None:
        for answer in self.live_streams(session):
            answer.queue.put_nowait(sse_event(message, id=id))

    def drop_streams(self, session: str | None = None) -> None:
        for answer in self.live_streams(session):
            answer.queue.put_nowait(_DROP)

    def restart(self) -> None:
        """What a restarted process looks like: every session forgotten, every stream cut."""
        self.sessions.clear()
        self.drop_streams()

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await read_body(receive)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        message = orjson.loads(body) if body else None
        session = headers.get("mcp-session-id")
        self.seen.append({"verb": scope["method"], "method": (message or {}).get("method"),
                          "session": session, "last_event_id": headers.get("last-event-id"), "message": message})
        answer = Answer(receive, send, headers, message)
        watcher = asyncio.create_task(answer.watch())
        try:
            await self._dispatch(scope["method"], answer, session)
        finally:
            watcher.cancel()

    async def _dispatch(self, verb: str, answer: Answer, session: str | None) -> None:
        message = answer.message or {}
        method = message.get("method")
        if verb == "POST" and method == "initialize":
            fault = self._fault("initialize")
            if fault is not None:
                return await fault(answer)
            session = f"s{next(self._minted)}"
            self.sessions.add(session)
            return await answer.json({"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": message["params"]["protocolVersion"], "capabilities": self.capabilities,
                "serverInfo": {"name": "flaky", "version": "1"}}}, extra=((b"mcp-session-id", session.encode()),))
        if verb == "GET" and (self.get_faults or self.get_refusal):
            return await (self.get_faults.pop(0) if self.get_faults else self.get_refusal)(answer)
        if session not in self.sessions:
            return await answer.json(SESSION_NOT_FOUND, status=404)
        if verb == "DELETE":
            self.sessions.discard(session)
            return await answer.text(200, b"")
        if verb == "GET":
            return await self._get(answer, session)
        fault = self._fault(method)
        if fault is not None:
            return await fault(answer)
        if "id" not in message or method is None:  # a notification, or an answer to our request
            return await answer.text(202, b"")
        if method == "tools/call":
            return await self.tools[message["params"]["name"]](answer)
        if method == "tools/list":
            tools = [{"name": name, "inputSchema": {"type": "object"}} for name in self.tools]
            return await answer.json({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": tools}})
        return await answer.json({"jsonrpc": "2.0", "id": message["id"], "result": {}})

    def _fault(self, method: str | None) -> Handler | None:
        waiting = self.faults.get(method) if method is not None else None
        return waiting.pop(0) if waiting else None

    async def _get(self, answer: Answer, session: str) -> None:
        last = answer.headers.get("last-event-id")
        if last is not None and last in self.replays:
            await answer.sse()
            for event in self.replays[last]:
                await answer.write(event)
            return await answer.end()
        await answer.sse()
        await answer.write(b": open\r\n\r\n")
        entry = (session, answer)
        self.streams.append(entry)
        try:
            await answer.hold()
        finally:
            self.streams.remove(entry)


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[FlakyLegacy, str]]:
    server = FlakyLegacy()
    async with serving(server) as url:
        yield server, url


def settings(url: str, **options: Any) -> dict[str, Any]:
    return {"backends": [{"name": "old", "url": url, "era": "legacy", "timeout_seconds": 5,
                          "connect_timeout_seconds": 2, **options}],
            "cache": {"store": "none"}, "subscriptions": {"linger_seconds": 0}}


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a gateway response: its JSON body, or its stream's last message."""
    if response.headers["content-type"].startswith("text/event-stream"):
        return mcp_http.sse_messages(response.text)[-1]
    return response.json()


async def call(http: httpx.AsyncClient, gw: RunningGateway, tool: str = "echo", text: str = "hi", *,
               id: Any = 1, meta: dict[str, Any] | None = None) -> httpx.Response:
    return await mcp_http.post(http, gw.url, "tools/call", {"name": tool, "arguments": {"text": text}}, id=id,
                               meta=meta)


async def still_serves(http: httpx.AsyncClient, gw: RunningGateway, text: str = "next", *,
                       meta: dict[str, Any] | None = None) -> None:
    """The gateway keeps serving: the next call through it to the same backend works."""
    response = await call(http, gw, "echo", text, id="after", meta=meta)
    assert response.status_code == 200, response.text
    assert answer_of(response)["result"]["content"][0]["text"] == text


def gateway_error(response: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = answer_of(response)["error"]
    assert error["code"] == code, error
    assert error["data"]["backend"] == "old"
    assert error["message"].startswith("Backend 'old'")
    return error


# -- a POST answered with something that is not the answer (http.py `_consume`) ----------------


async def _http_503(answer: Answer) -> None:
    await answer.text(503, b"upstream overloaded")


async def _html(answer: Answer) -> None:
    await answer.text(200, b"<html>captive portal</html>", "text/html")


async def _json_without_answer(answer: Answer) -> None:
    await answer.json({"jsonrpc": "2.0", "status": "ok"})


async def _another_id(answer: Answer) -> None:
    await answer.json({"jsonrpc": "2.0", "id": 987654, "result": {"content": []}})


async def _cut_json(answer: Answer) -> None:
    await answer.truncated(200, b'{"jsonrpc": "2.0", "id"')


@pytest.mark.parametrize(("handler", "status", "code", "says"), [
    (_http_503, 502, -31001, "HTTP 503 for tools/call"),
    (_html, 502, -31003, "HTTP 200 without a JSON-RPC answer for tools/call"),
    (_json_without_answer, 502, -31003, "HTTP 200 without a JSON-RPC answer for tools/call"),
    (_another_id, 502, -31003, "answered another request"),
    (_cut_json, 502, -31001, "connection closed before the response was complete"),
], ids=["http-503", "html", "json-without-answer", "another-id", "body-cut"])
async def test_a_post_answer_that_is_no_json_rpc_answer_is_a_gateway_error(flaky, handler, status, code, says):
    server, url = flaky
    server.tools["broken"] = handler
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "broken"), status, code)
        assert says in error["message"]
        await still_serves(http, gw)
    assert len(server.requests("initialize")) == 1  # the session survived its bad answer


async def _http_401(answer: Answer) -> None:
    await answer.text(401, b"unauthorized")


async def _proxy_403(answer: Answer) -> None:
    # An auth proxy in front of the backend, with JSON of its own that is no JSON-RPC answer.
    await answer.json({"error": "token expired"}, status=403)


@pytest.mark.parametrize(("handler", "says"), [
    (_http_401, "refused tools/call: HTTP 401: the gateway's credentials for it (backends[].headers) were refused"),
    (_proxy_403, "refused tools/call: HTTP 403 (token expired): the gateway's credentials"),
], ids=["401", "proxy-403"])
async def test_a_4xx_without_a_json_rpc_answer_is_the_backend_refusing_the_gateway(flaky, handler, says):
    """As for a modern backend (README "Errors the gateway makes"): -31001 naming the backend
    and its status, never -31003 (an invalid answer, which would also send the era probe off
    again for nothing) and never the backend's own 401, which the client would read as the
    gateway's auth challenge."""
    server, url = flaky
    server.tools["guarded"] = handler
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "guarded"), 502, -31001)
        assert says in error["message"]
        assert error["data"]["status"] in (401, 403)
        await still_serves(http, gw)
    assert len(server.requests("initialize")) == 1  # the session survived the refusal


async def _huge_json(answer: Answer) -> None:
    await answer.json(result(answer.message, "x" * 8192))


async def _huge_event(answer: Answer) -> None:
    await answer.sse()
    await answer.event(id="e1", retry=20)
    await answer.event(result(answer.message, "x" * 8192), id="e2")
    await answer.end()


@pytest.mark.parametrize("handler", [_huge_json, _huge_event], ids=["json", "sse-event"])
async def test_an_answer_past_max_response_bytes_is_refused_and_not_resumed(flaky, handler):
    """Past `max_response_bytes` the answer is not read on (-31003 naming the setting), and a
    stream is not resumed: a resume would only fetch the same event again."""
    server, url = flaky
    server.tools["huge"] = handler
    async with running_gateway(settings(url, max_response_bytes=4096)) as gw, httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "huge"), 502, -31003)
        assert "exceeds 4096 bytes (backends[].max_response_bytes)" in error["message"]
        await still_serves(http, gw)
    assert server.gets() == []


# -- a POST stream cut before its response (http.py `_read_stream`) ----------------------------


def _progress(request: dict[str, Any], n: int) -> dict[str, Any]:
    token = request["params"]["_meta"]["progressToken"]  # the gateway's own token (gw-<n>)
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": n}}


PROGRESS = {"progressToken": "mine"}
# A client whose capability set has no session yet: its call makes the gateway handshake (the
# session of the capability-less set was opened by the gateway's start-up discovery).
FRESH = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}


@pytest.mark.parametrize("cut", ["dropped", "closed"])
async def test_a_post_stream_cut_before_its_response_is_resumed_with_last_event_id(flaky, cut):
    """L-TR §Sending Messages 6: after an event id the server MAY close the connection without
    ending the stream; the client polls with GET + Last-Event-ID after `retry`. The modern client
    sees one uninterrupted stream, and the tool ran once (a resume, not a replay)."""
    server, url = flaky

    async def interrupted(answer: Answer) -> None:
        request = answer.message
        # What the GET with Last-Event-ID: e2 gets: the rest of this stream.
        server.replays["e2"] = [sse_event(_progress(request, 2), id="e3"),
                                sse_event(result(request, "resumed"), id="e4")]
        await answer.sse()
        await answer.event(id="e1", retry=20)  # priming: an id and the retry to wait
        await answer.event(_progress(request, 1), id="e2")
        if cut == "closed":
            await answer.end()  # the HTTP response ends, the SSE stream does not (no answer yet)
        # else: return mid-body: the connection drops

    server.tools["interrupted"] = interrupted
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await call(http, gw, "interrupted", meta=PROGRESS)
        assert response.status_code == 200
        messages = mcp_http.sse_messages(response.text)
        assert [m["params"]["progress"] for m in messages[:-1]] == [1, 2]
        assert all(m["params"]["progressToken"] == "mine" for m in messages[:-1])
        assert messages[-1]["result"]["content"][0]["text"] == "resumed"
        (resume,) = server.gets()
        (post,) = server.requests("tools/call")
        assert resume["last_event_id"] == "e2" and resume["session"] == post["session"]
        await still_serves(http, gw)


async def test_a_stream_that_keeps_ending_without_its_response_is_given_up(flaky):
    """Polling is bounded: each resumed stream ends without the response, and after
    _MAX_RESUMES GETs the call fails instead of polling forever."""
    server, url = flaky
    for n in range(1, 10):
        server.replays[f"e{n}"] = [sse_event(id=f"e{n + 1}")]

    async def never_answers(answer: Answer) -> None:
        await answer.sse()
        await answer.event(id="e1", retry=0)
        await answer.end()

    server.tools["never"] = never_answers
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "never"), 502, -31003)
        assert "the stream for tools/call ended without a response" in error["message"]
        assert [g["last_event_id"] for g in server.gets()] == [f"e{n}" for n in range(1, _MAX_RESUMES + 1)]
        await still_serves(http, gw)


async def _cut_after_priming(answer: Answer) -> None:
    await answer.sse()
    await answer.event(id="e1", retry=0)


def _forget_session_then_cut(server: FlakyLegacy) -> Handler:
    async def handler(answer: Answer) -> None:
        server.sessions.clear()  # a restart between the POST and the resume
        await _cut_after_priming(answer)
    return handler


@pytest.mark.parametrize(("refusal", "says"), [
    ("404", "no longer knows the session"), ("405", "no GET stream"), ("503", "HTTP 503"),
])
async def test_a_stream_that_cannot_be_resumed_fails_and_the_next_call_works(flaky, refusal, says):
    """The resuming GET is refused: the session is gone (404), there is no GET stream (405),
    or the backend fails (5xx). The request may have been processed, so it is not replayed:
    -31001 saying why, and the next call works (after 404, on a new session)."""
    server, url = flaky
    if refusal == "404":
        server.tools["cut"] = _forget_session_then_cut(server)
    else:
        server.tools["cut"] = _cut_after_priming
        status = int(refusal)
        server.get_faults.append(lambda answer: answer.text(status, b"no"))
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "cut"), 502, -31001)
        assert "could not resume the stream" in error["message"] and says in error["message"]
        assert [g["last_event_id"] for g in server.gets()] == ["e1"]
        await still_serves(http, gw)
    # After the 404 the next call met the forgotten session too, and the gateway started a new one.
    assert len(server.requests("initialize")) == (2 if refusal == "404" else 1)


async def _cut_at_once(answer: Answer) -> None:
    await answer.sse()


async def _cut_after_progress(answer: Answer) -> None:
    await answer.sse()
    await answer.event(_progress(answer.message, 1))


async def _ends_at_once(answer: Answer) -> None:
    await answer.sse()
    await answer.end()


@pytest.mark.parametrize(("handler", "code", "says"), [
    (_cut_at_once, -31001, "the stream for tools/call broke before its response"),
    (_cut_after_progress, -31001, "the stream for tools/call broke before its response"),
    (_ends_at_once, -31003, "the stream for tools/call ended without a response"),
], ids=["cut-at-once", "cut-after-progress", "ended-without-response"])
async def test_a_stream_without_event_ids_cannot_be_resumed(flaky, handler, code, says):
    """No event id, nothing to resume from: a connection that broke is the backend being
    unavailable (-31001, as a modern backend's broken stream), a stream that ended normally
    without the response is an invalid answer (-31003). After a progress message the client
    already has a 200 stream: the error is its last message."""
    server, url = flaky
    server.tools["cut"] = handler
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await call(http, gw, "cut", meta=PROGRESS)
        if handler is _cut_after_progress:
            assert response.status_code == 200
            first, last = mcp_http.sse_messages(response.text)
            assert first["method"] == "notifications/progress" and first["params"]["progressToken"] == "mine"
            assert last["error"]["code"] == code and last["error"]["data"] == {"backend": "old"}
            assert says in last["error"]["message"]
        else:
            assert says in gateway_error(response, 502, code)["message"]
        assert server.gets() == []  # nothing to resume from
        await still_serves(http, gw)


# -- stalls (http.py `_read_stream` timeout; backend.py `_named`) --------------------------------


def _checks_made(backend: str) -> float:
    return sum(REGISTRY.get_sample_value("mcp_gateway_backend_health_checks_total",
                                         {"backend": backend, "result": result}) or 0 for result in ("ok", "failed"))


@pytest.mark.parametrize("era", ["legacy", "auto"])
async def test_an_active_check_asks_the_backend_itself_not_its_open_session(flaky, era):
    """`server/discover` of a legacy backend is its open session's initialize, answered with no
    request: the active check pings that session as well, so a backend that fails every POST
    fails its checks and stays ejected (a check that passed on the remembered initialize alone
    ended the ejection at once, and the calls failed again), and one that answers again is
    back at the next check, even with an error for `ping`. `era: auto`: the probed delegate's
    check."""
    server, url = flaky
    health = {"consecutive_failures": 1, "check_interval_seconds": 0.2, "check_timeout_seconds": 1,
              "failed_checks": 1}
    async with running_gateway(settings(url, era=era, retries=0, health=health)) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        await still_serves(http, gw)  # the session is open
        backend = gw.runtime.snapshot.backends[0]
        server.faults["tools/call"] = [_http_503]
        server.faults["ping"] = [_http_503] * 1000
        gateway_error(await call(http, gw), 502, -31001)
        assert backend.health.ejected
        checks = _checks_made("old")
        await eventually(lambda: _checks_made("old") >= checks + 3, timeout=10)
        assert backend.health.ejected, "a check that never reached the backend ended its ejection"
        assert len(server.requests("ping")) >= 3
        # Calls served again, and `ping` answered with an error (a server without it): an answer
        # all the same, so the next check passes and ends the ejection.
        server.faults = {"ping": [_no_ping] * 1000}
        await eventually(lambda: not backend.health.ejected, timeout=10)
        await still_serves(http, gw)
    assert len(server.requests("initialize")) == 1  # every check pinged the one open session


async def _no_ping(answer: Answer) -> None:
    await answer.json({"jsonrpc": "2.0", "id": answer.message["id"],
                       "error": {"code": -32601, "message": "Method not found"}})


async def test_a_handshake_that_stalls_times_out_and_the_next_call_handshakes_again(flaky):
    """initialize answered with an event stream that never carries the result: -31002 after
    timeout_seconds (never a hang), and the next call's handshake succeeds."""
    server, url = flaky

    async def stalls(answer: Answer) -> None:
        await answer.sse()  # the initialize answer starts, and nothing more comes
        await answer.hold()

    async with running_gateway(settings(url, timeout_seconds=0.5)) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        server.faults["initialize"] = [stalls]
        error = gateway_error(await call(http, gw, meta=FRESH), 504, -31002)
        assert "did not answer within 0.5s" in error["message"]
        await still_serves(http, gw, meta=FRESH)
    assert len(server.requests("initialize")) == 3  # discovery's, the stalled one, the next call's


async def test_a_call_kept_alive_but_never_answered_times_out_and_is_cancelled(flaky):
    """Keep-alive comments reset no per-message timeout: the call ends with -31002 after
    timeout_seconds without a message, and the backend is told (L-TR: disconnecting is not
    cancelling, so the gateway sends notifications/cancelled)."""
    server, url = flaky

    async def keeps_alive(answer: Answer) -> None:
        await answer.sse()
        while not answer.gone.is_set():
            await answer.write(b": still working\r\n\r\n")
            await asyncio.sleep(0.05)

    server.tools["hung"] = keeps_alive
    async with running_gateway(settings(url, timeout_seconds=0.5)) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "hung"), 504, -31002)
        assert "tools/call" in error["message"] and "0.5s" in error["message"]
        (post,) = server.requests("tools/call")
        await eventually(lambda: server.requests("notifications/cancelled"))
        (cancelled,) = server.requests("notifications/cancelled")
        assert cancelled["message"]["params"]["requestId"] == post["message"]["id"]
        await still_serves(http, gw)


# -- the handshake's notification refused (http.py `_send`, pool.py `_open`) -------------------


async def _initialize_405(answer: Answer) -> None:
    await answer.text(405, b"method not allowed")


@pytest.mark.parametrize(("handler", "code", "says", "probed_again"), [
    (_http_401, -31001, "refused initialize: HTTP 401", False),
    (_initialize_405, -31003, "HTTP 405 without a JSON-RPC answer for initialize", True),
], ids=["401", "405"])
async def test_a_refused_initialize_says_whether_the_url_still_speaks_streamable_http(
        flaky, caplog, handler, code, says, probed_again):
    """A 401 to initialize is the backend refusing the gateway's credentials (-31001); a 405 to
    it is a URL that no longer takes Streamable HTTP POSTs (an HTTP+SSE server now, say): an
    invalid answer (-31003), after which the era is probed again (detect.py)."""
    server, url = flaky
    async with running_gateway(settings(url, era="auto")) as gw, httpx.AsyncClient(timeout=30) as http:
        server.faults["initialize"] = [handler]
        with caplog.at_level(logging.INFO, logger="gateway.backends.detect"):
            error = gateway_error(await call(http, gw, meta=FRESH), 502, code)
        assert says in error["message"]
        assert ("the era will be probed again" in caplog.text) is probed_again
        await still_serves(http, gw, meta=FRESH)


async def _initialized_503(answer: Answer) -> None:
    await answer.text(503, b"warming up")


async def _initialized_400(answer: Answer) -> None:
    await answer.text(400, b"bad request")


async def _initialized_cut(answer: Answer) -> None:
    await answer.truncated(202, b"Acc")


async def _initialized_404(answer: Answer) -> None:
    # Behind a load balancer without sticky sessions: another replica never heard of it.
    await answer.json(SESSION_NOT_FOUND, status=404)


@pytest.mark.parametrize(("handler", "code", "says"), [
    (_initialized_503, -31001, "HTTP 503 for notifications/initialized"),
    (_initialized_400, -31001, "refused notifications/initialized: HTTP 400"),
    (_initialized_cut, -31001, "connection closed before the response was complete"),
    (_initialized_404, -31003, "404 on initialize"),
], ids=["503", "400", "body-cut", "404"])
async def test_a_refused_initialized_notification_fails_the_call_and_the_next_call_handshakes_again(
        flaky, handler, code, says):
    """The handshake's last step fails (L-LC: initialize, then notifications/initialized): the
    call that needed the session fails naming the step, the half-made session is not kept,
    and the next call handshakes again."""
    server, url = flaky
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        server.faults["notifications/initialized"] = [handler]
        error = gateway_error(await call(http, gw, meta=FRESH), 502, code)
        assert says in error["message"]
        refused = server.requests("notifications/initialized")[-1]["session"]
        # The backend minted a session the gateway will never use: it is ended (L-TR §Session
        # Management 5), unless the backend said it does not know it (404).
        assert [d["session"] for d in server.requests(None, "DELETE")] == ([] if handler is _initialized_404
                                                                           else [refused])
        await still_serves(http, gw, meta=FRESH)
    # discovery's handshake, the refused one, the next call's
    assert len(server.requests("initialize")) == len(server.requests("notifications/initialized")) == 3


# -- expiry that re-initializing does not cure (pool.py `request`) ------------------------------


async def test_a_backend_that_expires_every_new_session_is_replayed_once_then_refused(flaky):
    """A 404 means "not processed": re-initialize and replay once (L-TR §Session Management 4).
    A backend that 404s the brand-new session too (replicas behind a load balancer without
    sticky sessions) must not loop."""
    server, url = flaky

    async def not_here(answer: Answer) -> None:
        await answer.json(SESSION_NOT_FOUND, status=404)

    server.tools["elsewhere"] = not_here
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        error = gateway_error(await call(http, gw, "elsewhere"), 502, -31001)
        assert "expired a brand-new session" in error["message"]
        first, replay = server.requests("tools/call")
        assert first["session"] != replay["session"]
        assert len(server.requests("initialize")) == 2
        await still_serves(http, gw)
        assert len(server.requests("initialize")) == 2  # the new session serves the next call


# -- best-effort steps that fail (backend.py) --------------------------------------------------


async def test_a_failing_logging_set_level_does_not_fail_the_call(flaky):
    """Logging is best effort: the backend advertises it, then answers logging/setLevel with a
    5xx. The call that asked for logs is still served, and setLevel is not retried per call."""
    server, url = flaky
    server.faults["logging/setLevel"] = [_http_503]
    logs = {"io.modelcontextprotocol/logLevel": "info"}
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        for n in range(2):
            response = await call(http, gw, "echo", f"logged {n}", id=n, meta=logs)
            assert response.status_code == 200, response.text
            assert answer_of(response)["result"]["content"][0]["text"] == f"logged {n}"
    assert len(server.requests("logging/setLevel")) == 1


async def test_a_backend_request_during_a_list_is_refused_and_the_list_still_arrives(flaky):
    """Only tools/call, prompts/get and resources/read can carry input requests (§h.5): a
    sampling request on a tools/list stream is answered -32601 upstream (never left hanging)
    and the list is relayed once the backend goes on."""
    server, url = flaky

    def refusal() -> dict[str, Any] | None:
        return next((s["message"] for s in server.seen if (s["message"] or {}).get("id") == "srv-1"), None)

    async def listing_with_a_question(answer: Answer) -> None:
        await answer.sse()
        await answer.event({"jsonrpc": "2.0", "id": "srv-1", "method": "sampling/createMessage",
                            "params": {"messages": [], "maxTokens": 5}})
        await eventually(refusal)  # a server that waits for its answer, as SDK servers do
        await answer.event({"jsonrpc": "2.0", "id": answer.message["id"], "result": {
            "tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}})
        await answer.end()

    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        server.faults["tools/list"] = [listing_with_a_question]
        response = await mcp_http.post(http, gw.url, "tools/list")
        assert response.status_code == 200, response.text
        assert [t["name"] for t in answer_of(response)["result"]["tools"]] == ["echo"]
        assert refusal()["error"]["code"] == -32601
        await still_serves(http, gw)


# -- the GET stream behind subscriptions/listen (http.py `listen_stream`, http_backend.py) -----

TOOLS_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
BOTH = {"toolsListChanged": True, "resourceSubscriptions": ["demo://a"]}


def updated(uri: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}


def received(reader: ListenReader) -> list[tuple[str, str | None]]:
    return [(n["method"], n["params"].get("uri")) for n in reader.notifications]


async def listening(http: httpx.AsyncClient, gw: RunningGateway, **notifications: Any) -> ListenReader:
    reader = await ListenReader(http, gw.url, notifications, id="L").open()
    assert reader.status == 200 and reader.ack["method"] == "notifications/subscriptions/acknowledged", reader.error
    return reader


async def test_a_dropped_get_stream_is_reopened_with_last_event_id(flaky):
    """L-TR §Listening / §Resumability: the server may cut the GET stream at any time; the
    gateway reconnects with the last event id it saw, and the listener keeps hearing."""
    server, url = flaky
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        reader = await listening(http, gw, toolsListChanged=True)
        assert reader.ack["params"]["notifications"] == {"toolsListChanged": True}
        await eventually(lambda: server.live_streams())
        server.push(TOOLS_CHANGED, id="g1")
        await reader.wait_count(2)
        server.drop_streams()
        await eventually(lambda: len(server.gets()) == 2 and server.live_streams())
        assert [g["last_event_id"] for g in server.gets()] == [None, "g1"]
        server.push(TOOLS_CHANGED, id="g2")
        await reader.wait_count(3)
        assert received(reader) == [("notifications/tools/list_changed", None)] * 2
        await reader.close()
        await still_serves(http, gw)


async def test_a_get_stream_refused_with_5xx_is_retried_until_the_backend_serves_it(flaky):
    server, url = flaky
    server.get_faults += [lambda answer: answer.text(503, b"warming up")] * 2
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        reader = await listening(http, gw, toolsListChanged=True)
        assert reader.ack["params"]["notifications"] == {"toolsListChanged": True}
        await eventually(lambda: server.live_streams())
        assert len(server.gets()) == 3  # two refused, then the stream
        server.push(TOOLS_CHANGED)
        await reader.wait_count(2)
        assert received(reader) == [("notifications/tools/list_changed", None)]
        await reader.close()
        await still_serves(http, gw)


async def _get_405(answer: Answer) -> None:
    await answer.text(405, b"Method Not Allowed")


async def _get_json(answer: Answer) -> None:
    await answer.json({"hello": "not a stream"})


@pytest.mark.parametrize("refusal", [_get_405, _get_json], ids=["405", "json"])
async def test_a_backend_without_a_get_stream_gets_no_list_changed_promise(flaky, refusal):
    """L-TR §Listening 3: 405 (or anything but an event stream) means no GET stream. The ack
    promises no list changes, which could only come on it (SUB: the ack is what will be
    honoured); resource updates still come on request streams and still reach the listener.
    Without the polling fallback, which would promise the list changes it polls
    (test_listen_polling.py)."""
    server, url = flaky
    server.get_refusal = refusal

    async def touch(answer: Answer) -> None:
        await answer.sse()
        await answer.event(updated("demo://a"))
        await answer.event(result(answer.message, "touched"))
        await answer.end()

    server.tools["touch"] = touch
    config = settings(url)
    config["subscriptions"]["poll_fallback"] = False
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        reader = await listening(http, gw, toolsListChanged=True, resourceSubscriptions=["demo://a"])
        assert reader.ack["params"]["notifications"] == {"resourceSubscriptions": ["demo://a"]}
        assert answer_of(await call(http, gw, "touch"))["result"]["content"][0]["text"] == "touched"
        await reader.wait_count(2)
        assert received(reader) == [("notifications/resources/updated", "demo://a")]
        await reader.close()
        await still_serves(http, gw)


async def test_a_backend_restart_under_a_live_listen_renews_session_and_subscriptions(flaky):
    """The GET stream breaks, its reconnect gets 404 (L-TR §Session Management 4): a new
    session, the subscriptions made again on it, a list_changed to the listeners (changes may
    have been missed), and a GET stream on the new session that delivers."""
    server, url = flaky
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        reader = await listening(http, gw, toolsListChanged=True, resourceSubscriptions=["demo://a"])
        assert reader.ack["params"]["notifications"] == BOTH
        await eventually(lambda: server.live_streams("s1"))
        server.restart()
        await reader.wait_count(2)
        assert received(reader) == [("notifications/tools/list_changed", None)]
        await eventually(lambda: server.live_streams("s2"))
        subscribed = [(s["session"], s["message"]["params"]["uri"]) for s in server.requests("resources/subscribe")]
        assert subscribed == [("s1", "demo://a"), ("s2", "demo://a")]
        server.push(updated("demo://a"), session="s2")
        await reader.wait_count(3)
        assert received(reader)[-1] == ("notifications/resources/updated", "demo://a")
        await reader.close()
        await still_serves(http, gw)


async def test_the_first_listen_after_a_backend_restart_is_acknowledged_in_full(flaky):
    """The backend restarted while nobody listened; the first listen opens the GET stream on
    the warm (now unknown) session, gets 404 and renews it. It must then listen on the new
    session: on the stale one, whose id is gone, it took the backend for a stateless one and
    acknowledged nothing."""
    server, url = flaky
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        server.restart()
        reader = await listening(http, gw, toolsListChanged=True, resourceSubscriptions=["demo://a"])
        assert reader.ack["params"]["notifications"] == BOTH
        assert {s["session"] for s in server.requests("resources/subscribe")} == {"s2"}
        await eventually(lambda: server.live_streams("s2"))
        server.push(updated("demo://a"), session="s2")
        server.push(TOOLS_CHANGED, session="s2")
        await reader.wait(lambda: {("notifications/resources/updated", "demo://a"),
                                   ("notifications/tools/list_changed", None)} <= set(received(reader)))
        await reader.close()
        await still_serves(http, gw)


async def test_the_get_stream_moves_to_a_session_renewed_by_a_call(flaky):
    """The backend expires the listen session (L-TR §Session Management 3) and a request is the
    first to hear it (404 → new session, replayed). The listen moves to the new session: its
    GET stream is opened there, although the backend kept the old one open (it MAY end it, L-TR
    §Sending Messages 6) and the renewal was still under way when the gateway let it go."""
    server, url = flaky
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        reader = await listening(http, gw, toolsListChanged=True)
        await eventually(lambda: server.live_streams("s1"))
        server.sessions.clear()  # expired, its GET stream left open
        await still_serves(http, gw, "renewed")
        assert server.requests("tools/call")[-1]["session"] == "s2"
        assert [g["session"] for g in server.gets()].count("s1") == 1  # the renewal came from a POST
        await eventually(lambda: server.live_streams("s2"))
        server.push(TOOLS_CHANGED, session="s2", id="x")
        await reader.wait_count(3)  # the renewal's list_changed, then this one
        assert received(reader) == [("notifications/tools/list_changed", None)] * 2
        await reader.close()
