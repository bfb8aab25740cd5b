"""The gateway's HTTP/1.1 protocol for uvicorn (`uvicorn.Config(http=Http11Protocol)`).

uvicorn stays the server: sockets, the lifespan, signals, graceful shutdown and its
`ServerState`. This class replaces only its per-connection protocol, which measured as the
largest single cost of a cached answer (uvicorn's `HttpToolsProtocol`, before any application
code; figures, back to back against it: bench/README.md "Profile"). The same parser
(httptools/llhttp), the same ASGI 3 contract; what is left out is what the gateway does not
use (WebSocket upgrades, the `--limit-concurrency` switch, proxy headers). What it does
differently, and why:

- One write per answer when the body comes with it: the head is held until the first body
  chunk (or the end of the response), instead of a `send()` of its own. Writes go through
  the loop's `WriteBatch` (write_batch.py): sent when the loop pass ends, together with the
  other connections' answers of that pass, so one wake-up of the client serves them all.
- A long-lived response body can be handed over to the application
  (`scope["extensions"]["mcp_gateway.direct_stream"]`, direct_stream.py): after
  `http.response.start` the application takes the body and writes chunks to the transport
  itself, and its call returns. Listen streams use it: a fan-out is one write per stream in
  the pass that received the notification, and an idle stream holds no task (`_DirectStream`).
- Keep-alive without a timer per response: an idle connection notes when it became idle, and
  one sweep per second closes those idle longer than `timeout_keep_alive`. A connection that
  never sends a request counts as idle from the start (uvicorn's stays open). The same sweep
  closes a connection whose client began a request and stopped sending it (a head not complete
  within READ_TIMEOUT_SECONDS, a body slower than a minimum rate: slowloris), which uvicorn's
  protocol leaves open for ever. Trailer fields are dropped, never merged into the headers
  (RFC 9110 §6.5.1), and at most MAX_PIPELINED requests are read ahead.
- No event, flow-control object or request-cycle object per request beyond one small slotted
  `_Exchange`; one task per request, as uvicorn, running the application itself (its outcome
  handled by a done-callback, not a wrapper coroutine); `Date` rendered once a second.

What it keeps: pipelined requests answered in order (reading pauses while one waits);
request bodies delivered as they arrive, reading paused above 64 KiB unread; write
back-pressure (`pause_writing` → `send` waits); `Expect: 100-continue`; HEAD; chunked
responses when the application sets no Content-Length (SSE); 400 for a malformed request,
431 for more than 64 KiB of header fields, 500 when the application fails before answering
(or sends a header with CR/LF in it), each with a JSON-RPC error body and, for a malformed
request, after the answers to the requests read before it on the connection; an `Upgrade` answered as plain HTTP/1.1, then closed;
`http.disconnect` once the client is gone or the response is complete; uvicorn's graceful
shutdown (`shutdown()`, `ServerState.connections` and `.tasks`), `Date` header and access log.
"""

from __future__ import annotations

import asyncio
import functools
import http
import logging
import weakref
from typing import Any
from urllib.parse import quote, unquote

import httptools
import orjson

from gateway import direct_stream, write_batch

log = logging.getLogger("uvicorn.error")
access_log = logging.getLogger("uvicorn.access")

MAX_HEADER_BYTES = 64 * 1024
# Slow clients (slowloris): a request's head must be complete this long after its first byte,
# and its body must keep coming: the deadline is pushed back by one second per
# `_MIN_BODY_RATE` bytes that arrive (Apache's mod_reqtimeout `MinRate`), and restarts in full
# whenever reading resumes after this side paused it. Past it the connection is closed, with a
# 408 when no request is being answered (RFC 9110 §15.5.9; RFC 9112 §9.6 lets a server close).
READ_TIMEOUT_SECONDS = 30.0
_MIN_BODY_RATE = 500
# After a refusal the client may still be sending (the rest of a body, a head that never ends).
# Closed at once, its next bytes draw a TCP reset, and a reset can destroy the refusal before
# the client reads it. So the connection is closed in stages, RFC 9112 §9.6 "Tear-down": the
# answer and a FIN are sent, what still comes is read and dropped, and the connection is closed
# when the client closes its side or after this long, whichever is first.
_LINGER_SECONDS = 2.0
# Requests read ahead while one is answered (pipelining). A parsed request costs far more
# memory than its bytes (~45x for a bare GET), and the parser cannot stop in the middle of a
# read, so one read of tiny requests could otherwise queue thousands of them.
MAX_PIPELINED = 64
# Unread request body above which the socket stops being read until the application reads.
_BODY_HIGH_WATER = 64 * 1024
_SWEEP_SECONDS = 1.0
_STATUS_LINES = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode() for status in http.HTTPStatus
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT = {"type": "http.disconnect"}


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode()


def _refusal(status: int, text: str) -> bytes:
    # A JSON-RPC error like every other answer of the MCP endpoint (README "Errors the gateway
    # makes"), without an id: none could be read. -32600 for a request that cannot be read, as
    # the gateway's own 413 and 431; -32603 when the application failed before answering.
    body = orjson.dumps({"jsonrpc": "2.0", "error": {"code": -32603 if status >= 500 else -32600, "message": text}})
    return b"".join((_status_line(status), b"content-type: application/json\r\nconnection: close\r\n"
                     b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body))


class _Exchange:
    """One request and its response on a connection."""

    __slots__ = ("scope", "body", "body_done", "expect_continue", "keep_alive", "waiter", "started", "complete",
                 "gone", "head", "chunked", "remaining", "head_only", "protocol", "direct")

    def __init__(self, scope: dict[str, Any], keep_alive: bool, expect_continue: bool,
                 protocol: Http11Protocol) -> None:
        self.scope: dict[str, Any] | None = scope
        self.body = bytearray()
        self.body_done = False
        self.expect_continue = expect_continue
        self.keep_alive = keep_alive
        self.waiter: asyncio.Future[None] | None = None
        self.started = False
        self.complete = False
        self.gone = False
        self.head: bytes | None = None  # held until the first body chunk
        self.chunked = False
        self.remaining: int | None = None  # Content-Length still to send
        self.head_only = scope["method"] == "HEAD"
        self.protocol = protocol
        self.direct: _DirectStream | None = None  # the body, once the application took it over

    def take_over(self) -> _DirectStream | None:
        """direct_stream.Handover: the response body, written straight to the connection from
        now on; the application's call may return without completing the response."""
        return self.protocol._take_over(self)

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _ChunkFraming:
    """One event's chunked framing, shared by every stream it is spliced for: the chunk head
    (size line) and the event's bytes before the splice, per length of what is spliced in, and
    the bytes after it with the chunk's end."""

    __slots__ = ("before", "heads", "tail")

    def __init__(self, before: bytes, after: bytes) -> None:
        self.before = before
        self.heads: dict[int, bytes] = {}
        self.tail = after + b"\r\n"

    def head(self, middle_length: int) -> bytes:
        head = self.heads[middle_length] = (b"%x\r\n" % (len(self.before) + middle_length + len(self.tail) - 2)
                                            + self.before)
        return head


class _DirectStream:
    """A chunked response body taken over by the application (direct_stream.DirectStream): a
    write goes to the transport at once, with no ASGI message, task or queue in between, and
    later writes of the same loop pass join it at the end of the pass
    (`WriteBatch.write_through_marked`). Used for listen streams, where one notification is thousands
    of such writes in one pass and a burst of notifications is one write per stream."""

    __slots__ = ("_protocol", "_exchange", "_transport", "_batch", "paused", "on_lost", "written_in")

    def __init__(self, protocol: Http11Protocol, exchange: _Exchange, transport: Any) -> None:
        self._protocol = protocol
        self._exchange = exchange
        self._transport = transport
        self._batch = protocol.batch
        # Kept by the protocol's pause_writing/resume_writing: the transport's buffer is over
        # its high-water mark.
        self.paused = protocol.write_paused
        self.on_lost: Any = None
        self.written_in = -1  # write_batch.MarkedWriter: the loop pass this stream last wrote in

    def write(self, data: bytes) -> None:
        if data:
            self._send(b"%x\r\n%b\r\n" % (len(data), data))

    def write_spliced(self, event: Any, middle: bytes) -> None:
        # The fan-out's hot path: one call per client per notification (bench/README.md
        # "Listen fan-out at dashboard scale"), so the common case takes few steps: the chunk
        # head and tail are made once per notification and id length (`_ChunkFraming`), and a
        # stream's chunk is two concatenations.
        framing = event.framed
        if framing is None:
            framing = event.framed = _ChunkFraming(event.before, event.after)
        head = framing.heads.get(len(middle))
        if head is None:
            head = framing.head(len(middle))
        exchange = self._exchange
        transport = self._transport
        if exchange.head is not None or exchange.complete or exchange.gone or transport.is_closing():
            self._send(head + middle + framing.tail)
            return
        self._batch.write_through_marked(self, transport, head + middle + framing.tail)

    def _send(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange.complete or exchange.gone:
            return
        head = exchange.head
        if head is not None:
            exchange.head = None
            data = head + data
        transport = self._transport
        if transport.is_closing():
            return
        self._batch.write_through_marked(self, transport, data)

    def finish(self, data: bytes = b"") -> None:
        exchange = self._exchange
        if exchange.complete or exchange.gone:
            return
        self._send((b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n")
        self.on_lost = None
        protocol = self._protocol
        protocol.direct = None
        exchange.complete = True
        protocol._finished(exchange)

    def cut(self) -> None:
        exchange = self._exchange
        if exchange.complete or exchange.gone:
            return
        self.on_lost = None
        protocol = self._protocol
        protocol.direct = None
        exchange.gone = True
        protocol._close()


class _Sweeper:
    """Closes connections idle for longer than the keep-alive timeout, once a second."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        self.loop = loop
        self.connections = connections
        self.handle: asyncio.TimerHandle | None = None

    def ensure(self) -> None:
        if self.handle is None:
            self.handle = self.loop.call_later(_SWEEP_SECONDS, self.sweep)

    def sweep(self) -> None:
        self.handle = None
        now = self.loop.time()
        for connection in list(self.connections):
            if isinstance(connection, Http11Protocol):
                connection.close_if_idle(now)
        if self.connections:
            self.ensure()


_sweepers: weakref.WeakKeyDictionary[Any, _Sweeper] = weakref.WeakKeyDictionary()


class Http11Protocol(asyncio.Protocol):
    # Slots: a connection lives as long as its client, and a listen stream's connection is most
    # of what an idle stream costs (bench/README.md "Memory per idle stream").
    __slots__ = ("_began", "_chunk_bytes", "_defaults", "_defaults_source", "_expect_continue", "_frame_bytes",
                 "_head_bytes", "_headers", "_in_head", "_lingering", "_progress", "_read_deadline", "_refused",
                 "_url",
                 "access_log", "active", "app", "app_state", "batch", "client", "closing", "direct", "drained",
                 "idle_since", "keep_alive_seconds", "loop", "parser", "parsing", "read_timeout_seconds",
                 "reading_paused", "root_path", "scheme", "server", "state", "sweeper", "transport", "waiting",
                 "write_paused")

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *,
                 read_timeout_seconds: float = READ_TIMEOUT_SECONDS) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.state = server_state
        self.app_state = app_state
        self.root_path = config.root_path
        self.keep_alive_seconds = config.timeout_keep_alive
        self.read_timeout_seconds = read_timeout_seconds
        self.access_log = access_log.hasHandlers()
        self.parser = httptools.HttpRequestParser(self)
        sweeper = _sweepers.get(server_state)
        if sweeper is None:
            sweeper = _sweepers[server_state] = _Sweeper(self.loop, server_state.connections)
        self.sweeper = sweeper
        self.batch = write_batch.for_loop(self.loop)
        self.transport: asyncio.Transport | None = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.active: _Exchange | None = None  # being answered
        self.direct: _DirectStream | None = None  # the active exchange's body, taken over
        self.parsing: _Exchange | None = None  # being read (the active one, or a pipelined one)
        # Pipelined requests, in order (at most MAX_PIPELINED: a list, smaller than a deque).
        self.waiting: list[_Exchange] = []
        self.idle_since: float | None = None
        self.closing = False
        self.reading_paused = False
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        # The refusal of a message that could not be read, held until the requests read before
        # it are answered (`_refuse`).
        self._refused: bytes | None = None
        self._lingering = False  # refused and half-closed: what still comes is dropped (`_close_lingering`)
        self._defaults_source: Any = None
        self._defaults: tuple[bytes, int] = (b"", 0)
        # Per message being parsed.
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._in_head = False
        self._head_bytes = 0  # bytes received while the head is incomplete
        self._chunk_bytes = 0  # the chunk being parsed
        self._expect_continue = False
        # When the message being read must be further along (None: no message being read).
        self._read_deadline: float | None = None
        self._began = False  # a message began in the data being parsed
        self._progress = False  # the data being parsed completed a head or carried body bytes
        self._frame_bytes = 0  # bytes past the head that carried no body (chunk framing, trailers)

    # -- connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        self.state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        self.idle_since = self.loop.time()
        self.sweeper.ensure()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self.closing = True
        direct, self.direct = self.direct, None
        if direct is not None:
            lost, direct.on_lost = direct.on_lost, None
            if lost is not None:
                try:
                    lost()
                except Exception:
                    log.exception("a direct stream's on_lost callback failed")
        for exchange in (self.active, *self.waiting):
            if exchange is not None:
                exchange.gone = True
                exchange.wake()
        self.waiting.clear()
        self._resume_writers()

    def close_if_idle(self, now: float) -> None:
        """The sweep: close a connection idle past the keep-alive timeout, or one whose
        client stopped sending the request it began (READ_TIMEOUT_SECONDS). Not while this
        side paused reading, nor while another request is answered (a pipelined head waits)."""
        if self._lingering:
            return  # closed by its own timer, or when the client closes its side
        deadline = self._read_deadline
        if deadline is not None:
            if (now >= deadline and not self.reading_paused
                    and (self.active is None or self.active is self.parsing)):
                if self.parsing is None:
                    self._refuse(408, "Request Timeout")
                else:
                    self._close()  # its request began: the application hears its client leave
        elif self.idle_since is not None and now - self.idle_since >= self.keep_alive_seconds:
            self._close()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after the current answer."""
        self.closing = True
        if self.active is None:
            self._close()
        else:
            self.active.keep_alive = False

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.batch.flush(self.transport)
            self.transport.close()

    def _close_lingering(self) -> None:
        """Close after a refusal, in stages (`_LINGER_SECONDS` says why): the refusal and a FIN
        now, the rest when the client closes its side or the linger ends. A transport that
        cannot half-close (TLS) is closed at once."""
        self.closing = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.batch.flush(transport)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._lingering = True
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()  # read (and drop) what comes, or its reset is what we avoid
        self.loop.call_later(_LINGER_SECONDS, self._close)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.direct is not None:
            self.direct.paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.direct is not None:
            self.direct.paused = False
        self._resume_writers()

    def _resume_writers(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.closing and self._refused is None:
            self.reading_paused = False
            self.transport.resume_reading()
            if self._read_deadline is not None:  # the pause was ours: the client gets its time again
                self._read_deadline = max(self._read_deadline, self.loop.time() + self.read_timeout_seconds)

    # -- parsing (httptools callbacks) ------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # refused: what still comes is dropped until the close (`_close_lingering`)
        # Not idle from here on only once a message begins (`on_message_begin`): bytes that
        # begin none (the CRLFs the parser skips before a request line) are no activity.
        self._chunk_bytes = len(data)
        self._began = self._progress = False
        try:
            self.parser.feed_data(data)
            if self._in_head:
                # The head is still incomplete after this chunk: count it against the limit
                # here, once per chunk, rather than per header field. Not the chunk it began
                # in, which may also hold earlier pipelined requests and their bodies (counted,
                # they made a legitimate head 431); at most one read goes uncounted, and
                # `on_headers_complete` measures a complete head exactly.
                if not self._began:
                    self._head_bytes += len(data)
                if self._head_bytes > MAX_HEADER_BYTES:
                    self._refuse(431, "Request header fields too large")
            elif self.parsing is not None and not self._progress:
                # Past the head, and no body byte in this chunk: chunk-size lines, chunk
                # extensions, trailer fields. The parser buffers a field until it ends and
                # reads an extension as long as it runs, so they are capped like a head.
                self._frame_bytes += len(data)
                if self._frame_bytes > MAX_HEADER_BYTES:
                    self._refuse(431, "Request trailer section or chunk framing too large")
        except httptools.HttpParserUpgrade:
            # No protocol to switch to (RFC 9110 §7.8: the server may ignore Upgrade): the
            # request is answered over HTTP/1.1, as uvicorn does, and the connection closed
            # after it, since the parser reads no further on it.
            exchange = self.active or self.parsing
            if exchange is not None:
                exchange.keep_alive = False
            else:
                self._close()
        except httptools.HttpParserError as exc:
            if self._head_bytes > MAX_HEADER_BYTES:
                self._refuse(431, "Request header fields too large")
            elif len(self.waiting) >= MAX_PIPELINED:
                self._close()  # a flood of pipelined requests (`on_headers_complete`): cut off
            else:
                self._refuse(400, f"Bad Request: {exc}")

    def _refuse(self, status: int, text: str) -> None:
        """Answer a message that cannot be read with `status`, then close: the parser reads no
        further on this connection. The requests read before it are answered first, in order
        (RFC 9112 §9.3); closing at once lost their answers (a Content-Length shorter than the
        body sent, say: the request it framed got no answer, the rest was this message)."""
        failing, self.parsing = self.parsing, None
        if failing is not None:
            # Its head was read (it has an exchange) and its body cannot be.
            if failing.started or failing.complete:
                self._close()  # answered, or being answered, without its body: nothing to add
                return
            failing.gone = True  # its application, reading the body, gets http.disconnect
            failing.wake()
            if failing is self.active:
                self.active = None  # the refusal is its answer
            else:
                self.waiting.remove(failing)  # pipelined: the refusal follows the answers before it
        if self.active is None:
            if self.transport is not None and not self.transport.is_closing():
                self.batch.write(self.transport, _refusal(status, text))
            self._close_lingering()
        else:
            self._read_deadline = None
            self._pause_reading()
            self._refused = _refusal(status, text)  # written by `_finished` after the last answer owed

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._in_head = True
        self._head_bytes = 0
        self._expect_continue = False
        self._began = True
        self._frame_bytes = 0
        self.idle_since = None
        self._read_deadline = self.loop.time() + self.read_timeout_seconds

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            # A trailer field (after a chunked body). RFC 9110 §6.5.1: not to be merged into
            # the header section, which the policies have judged already (Host, Origin,
            # Authorization, Mcp-*), and the gateway uses no trailer. Dropped, not kept:
            # nothing else would bound them (`data_received` caps their bytes).
            return
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._progress = True
        if (self._head_bytes + self._chunk_bytes > MAX_HEADER_BYTES
                and sum(len(n) + len(v) for n, v in self._headers) > MAX_HEADER_BYTES):
            # Measured exactly only when the bytes that carried it could hold that much.
            self._head_bytes = MAX_HEADER_BYTES + 1
            raise httptools.HttpParserError("request header fields too large")
        parser = self.parser
        url = httptools.parse_url(self._url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": parser.get_http_version(),
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": self.root_path,
            "path": self.root_path + path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
            "state": self.app_state.copy(),
        }
        if len(self.waiting) >= MAX_PIPELINED:
            raise httptools.HttpParserError(f"more than {MAX_PIPELINED} pipelined requests")
        exchange = _Exchange(scope, parser.should_keep_alive() and not self.closing, self._expect_continue, self)
        scope["extensions"] = {direct_stream.EXTENSION: exchange}
        self.parsing = exchange
        # The body's own time starts now (a head that took long does not shorten it).
        self._read_deadline = self.loop.time() + self.read_timeout_seconds
        if self.active is None:
            self._start(exchange)
        else:
            self.waiting.append(exchange)  # pipelined: answered after the one in flight
            self._pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is None:
            return
        self._progress = True
        self._frame_bytes = 0
        if self._read_deadline is not None:
            self._read_deadline += len(body) / _MIN_BODY_RATE
        if exchange.complete or exchange.gone:
            # Answered already (a 413 before reading, say): nobody will read the rest. Kept, it
            # would pile up until reading paused with no one to resume it; dropped, the client
            # may finish sending it (under the read deadline) and reuse the connection.
            return
        exchange.body += body
        if len(exchange.body) > _BODY_HIGH_WATER:
            self._pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        self._read_deadline = None
        exchange = self.parsing
        if exchange is not None:
            exchange.body_done = True
            exchange.wake()
        self.parsing = None

    # -- one request ----------------------------------------------------------------------

    def _start(self, exchange: _Exchange) -> None:
        self.active = exchange
        self.idle_since = None
        # The application runs as the task itself, its outcome handled by a done-callback
        # (`_ended`): a wrapper coroutine would add a frame to every resumption of the request.
        assert exchange.scope is not None
        task = self.loop.create_task(self.app(exchange.scope, self._receiver(exchange), self._sender(exchange)))
        self.state.tasks.add(task)
        task.add_done_callback(functools.partial(self._ended, exchange))

    def _ended(self, exchange: _Exchange, task: asyncio.Task[None]) -> None:
        self.state.tasks.discard(task)
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            log.error("Exception in ASGI application", exc_info=failure)
        if exchange.complete or exchange.gone or exchange.direct is not None:
            return  # a body taken over (`_take_over`) is ended by its new owner
        if exchange.started:
            if failure is None and not task.cancelled():
                log.error("ASGI callable returned without completing response.")
            self._close()
        else:
            if failure is None and not task.cancelled():
                log.error("ASGI callable returned without starting response.")
            self._answer_500(exchange)

    def _take_over(self, exchange: _Exchange) -> _DirectStream | None:
        if (exchange is not self.active or not exchange.started or exchange.complete or exchange.gone
                or not exchange.chunked or self.transport is None or self.transport.is_closing()):
            return None
        if exchange.direct is None:
            exchange.direct = self.direct = _DirectStream(self, exchange, self.transport)
            # What a long-lived stream keeps is the connection and this exchange: the request's
            # scope and header list go with the application's call (bench/README.md "Memory
            # per idle stream").
            exchange.scope = None
            self._headers = []
            self._url = b""
        return exchange.direct

    def _answer_500(self, exchange: _Exchange) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.batch.write(self.transport, _refusal(500, "Internal Server Error"))
        exchange.complete = True
        self._close()

    def _receiver(self, exchange: _Exchange) -> Any:
        async def receive() -> dict[str, Any]:
            if exchange.expect_continue and not exchange.body and not exchange.body_done:
                exchange.expect_continue = False
                if self.transport is not None and not exchange.started:
                    self.batch.write(self.transport, _CONTINUE)
                    if self.parsing is exchange:  # the client waited for this to send its body
                        self._read_deadline = self.loop.time() + self.read_timeout_seconds
            while True:
                if exchange.gone or exchange.complete:
                    return _DISCONNECT
                if exchange.body or (exchange.body_done and exchange.body is not None):
                    break
                self._resume_reading()
                exchange.waiter = self.loop.create_future()
                try:
                    await exchange.waiter
                finally:
                    exchange.waiter = None
            body = bytes(exchange.body)
            more = not exchange.body_done
            if more:
                exchange.body.clear()
                self._resume_reading()
            else:
                exchange.body = None  # type: ignore[assignment]  # delivered: later calls wait for the end
            return {"type": "http.request", "body": body, "more_body": more}

        return receive

    def _sender(self, exchange: _Exchange) -> Any:
        async def send(message: dict[str, Any]) -> None:
            if exchange.gone:
                return
            if self.write_paused:
                self.drained = self.drained or self.loop.create_future()
                await self.drained
                if exchange.gone:
                    return
            kind = message["type"]
            if not exchange.started:
                if kind != "http.response.start":
                    raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}.")
                self._head(exchange, message)
                return
            if kind != "http.response.body" or exchange.complete:
                raise RuntimeError(f"Unexpected ASGI message {kind!r} sent, after response already completed."
                                   if exchange.complete else f"Expected 'http.response.body', but got {kind!r}.")
            self._body(exchange, message.get("body", b""), message.get("more_body", False))

        return send

    def _default_headers(self) -> tuple[bytes, int]:
        """uvicorn's default headers (`Date`, and `Server` when enabled) rendered once: its
        main loop replaces the list every second, so the rendering is redone only then."""
        current = self.state.default_headers
        if current is not self._defaults_source:
            self._defaults_source = current
            self._defaults = (b"".join(b"%s: %s\r\n" % (name, value) for name, value in current), len(current))
        return self._defaults

    def _head(self, exchange: _Exchange, message: dict[str, Any]) -> None:
        status = message["status"]
        defaults, default_lines = self._default_headers()
        parts = [_status_line(status), defaults]
        lines = 2 + default_lines  # + the status line and the empty line that ends the head
        for name, value in message.get("headers", ()):
            lower = name.lower()
            if lower == b"content-length":
                exchange.remaining = int(value)
            elif lower == b"transfer-encoding":
                continue  # framing is this protocol's business
            elif lower == b"connection" and b"close" in value.lower():
                exchange.keep_alive = False
                continue
            parts += (name, b": ", value, b"\r\n")
            lines += 1
        if exchange.remaining is None and not exchange.head_only and status >= 200 and status not in (204, 304):
            exchange.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
            lines += 1
        if not exchange.keep_alive or self.closing:
            exchange.keep_alive = False
            parts.append(b"connection: close\r\n")
            lines += 1
        parts.append(b"\r\n")
        head = b"".join(parts)
        # Every line of the head ends in CRLF, and no other CR or LF may occur: a header name
        # or value carrying one would start a header (or a response) of its own. Counted once
        # over the whole head, which is much cheaper than searching every field.
        if head.count(b"\n") != lines or head.count(b"\r") != lines:
            raise RuntimeError("Invalid HTTP header name or value.")
        exchange.head = head
        exchange.started = True
        scope = exchange.scope
        if self.access_log and scope is not None:
            client = "%s:%d" % self.client if self.client else "-"
            query = scope["query_string"].decode("latin-1")
            # The path quoted again, as uvicorn logs it: decoded, a %0D%0A in it would write a
            # line of the client's choosing into the log (CWE-117).
            access_log.info('%s - "%s %s HTTP/%s" %d', client, scope["method"],
                            quote(scope["path"]) + ("?" + query if query else ""), scope["http_version"], status)

    def _body(self, exchange: _Exchange, body: bytes, more: bool) -> None:
        out: list[bytes] = []
        if exchange.head is not None:
            out.append(exchange.head)
            exchange.head = None
        if exchange.head_only:
            pass
        elif exchange.chunked:
            if body:
                out += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more:
                out.append(b"0\r\n\r\n")
        elif body:
            assert exchange.remaining is not None
            exchange.remaining -= len(body)
            if exchange.remaining < 0:
                raise RuntimeError("Response content longer than Content-Length")
            out.append(body)
        if out and self.transport is not None:
            data = out[0] if len(out) == 1 else b"".join(out)
            if len(self.state.tasks) == 1:
                # The only request being answered: no other answer can share the client's
                # wakeup, so the bytes leave now and the rest of the pass (the request's own
                # bookkeeping) runs while the client reads them.
                self.batch.write_now(self.transport, data)
            else:
                self.batch.write(self.transport, data)
        if more:
            return
        exchange.complete = True
        exchange.wake()  # a receive() waiting for the end returns http.disconnect
        if not exchange.head_only and exchange.remaining not in (None, 0):
            log.error("Response content shorter than Content-Length")
            exchange.keep_alive = False
        self._finished(exchange)

    def _finished(self, exchange: _Exchange) -> None:
        self.state.total_requests += 1
        self.active = None
        if not exchange.keep_alive or self.closing:
            self._close()
            return
        if self.waiting:
            self._start(self.waiting.pop(0))
            if not self.waiting:
                self._resume_reading()
            return
        if self._refused is not None:  # the message after this one could not be read (`_refuse`)
            if self.transport is not None and not self.transport.is_closing():
                self.batch.write(self.transport, self._refused)
            self._close_lingering()
            return
        self.idle_since = self.loop.time()
        self._resume_reading()


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None
