"""gateway/http11.py, the HTTP/1.1 protocol under uvicorn, on a real loopback socket: raw
bytes in, raw bytes out, against small ASGI apps that show what the application saw."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import uvicorn

from gateway import http11
from gateway.http11 import MAX_HEADER_BYTES, MAX_PIPELINED, Http11Protocol
from tests.support.gateway import running_gateway
from tests.support.sockets import read_now

App = Any


@contextlib.asynccontextmanager
async def serving(app: App, *, read_timeout_seconds: float | None = None, **config: Any
                  ) -> AsyncIterator[tuple[int, uvicorn.Server]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    protocol: Any = Http11Protocol
    if read_timeout_seconds is not None:
        protocol = functools.partial(Http11Protocol, read_timeout_seconds=read_timeout_seconds)
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, lifespan="off", log_level="warning",
                                           timeout_graceful_shutdown=1, **config))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One response: status line, headers (lower-case), body (Content-Length or chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}
    if b"content-length" in headers:
        return status, headers, await reader.readexactly(int(headers[b"content-length"]))
    body = b""
    if headers.get(b"transfer-encoding") == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    return status, headers, body


def echo_app(seen: list[dict[str, Any]] | None = None) -> App:
    """Answers with the request body it read, with a Content-Length."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body, chunks = b"", 0
        while True:
            message = await receive()
            body += message.get("body", b"")
            chunks += 1
            if not message.get("more_body"):
                break
        if seen is not None:
            seen.append({"path": scope["path"], "query": scope["query_string"], "method": scope["method"],
                         "chunks": chunks, "headers": dict(scope["headers"])})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return app


async def test_keep_alive_pipelining_and_one_write_per_answer() -> None:
    seen: list[dict[str, Any]] = []
    async with serving(echo_app(seen)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Three requests in one segment: answered in order on the one connection.
        writer.write(b"".join(b"POST /p%d?x=%d HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\nb%d" % (i, i, i)
                              for i in range(3)))
        for i in range(3):
            status, headers, body = await read_response(reader)
            assert status == b"HTTP/1.1 200 OK" and body == b"b%d" % i
            assert b"date" in headers and b"connection" not in headers
        assert [(s["path"], s["query"]) for s in seen] == [("/p0", b"x=0"), ("/p1", b"x=1"), ("/p2", b"x=2")]
        writer.close()


async def test_chunked_request_bodies_stream_and_the_response_is_chunked_without_a_length() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message["body"])
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in parts:
            if part:
                await send({"type": "http.response.body", "body": part.upper(), "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with serving(app) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # a second chunk, later: the app reads it as a second message
        writer.write(b"2\r\nde\r\n0\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert headers[b"transfer-encoding"] == b"chunked"
        assert body == b"ABCDE"
        writer.close()


async def test_expect_100_continue_head_and_connection_close() -> None:
    async with serving(echo_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"ok")
        assert (await read_response(reader))[2] == b"ok"
        writer.write(b"HEAD / HTTP/1.1\r\nhost: h\r\n\r\n")
        status, headers, _ = await read_response_head_only(reader)
        assert status == b"HTTP/1.1 200 OK" and headers[b"content-length"] == b"0"
        writer.write(b"POST / HTTP/1.1\r\nhost: h\r\nconnection: close\r\ncontent-length: 1\r\n\r\nz")
        status, headers, body = await read_response(reader)
        assert headers[b"connection"] == b"close" and body == b"z"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after the answer
        writer.close()


async def read_response_head_only(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head[:-4].split(b"\r\n")
    return status, {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}, b""


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"NOT HTTP AT ALL\r\n\r\n", b"400"),
    (b"GET / HTTP/1.1\r\nhost: h\r\nx-big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n\r\n", b"431"),
])
async def test_malformed_requests_are_refused_and_closed(request_bytes: bytes, status: bytes) -> None:
    async with serving(echo_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 " + status)
        assert b"connection: close" in answer
        writer.close()


def refusal_body(body: bytes, code: int = -32600) -> str:
    """The message of a JSON-RPC error without an id, as the refusals carry (else fails)."""
    message = orjson.loads(body)
    assert message["jsonrpc"] == "2.0" and "id" not in message and message["error"]["code"] == code
    assert isinstance(message["error"]["message"], str) and message["error"]["message"]
    return message["error"]["message"]


async def test_a_refusal_is_a_json_rpc_error() -> None:
    # The MCP endpoint answers everything with a JSON-RPC error (README "Errors the gateway
    # makes"), these included: they were text/plain.
    async with serving(echo_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: x\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert status == b"HTTP/1.1 400 Bad Request" and headers[b"content-type"] == b"application/json"
        assert "Content-Length" in refusal_body(body)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


@pytest.mark.parametrize("broken", [
    b"POST /2 HTTP/1.1\r\nhost: h\r\ncontent-length: x\r\n\r\n",  # a head that cannot be read
    b"garbage\r\n\r\n",  # no request line
    b"POST /2 HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",  # a body that cannot be
])
async def test_the_requests_before_a_malformed_one_are_answered_first(broken: bytes) -> None:
    # A Content-Length shorter than the body sent leaves the rest to be read as the next
    # message: the connection was closed at once, and the request it framed never answered.
    async with serving(echo_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /1 HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\nok" + broken)
        status, _, body = await read_response(reader)
        assert (status, body) == (b"HTTP/1.1 200 OK", b"ok")
        status, headers, body = await read_response(reader)
        assert status == b"HTTP/1.1 400 Bad Request" and headers[b"connection"] == b"close"
        refusal_body(body)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_a_request_whose_body_cannot_be_read_is_refused_and_its_app_hears_it_gone() -> None:
    heard: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                heard.append("gone")
                return
            if not message.get("more_body"):
                break
        heard.append("body")  # never: the body cannot be read whole

    async with serving(app) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n")
        await asyncio.sleep(0.05)  # the application is reading the body
        writer.write(b"zz\r\n")
        status, _, body = await read_response(reader)
        assert status == b"HTTP/1.1 400 Bad Request"  # was: closed without an answer
        assert "chunk size" in refusal_body(body)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.sleep(0.05)
        assert heard == ["gone"]
        writer.close()


async def test_an_upgrade_is_answered_as_http_1_1_and_the_connection_closed() -> None:
    async with serving(echo_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: h\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert status == b"HTTP/1.1 200 OK" and headers[b"connection"] == b"close"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_an_application_error_is_a_500_and_a_late_one_cuts_the_connection() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/late":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
            await send({"type": "http.response.body", "body": b"12345", "more_body": True})
        raise ValueError("boom")

    async with serving(app) as (port, _):
        for path, expect in ((b"/early", b"HTTP/1.1 500"), (b"/late", b"HTTP/1.1 200")):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET " + path + b" HTTP/1.1\r\nhost: h\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)  # ends: the connection is closed
            assert answer.startswith(expect)
            writer.close()


async def test_the_app_hears_the_client_leave() -> None:
    heard: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the (empty) body
        heard.set_result(await receive())  # then nothing until the client is gone

    async with serving(app) as (port, _):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        assert not heard.done()
        writer.close()
        assert await asyncio.wait_for(heard, 5) == {"type": "http.disconnect"}


async def test_idle_connections_are_swept_and_shutdown_closes_them() -> None:
    async with serving(echo_app(), timeout_keep_alive=1) as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        await read_response(reader)
        # Idle: closed by the sweep within keep-alive + one sweep period.
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # A connection that never sends a request expires the same way.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        await read_response(reader)
        assert len(server.server_state.connections) == 1
        for connection in list(server.server_state.connections):
            connection.shutdown()  # what uvicorn's graceful shutdown does
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_header_injection_from_the_app_is_refused() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"x-bad", b"a\r\nset-cookie: evil=1")]})

    async with serving(app) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 500") and b"evil" not in answer
        writer.close()


async def test_a_large_answer_reaches_a_slow_reader_whole_while_others_are_answered() -> None:
    """Writes leave through the loop's WriteBatch: a big streamed answer goes out as it grows
    (write_batch.FLUSH_BYTES) under the transport's back-pressure, and a slow reader of it
    delays nobody else's answers."""
    piece = bytes(range(256)) * 256  # 64 KiB
    pieces = 128  # 8 MiB: far beyond the socket buffers, so the transport must pause

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        if scope["path"] == "/big":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(len(piece) * pieces).encode())]})
            for _ in range(pieces):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

    async with serving(app) as (port, _):
        big_reader, big_writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
        big_writer.write(b"GET /big HTTP/1.1\r\nhost: h\r\n\r\n")
        await big_writer.drain()
        await asyncio.sleep(0.2)  # not reading: the server's buffers fill and it pauses
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            writer.write(b"GET /small HTTP/1.1\r\nhost: h\r\n\r\n")
            status, _, body = await read_response(reader)
            assert (status, body) == (b"HTTP/1.1 200 OK", b"ok")
        status, headers, body = await asyncio.wait_for(read_response(big_reader), 30)
        assert status == b"HTTP/1.1 200 OK" and len(body) == len(piece) * pieces
        assert body == piece * pieces
        writer.close()
        big_writer.close()


async def test_the_only_answer_in_flight_leaves_at_once_and_one_of_several_waits_for_the_pass() -> None:
    """An answer is held to the end of the loop pass only when another could join its batch
    (write_batch.py): the only request being answered is written the moment it is complete,
    so its client reads it while the rest of the request's work runs."""
    clients: dict[str, socket.socket] = {}
    seen_by_client: dict[str, bytes] = {}
    busy, release = asyncio.Event(), asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        path = scope["path"]
        if path == "/busy":
            busy.set()
            await release.wait()  # in flight while /second is answered
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"done"})
        # Same callback, no yield since the last send: what has the client received?
        seen_by_client[path] = read_now(clients[path])

    def connect(port: int, path: str) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        clients[path] = sock
        sock.send(b"GET %s HTTP/1.1\r\nhost: h\r\n\r\n" % path.encode())

    async def answered(path: str) -> bytes:
        for _ in range(500):
            if path in seen_by_client:
                return seen_by_client[path]
            await asyncio.sleep(0.01)
        raise AssertionError(f"{path} was never answered")

    async with serving(app) as (port, _):
        connect(port, "/only")
        assert (await answered("/only")).endswith(b"\r\n\r\ndone")

        connect(port, "/busy")
        await asyncio.wait_for(busy.wait(), 5)
        connect(port, "/second")
        assert await answered("/second") == b"", "written before the pass ended with another answer in flight"
        received = b""
        for _ in range(500):
            received += read_now(clients["/second"])
            if received.endswith(b"done"):
                break
            await asyncio.sleep(0.01)
        assert received.startswith(b"HTTP/1.1 200 OK") and received.endswith(b"\r\n\r\ndone")
        release.set()
        assert (await answered("/busy")).endswith(b"\r\n\r\ndone")  # alone again by then
    for sock in clients.values():
        sock.close()



# -- hostile clients ----------------------------------------------------------------------------


async def closed(sock: socket.socket, limit: float = 15) -> bytes:
    """Everything the server sent until it closed the connection (fails if it never does)."""
    out = b""
    async with asyncio.timeout(limit):
        while not out.endswith(b"<EOF>"):
            out += read_now(sock)
            await asyncio.sleep(0.05)
    return out[:-5]


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def dribble(sock: socket.socket, data: bytes) -> bool:
    """Send what the server still takes; False once it has closed."""
    try:
        sock.send(data)
    except (BlockingIOError, OSError):
        return False
    return True


async def test_a_client_that_stops_sending_its_request_is_cut_off() -> None:
    """Slowloris: a head that never ends, one dribbled a byte at a time, a body that stops
    coming or comes slower than the minimum rate, CRLFs that begin no request. Each held a
    connection (and, with a body, a request task) for ever: every byte reset the idle clock."""
    bodies: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                bodies.append({"gone": True, "body": body})
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        bodies.append({"gone": False, "body": body})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async with serving(app, read_timeout_seconds=1, timeout_keep_alive=60) as (port, server):
        stalled_head = connect(port)
        stalled_head.sendall(b"POST / HTTP/1.1\r\nhost: h\r\n")
        stalled_body = connect(port)
        stalled_body.sendall(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 100\r\n\r\n{")
        dribbled_head, dribbled_body, crlfs = connect(port), connect(port), connect(port)
        dribbled_body.sendall(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 100000\r\n\r\n")
        head = b"POST / HTTP/1.1\r\nhost: h\r\nx-pad: " + b"a" * 10_000
        waiting = asyncio.gather(*(closed(s) for s in (stalled_head, stalled_body, dribbled_head, dribbled_body)))
        sent = 0
        while not waiting.done():
            sent += dribble(dribbled_head, head[sent:sent + 1])
            dribble(dribbled_body, b"x")
            dribble(crlfs, b"\r\n")
            await asyncio.sleep(0.02)
        answers = await waiting
        assert answers[0].startswith(b"HTTP/1.1 408 Request Timeout") and answers[2].startswith(b"HTTP/1.1 408")
        assert answers[1] == answers[3] == b""  # their requests had begun: the app hears them leave
        assert len(bodies) == 2 and all(b["gone"] for b in bodies)
        stalled, dribbled = sorted(len(b["body"]) for b in bodies)
        assert stalled == 1 and dribbled < 100_000
        # CRLFs before a request line are no request: the keep-alive clock runs (uvicorn's
        # 60 s here), not the read timeout, and nothing is held beyond it: the refused
        # connections are closing (`_close_lingering`), and gone once their linger ends.
        assert not read_now(crlfs).endswith(b"<EOF>")
        for connection in list(server.server_state.connections):
            assert connection.idle_since is not None or connection.closing
        await asyncio.sleep(http11._LINGER_SECONDS + 0.5)
        for connection in list(server.server_state.connections):
            assert connection.idle_since is not None
        # A client that takes its time within the limits is served.
        patient = connect(port)
        for piece in (b"POST / HTTP/1.1\r\nhost: h\r\n", b"content-length: 2\r\n\r\n", b"o", b"k"):
            patient.sendall(piece)
            await asyncio.sleep(0.3)
        patient.shutdown(socket.SHUT_WR)
        assert (await closed(patient)).startswith(b"HTTP/1.1 200 OK")
        assert bodies[-1] == {"gone": False, "body": b"ok"}
        for sock in (stalled_head, stalled_body, dribbled_head, dribbled_body, crlfs, patient):
            sock.close()


async def test_a_refusal_after_the_answers_owed_ends_in_a_close_not_a_reset() -> None:
    """RFC 9112 §9.6: a message that cannot be parsed, behind one being answered, is refused
    after that answer, and the connection stops reading meanwhile. Closed at once with the
    client's later bytes unread in the socket, the kernel answered with a reset, and the client
    lost everything, the answer it was owed included; closed in stages (the refusal, a FIN,
    what still comes read and dropped), it reads the answer, the refusal, then the end."""
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async with serving(app) as (port, _):
        sock = connect(port)
        sock.sendall(b"POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 0\r\n\r\n")
        await asyncio.sleep(0.2)  # being answered
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")  # refused, held until the answer before it
        await asyncio.sleep(0.2)
        assert dribble(sock, b"b" * 50_000)  # left unread: the connection stopped reading
        await asyncio.sleep(0.2)
        release.set()
        answer = await closed(sock)  # a reset raises ConnectionResetError here
        assert answer.startswith(b"HTTP/1.1 200 OK") and b"\r\n\r\nokHTTP/1.1 400" in answer, answer[:300]
        sock.close()


async def test_trailer_fields_are_not_merged_into_the_headers_and_are_capped() -> None:
    """RFC 9110 §6.5.1: trailer fields (after a chunked body) must not join the header section
    the policies judged. Merged, they reached the app as headers, beyond the 64 KiB cap."""
    seen: list[dict[str, Any]] = []
    async with serving(echo_app(seen)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"2\r\nok\r\n0\r\nauthorization: Bearer smuggled\r\nhost: evil\r\n\r\n")
        status, _, body = await read_response(reader)
        assert (status, body) == (b"HTTP/1.1 200 OK", b"ok")
        assert seen[0]["headers"] == {b"host": b"h", b"transfer-encoding": b"chunked"}
        writer.close()

        flood = connect(port)
        flood.sendall(b"POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n")
        field = b"x-trailer: " + b"t" * 1000 + b"\r\n"
        for _ in range(2 * MAX_HEADER_BYTES // len(field)):
            if not dribble(flood, field * 4):
                break
            await asyncio.sleep(0)
        dribble(flood, b"\r\n")
        assert b"200 OK" not in await closed(flood)
        assert all(name == b"host" or name == b"transfer-encoding" for answer in seen for name in answer["headers"])
        flood.close()


async def test_pipelining_is_read_ahead_only_so_far() -> None:
    """One read of tiny pipelined requests used to queue every one of them (each parsed request
    costs ~45x its bytes); past MAX_PIPELINED waiting the connection is closed instead."""
    release = asyncio.Event()
    started: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async with serving(app) as (port, server):
        ok = connect(port)
        ok.sendall(b"".join(b"GET /%d HTTP/1.1\r\nhost: h\r\n\r\n" % i for i in range(MAX_PIPELINED + 1)))
        flood = connect(port)
        flood.sendall(b"".join(b"GET /%d HTTP/1.1\r\nhost: h\r\n\r\n" % i for i in range(10 * MAX_PIPELINED)))
        assert await closed(flood) == b""
        await asyncio.sleep(0.1)
        assert [len(c.waiting) for c in server.server_state.connections] == [MAX_PIPELINED]
        release.set()
        answers = b""
        async with asyncio.timeout(10):
            while answers.count(b"HTTP/1.1 200 OK") < MAX_PIPELINED + 1:
                answers += read_now(ok)
                await asyncio.sleep(0.02)
        assert not answers.endswith(b"<EOF>")
        ok.close()
        flood.close()


async def test_a_pipelined_head_after_a_large_body_is_not_mistaken_for_a_large_head() -> None:
    """The chunk a head begins in may end a previous request's large body: counted whole
    against the head's 64 KiB, it got a legitimate pipelined request a 431 and the connection
    closed under the first one."""
    async with serving(echo_app()) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        big = b"b" * (MAX_HEADER_BYTES + 4096)
        writer.write(b"POST /1 HTTP/1.1\r\nhost: h\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big)
                     + b"POST /2 HTTP/1.1\r\nhost: h\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"content-length: 2\r\n\r\nok")
        assert (await read_response(reader))[::2] == (b"HTTP/1.1 200 OK", big)
        assert (await read_response(reader))[::2] == (b"HTTP/1.1 200 OK", b"ok")
        writer.close()


async def test_the_gateway_cuts_off_a_client_that_never_finishes_its_request() -> None:
    """The same against the whole gateway on its production uvicorn configuration: a POST to
    /mcp whose head or body stops held its connection, and the request task waiting in the
    endpoint's body read, until a shutdown had to cancel it."""
    options = {"http": functools.partial(Http11Protocol, read_timeout_seconds=1), "timeout_keep_alive": 60}
    async with running_gateway({}, discover=False, uvicorn_options=options) as gw:
        head = connect(gw.port)
        head.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n")
        body = connect(gw.port)
        body.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{")
        answers = await asyncio.gather(closed(head), closed(body))
        # The unfinished head is answered 408; the unfinished body's request hears its client
        # leave (its own answer, if any, is the endpoint's business).
        assert answers[0].startswith(b"HTTP/1.1 408") and answers[1] == b""
        head.close()
        body.close()


async def test_a_body_answered_before_it_was_read_is_dropped_and_the_connection_carries_on() -> None:
    """An app that answers without reading the body (a 413 decided from Content-Length): the
    rest of the body is dropped as it arrives, not buffered until reading pauses for good, and
    the next request on the connection is served."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        status = 413 if scope["path"] == "/big" else 200
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async with serving(app, read_timeout_seconds=5) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        size = 4 * 1024 * 1024
        writer.write(b"POST /big HTTP/1.1\r\nhost: h\r\ncontent-length: %d\r\n\r\n" % size)
        assert (await read_response(reader))[0] == b"HTTP/1.1 413 Request Entity Too Large"
        writer.write(b"x" * size + b"GET /next HTTP/1.1\r\nhost: h\r\n\r\n")
        assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
        writer.close()


async def test_the_access_log_cannot_be_forged_through_the_path() -> None:
    """The path reaches the app percent-decoded; logged so, a `%0D%0A` in it wrote a line of the
    client's choosing into the access log (log forging). Logged quoted, as uvicorn does."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("uvicorn.access")
    handler = Collect()
    async with serving(echo_app(), access_log=True) as (port, _):
        logger.addHandler(handler)
        level, logger.level = logger.level, logging.INFO
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /x%0D%0A10.0.0.1:1%20-%20%22GET%20/admin%20HTTP/1.1%22%20200 HTTP/1.1\r\nhost: h\r\n\r\n")
            assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
            writer.close()
        finally:
            logger.removeHandler(handler)
            logger.level = level
    assert len(lines) == 1 and "\r" not in lines[0] and "\n" not in lines[0]
    assert "/x%0D%0A10.0.0.1" in lines[0]
