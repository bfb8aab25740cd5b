"""The one upstream HTTP client: keep-alive connections as asyncio protocols, responses
parsed by httptools (the C parser uvicorn already uses).

Every request the gateway makes to a backend goes through it: modern POSTs (the pass-through
hot path), the legacy transport's POSTs, GET streams and DELETEs, the era probe and MRTR
forwarding between replicas. Why not aiohttp or httpx: measured on the bench machine (32
concurrent POST + read loops against bench/backend.py), one aiohttp exchange cost several
times this client's CPU (`ClientSession._request` builds a ClientRequest, a payload object, a
timer context and multidicts per call), and httpcore's pool scans every connection per
request; this client writes the request as one buffer and hands back the parsed response
(figures in bench/README.md "Profile"). It speaks exactly what those callers need: any method
with or without a byte body, `Content-Length` or chunked responses, streamed bodies for
`text/event-stream`, http and https. No redirects (the gateway never follows them), no
proxies, no cookies, and no content codings: it sends `Accept-Encoding: identity` (RFC 9110
§12.5.3) and refuses a coded answer rather than misread it.

Failures are the lower layer's exceptions (`errors.py`: `ConnectError`, `ConnectTimeout`,
`TimeoutError` for a read, `UpstreamConnectionError`, `ResponseTooLarge`); `post` and
`request` map them with `upstream_errors()`, `request_raw` leaves them to a caller to whom the
phase matters (the era probe).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httptools

from gateway import write_batch
from gateway.asgi import header_names
from gateway.backends.errors import (
    UPSTREAM_FAILURES,
    ConnectError,
    ConnectTimeout,
    RequestNotRead,
    ResponseTooLarge,
    UpstreamConnectionError,
    gateway_error,
    upstream_errors,
)
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse

if TYPE_CHECKING:
    from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.http1")

# An idle pooled connection older than this is closed, not reused (_Pool says why).
KEEPALIVE_EXPIRY_SECONDS = 4.0
# The largest answer read from a backend (BackendSettings.max_response_bytes).
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
# Pools (one per origin or address) past which the empty ones are forgotten (`_prune`).
_PRUNE_AT = 32
# Stop reading the socket while this much of a streamed body waits for its consumer.
_HIGH_WATER = 256 * 1024

# The peer's close, as the kernel saw it (Linux `struct tcp_info`: its first byte is the TCP
# state; `tcpi_rtt`, the smoothed round trip in microseconds, is the u32 at offset 68).
# ESTABLISHED: nothing came from the peer. CLOSE_WAIT: its FIN came, nothing after. CLOSE after
# a FIN: a RST followed it, which the peer's kernel sends for data arriving on a socket its
# process has already closed (RFC 9293 §3.10.7.4; RFC 1122 §4.2.2.13 for data left unread at
# the close): the request reached a peer that had stopped reading.
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_ESTABLISHED, _CLOSE, _CLOSE_WAIT = 1, 7, 8
# A pooled connection idle this long is checked with the kernel before reuse (one syscall);
# one reused sooner, as under load, is not: the check only saves a wasted write, since a
# request written on a closing connection is sent again when the kernel proves it unread.
_ASK_KERNEL_AFTER = 0.05
# How long a FIN waits for a RST behind it (in round trips, within these bounds in seconds).
_RST_WAIT_RTTS, _RST_WAIT_MIN, _RST_WAIT_MAX = 4, 0.002, 0.2


def _tcp_state(sock: Any) -> int | None:
    """The connection's TCP state, or None where the kernel does not say (not Linux, closed)."""
    if _TCP_INFO is None or sock is None:
        return None
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0]
    except (OSError, ValueError, IndexError):
        return None


def _rst_wait(sock: Any) -> float:
    """Seconds to wait for a RST behind a FIN: a few round trips of this connection."""
    rtt = 0.0
    if _TCP_INFO is not None and sock is not None:
        with contextlib.suppress(OSError, ValueError, struct.error):
            rtt = struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 72), 68)[0] / 1e6
    return min(_RST_WAIT_MAX, max(_RST_WAIT_MIN, _RST_WAIT_RTTS * rtt))

# A backend's Content-Type → its media type, lower-cased (parameters dropped), per value seen.
_CONTENT_TYPES: dict[str, str] = {}


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.batch = write_batch.for_loop(loop)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.open = False
        self.response: UpstreamResponse | None = None
        # The socket, for the kernel's view of the peer's close (`_tcp_state`).
        self.sock: Any = None
        # True once an exchange has completed on it: a pooled connection, which the server
        # may close as idle at any moment (the keep-alive race, `_Pool`).
        self.reused = False
        # TLS does not keep a half-closed connection open (asyncio ignores eof_received's True).
        self.tls = False
        self._rst_timer: asyncio.TimerHandle | None = None

    def peer_closed(self) -> bool:
        """The peer's FIN (or RST) has reached the kernel and this loop has not seen it yet."""
        state = _tcp_state(self.sock)
        return state is not None and state != _ESTABLISHED

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.sock = transport.get_extra_info("socket")
        self.tls = transport.get_extra_info("sslcontext") is not None
        self.open = True

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            # Nothing was asked (idle in the pool): a server writing now is closing (a 408) or
            # broken, and a partial head left in the parser would open the next answer. Retire it.
            self.close()
            return
        response.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamConnectionError("unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectionError(f"invalid HTTP response: {exc}"))

    def eof_received(self) -> bool | None:
        response = self.response
        if response is not None and not response.answered:
            # The peer closed with no byte of an answer: whether it read the request decides
            # whether the request may be sent again (`_judge_fin`).
            self.open = False
            if self._judge_fin(final=self.tls):
                return None
            # A FIN alone so far: a RST may be on its way behind it. The connection is kept
            # half-open (reading stops) for a few round trips to see it.
            self._rst_timer = self._loop.call_later(_rst_wait(self.sock), self._judge_fin, True)
            return True
        # Returning None, the transport closes now and reports connection_lost a loop pass
        # later: not `open` from here, or the pool could hand out a connection whose writes
        # the closed transport drops without a word (`_Pool.get`).
        self.open = False
        # A body delimited by the end of the connection ends here (RFC 9112 §6.3 rule 8).
        try:
            self.parser.feed_data(b"")
        except httptools.HttpParserError:
            pass
        return None

    def _judge_fin(self, final: bool) -> bool:
        """After the peer's FIN with no answer: a RST behind it proves the request unread; a
        FIN alone may have followed the reading of it. True once judged (the response failed)."""
        self._rst_timer = None
        response = self.response
        if response is None or response.answered:
            return True
        state = _tcp_state(self.sock)
        if state == _CLOSE:
            response._fail(RequestNotRead(
                "connection closed before the response was complete: the backend closed it and reset the request "
                "that reached it after, unread"))
        elif final or state != _CLOSE_WAIT:
            response._fail(UpstreamConnectionError("connection closed before the response was complete (no answer)"))
        else:
            return False
        self.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._rst_timer is not None:
            self._rst_timer.cancel()
            self._rst_timer = None
        response = self.response
        if response is not None and not response.complete:
            if not response.answered and isinstance(exc, ConnectionResetError) and self.reused:
                # A RST with no answer on a kept-alive connection: what the peer's kernel sends
                # when its process closes the connection with the request unread in the socket
                # (RFC 1122 §4.2.2.13), as a server does that closes idle connections or stops.
                response._fail(RequestNotRead(
                    "connection closed before the response was complete: the backend reset a kept-alive connection "
                    "with the request unread"))
                return
            if exc is None and response.delimited_by_close:
                # No Content-Length and not chunked: the end of the connection is the end of
                # the body (RFC 9112 §6.3 rule 8); httptools does not report it as complete.
                response._keep_alive = False
                response._finish()
            else:
                response._fail(UpstreamConnectionError(
                    f"connection closed before the response was complete{f': {exc}' if exc else ''}"))

    def _fail(self, exc: Exception) -> None:
        if self.response is not None:
            self.response._fail(exc)
        self.close()

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    # -- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        response = self.response
        if response is not None and response.complete:
            # A second answer to one request, in the bytes after the first (the idle case is
            # `data_received`'s): detached, so it cannot touch the answered response or open
            # the next one; the connection is retired.
            self.response = None
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response._headers_done(self.parser.get_status_code(), self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response._finish()


class UpstreamResponse:
    """A response whose headers are in; the body arrives behind `read()` or the stream."""

    def __init__(self, connection: _Connection, client: Http1Client, pool: _Pool, read_timeout: float | None
                 ) -> None:
        self._connection = connection
        self._client = client
        self._pool = pool
        self.backend = client.backend
        self._read_timeout = read_timeout
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._keep_alive = False
        self._paused = False
        self._released = False
        # Set while the rest of a body is dropped on its way to the pool (`finish_soon`).
        self._draining: asyncio.TimerHandle | None = None
        self.headers_received = False
        # True once any byte of the answer has come (before that, a close may be the
        # keep-alive race: `_Connection.eof_received`).
        self.answered = False
        self.complete = False
        self.status = 0
        self.content_type = ""
        self.headers: dict[str, str] = {}

    @property
    def delimited_by_close(self) -> bool:
        """Headers are in and the body has no framing of its own: it ends with the connection."""
        if not self.headers_received or self.status in (204, 304) or 100 <= self.status < 200:
            return False
        return "content-length" not in self.headers and "chunked" not in self.headers.get(
            "transfer-encoding", "").lower()

    # -- fed by the connection ------------------------------------------------------------

    def _headers_done(self, status: int, keep_alive: bool) -> None:
        self.status = status
        self._keep_alive = keep_alive
        # The first of a repeated name wins: the lines are read last to first, so that the
        # first one is written last. Names are decoded once per name (asgi.header_names).
        self.headers = headers = {header_names[name]: value.decode("latin-1")
                                  for name, value in reversed(self._raw_headers)}
        given = headers.get("content-type", "")
        content_type = _CONTENT_TYPES.get(given)
        if content_type is None:
            content_type = given.split(";", 1)[0].strip().lower()
            if len(_CONTENT_TYPES) < 64:  # backends' values: a few, but not trusted to be
                _CONTENT_TYPES[given] = content_type
        self.content_type = content_type
        self.headers_received = True
        if headers.get("content-length", "0") != "0":
            # A body of known length follows, and its first bytes wake the caller: waking it
            # for the head as well costs a loop pass and, on a shared CPU, a switch away from
            # the backend in the middle of its answer (uvicorn writes the head at
            # http.response.start and the body in a second segment; bench/README.md). A
            # stream without a length (chunked SSE) still wakes at its head.
            return
        self._wake()

    def _feed(self, chunk: bytes) -> None:
        if self._draining is not None:
            return  # nobody reads the rest (finish_soon)
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > _HIGH_WATER and not self._paused and self._connection.transport is not None:
            self._paused = True
            self._connection.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
            self.release()
            return
        self._wake()

    def _fail(self, exc: Exception) -> None:
        if self._error is None:
            self._error = exc
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
            self.close()
            return
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Until the connection reports anything new; TimeoutError after the read timeout
        without news (a socket read timeout)."""
        if self._error is not None:
            raise self._error
        loop = self._connection._loop
        self._waiter = loop.create_future()
        # A bare timer rather than `asyncio.timeout()`: that context manager's bookkeeping was
        # a visible share of a pass-through call in the profile (bench/README.md); the timer
        # alone does the job here.
        timer = None if self._read_timeout is None else loop.call_later(self._read_timeout, self._expire)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if self._error is not None:
            raise self._error

    def _expire(self) -> None:
        self._fail(TimeoutError(f"no data from the backend for {self._read_timeout:g}s"))

    def _take(self) -> bytes:
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self._connection.transport is not None:
            self._paused = False
            self._connection.transport.resume_reading()
        return data

    # -- the consumer side ----------------------------------------------------------------

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool. Buffered bytes are taken as
        they come, so a body larger than the flow-control mark keeps the socket reading."""
        parts: list[bytes] = []
        size, limit = 0, self._client.max_response_bytes
        try:
            while True:
                if self._chunks:
                    part = self._take()
                    parts.append(part)
                    size += len(part)
                    if size > limit:
                        self._connection.close()  # the rest is not read
                        raise ResponseTooLarge(limit)
                if self.complete:
                    return parts[0] if len(parts) == 1 else b"".join(parts)
                await self._wait()
        finally:
            self.release()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, until the body ends."""
        while True:
            if self._chunks:
                yield self._take()
                continue
            if self.complete:
                return
            await self._wait()

    async def sse_messages(self) -> AsyncIterator[Any]:
        """Parsed JSON payloads of the stream's `message` events, as they arrive. Closing the
        iterator closes the connection (the backend sees the modern cancellation)."""
        try:
            async with contextlib.aclosing(sse.json_payloads(
                    self.iter_chunks(), f"backend {self.backend}", self._client.max_response_bytes)) as payloads:
                async for payload in payloads:
                    yield payload
        except sse.EventTooLarge:
            raise ResponseTooLarge(self._client.max_response_bytes, "an SSE event") from None
        finally:
            self.close()

    async def events(self, decoder: sse.Decoder) -> AsyncIterator[tuple[str, str]]:
        """(event type, data) pairs of an SSE body as they arrive; `decoder` keeps the last
        event id and `retry:` for a reader that resumes (the legacy transport). Ends at the end
        of the body; the caller releases or closes the response."""
        decoder.max_event_bytes = limit = self._client.max_response_bytes
        try:
            async for chunk in self.iter_chunks():
                for event in decoder.feed(chunk):
                    yield event
        except sse.EventTooLarge:
            raise ResponseTooLarge(limit, "an SSE event") from None

    async def finish(self, timeout: float) -> None:
        """Read what is left of the body and give the connection back to the pool, or close
        it when the body does not end within `timeout` (a stream the backend keeps open)."""
        try:
            async with asyncio.timeout(timeout):
                while not self.complete:
                    await self._wait()
                    self._take()
        except (TimeoutError, UpstreamConnectionError):
            self.close()
        except asyncio.CancelledError:
            self.close()
            raise
        else:
            self._take()
            self.release()

    def finish_soon(self, timeout: float) -> None:
        """`finish` without a task: the rest of the body is dropped as it arrives and the
        connection's own callbacks give it back to the pool when the body ends, or a timer
        closes it after `timeout`. A legacy backend's SSE answer ends just after the response
        event; a task per call only to wait for that end cost a task creation and a scheduling
        round on the legacy hot path (bench/README.md)."""
        if self._released:
            return
        self._take()
        if self.complete or self._error is not None:
            self.release() if self._error is None else self.close()
            return
        self._draining = self._connection._loop.call_later(timeout, self._drain_expired)

    def _drain_expired(self) -> None:
        self._draining = None
        self.close()

    def release(self) -> None:
        """Done with this response: a complete keep-alive exchange returns its connection to
        the pool, anything else closes it."""
        if self._released:
            return
        self._released = True
        connection = self._connection
        connection.response = None
        if (self.complete and self._keep_alive and self._error is None and connection.open
                and not self._client._closed):  # a closed client's pools are gone: close, don't pool
            connection.reused = True
            self._pool.put(connection)
        else:
            connection.close()
        self._client._slots.release()

    def close(self) -> None:
        if not self.complete:
            self._connection.close()
            # Another task may be waiting for the body (a legacy GET stream closed when its
            # session ends): it is woken with the failure, never left waiting on a connection
            # that no longer reports to this response.
            if self._error is None:
                self._error = UpstreamConnectionError("the response was closed before it was complete")
            self._wake()
        self.release()

    def __del__(self) -> None:
        # A response dropped unread (a stream never iterated) must not keep its slot.
        if not self._released:
            self.close()


class _Pool:
    """Idle keep-alive connections to one origin, most recently used first.

    A connection idle for `keepalive_expiry` seconds is closed instead of reused: servers
    close idle connections after their own keep-alive timeout (uvicorn and Node 5 s, and the
    gateway cannot know the backend's), and a request written in the instant the server's
    FIN is on its way fails with nothing received (RFC 9112 §9.3.1). That failure is retried
    for idempotent methods only; expiring a little before the usual 5 s keeps it from
    happening to the rest (httpcore's `keepalive_expiry` does the same)."""

    def __init__(self, max_idle: int, keepalive_expiry: float, clock: Callable[[], float]) -> None:
        self._idle: collections.deque[tuple[_Connection, float]] = collections.deque()
        # Dropped from the client (`Http1Client._prune`): what comes back to it is closed.
        self.retired = False
        self._max_idle = max_idle
        self._expiry = keepalive_expiry
        self._clock = clock

    def get(self) -> _Connection | None:
        if not self._idle:
            return None
        now = self._clock()
        while self._idle:
            connection, since = self._idle.pop()
            if now - since >= self._expiry:
                connection.close()
                self.close()  # the others were put back earlier still: expired too
                return None
            if connection.open:
                if now - since >= _ASK_KERNEL_AFTER and connection.peer_closed():
                    # The server closed it while idle and the loop has not read the FIN yet:
                    # a request written now would meet a closed socket (Go's Transport learns
                    # this from its read loop: errServerClosedIdle).
                    connection.close()
                    continue
                return connection
        return None

    def put(self, connection: _Connection) -> None:
        if len(self._idle) >= self._max_idle or self.retired:
            connection.close()
            return
        self._idle.append((connection, self._clock()))

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[0].close()


class _Slots:
    """The connections a client may have in use: what an `asyncio.Semaphore` does, with a free
    slot taken synchronously (`take`, most requests) instead of a coroutine, two `locked()`
    calls and their generator per request. A slot freed while callers wait is handed to the
    oldest directly (`release`), so a newcomer never overtakes them."""

    __slots__ = ("_waiters", "free")

    def __init__(self, count: int) -> None:
        self.free = count
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self) -> bool:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        """Until a slot is handed over; a caller that gives up (cancelled, timed out) passes
        on a slot handed over just as it did."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands: `free` stays
                return
        self.free += 1


class Http1Client:
    """Requests to one backend's origins over keep-alive connections (one pool per origin).

    `max_connections` bounds the connections open at once (a semaphore); idle ones are kept
    for reuse.
    """

    def __init__(self, backend: str, *, max_connections: int, connect_timeout: float,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_SECONDS,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 ssl_context: ssl.SSLContext | None = None, server_name: str | None = None) -> None:
        self.backend = backend
        self.max_response_bytes = max_response_bytes  # a whole body, or one SSE event
        self._keepalive_expiry = keepalive_expiry
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        # One slot per connection in use (held from request to release).
        self._slots = _Slots(max(max_connections, 1))
        # Per origin (scheme, host, port), or (scheme, host, port, address) for an address.
        self._pools: dict[tuple[str, ...], _Pool] = {}
        # Per URL: (origin key, request-line prefix, Host header) computed once.
        self._targets: dict[tuple[str, str], tuple[tuple[str, str, int], bytes]] = {}
        # https: the backend's context (backends/tls.py), else the system default, made once.
        self._ssl: ssl.SSLContext | None = ssl_context
        # The name checked in the certificate and sent as SNI, when not the URL's host.
        self._server_name = server_name
        self._closed = False

    def _target(self, method: str, url: str) -> tuple[tuple[str, str, int], bytes]:
        found = self._targets.get((method, url))
        if found is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            default_port = port == (443 if parts.scheme == "https" else 80)
            host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
            authority = host if default_port else f"{host}:{port}"
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            head = f"{method} {target} HTTP/1.1\r\nhost: {authority}\r\naccept-encoding: identity\r\n"
            found = ((parts.scheme, parts.hostname, port), head.encode("latin-1"))
            self._targets[method, url] = found
        return found

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *, read_timeout: float | None,
                   request_id: rpc.RequestId | None = None, address: str | None = None) -> UpstreamResponse:
        """Send the request and return once the response headers are in (and, when a body of
        known length follows, its first bytes: `_headers_done` says why). Raises McpError
        (-31001 unavailable, -31002 timeout) naming the backend. `address`: connect there
        instead of to the URL's host, which still names the Host header and the TLS server
        (an endpoint expanded from a DNS answer, backends/resolve.py)."""
        try:
            return await self.request_raw("POST", url, headers, body=body, read_timeout=read_timeout,
                                          request_id=request_id, address=address)
        except UPSTREAM_FAILURES as exc:
            # upstream_errors(), without a `with` object per call on the pass-through path.
            raise gateway_error(exc, self.backend, timeout=read_timeout, request_id=request_id) from None

    async def request(self, method: str, url: str, headers: Mapping[str, str], *, body: bytes | None = None,
                      read_timeout: float | None, request_id: rpc.RequestId | None = None,
                      address: str | None = None) -> UpstreamResponse:
        """Any method (the legacy transport also GETs its streams and DELETEs its session);
        errors and `address` as `post`'s."""
        with upstream_errors(self.backend, timeout=read_timeout, request_id=request_id):
            return await self.request_raw(method, url, headers, body=body, read_timeout=read_timeout,
                                          request_id=request_id, address=address)

    async def request_raw(self, method: str, url: str, headers: Mapping[str, str], *, body: bytes | None = None,
                          read_timeout: float | None, request_id: rpc.RequestId | None = None,
                          address: str | None = None, _fresh: bool = False) -> UpstreamResponse:
        """`request` with the lower layer's exceptions (errors.py) left to the caller, for one
        to whom the phase of a failure matters: the era probe, where no connection
        (`ConnectError`, `ConnectTimeout`) is no verdict and a silent connection (a plain
        TimeoutError) is one. The gateway's own refusals (a closed client, every connection
        in use, an unsendable request, a coded answer) are McpErrors still."""
        if self._closed:
            raise rpc.backend_unavailable(self.backend, "the client is closed", request_id)
        try:
            origin, head = self._target(method, url)
            request = _serialize(head, headers, body)
        except (ValueError, UnicodeEncodeError) as exc:
            raise rpc.backend_unavailable(self.backend, f"the request cannot be sent: {exc}", request_id) from None
        if address is not None:
            origin = (origin[0], origin[1], origin[2], address)  # type: ignore[assignment]
        pool = self._pools.get(origin)
        if pool is None:
            if len(self._pools) >= _PRUNE_AT:
                self._prune()
            pool = self._pools[origin] = _Pool(max(self._max_connections, 1), self._keepalive_expiry,
                                               asyncio.get_running_loop().time)
        if not self._slots.take():  # a free slot is taken at once: no timer, no await
            try:
                # Bounded: a pool whose every connection is held (by slow or leaked exchanges)
                # refuses new calls clearly instead of queueing them without end.
                async with asyncio.timeout(self._connect_timeout):
                    await self._slots.wait()
            except TimeoutError:
                raise rpc.gateway_overloaded(
                    f"all {self._max_connections} connections to backend {self.backend!r} are in use",
                    limit="backends[].max_connections", data={"backend": self.backend}, request_id=request_id,
                ) from None
        connection = None if _fresh else pool.get()
        if connection is None:
            try:
                connection = await self._connect(origin)
            except BaseException:
                self._slots.release()
                raise
        response = UpstreamResponse(connection, self, pool, read_timeout)
        connection.response = response
        try:
            assert connection.transport is not None
            # Held to the end of the loop pass with the pass's other requests: one wakeup of
            # the backend for all of them (write_batch.py).
            connection.batch.write(connection.transport, request)
            while not response.headers_received:
                await response._wait()
        except RequestNotRead:
            response.close()
            if not connection.reused:
                raise  # errors.gateway_error marks it never sent: another endpoint may take it
            # The keep-alive race: a pooled connection the server closed as the request was
            # written, and the kernel's RST proves the request unread. RFC 9112 §9.3.1 lets a
            # client retry a request when "the original request was never applied", whatever
            # its method (RFC 9110 §9.2.2); it is sent once more on a fresh connection (not a
            # pooled one, which may be closing too), outside the retry budget: nothing reached
            # the backend. Go resends only idempotent requests here, Chrome any request whose
            # reused connection failed before the response headers; this does what the kernel
            # proves (docs/resilience.md "The keep-alive race").
            log.debug("backend %s: a pooled connection was closed with the request unread; sending it again",
                      self.backend)
            return await self.request_raw(method, url, headers, body=body, read_timeout=read_timeout,
                                          request_id=request_id, address=address, _fresh=True)
        except BaseException:
            response.close()
            raise
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if coding != "identity":
            response.close()
            raise rpc.backend_protocol_error(
                self.backend, f"content-encoding {coding!r} although the request asked for identity", request_id)
        return response

    def _prune(self) -> None:
        """Forget the pools that hold no idle connection: addresses come and go with a DNS
        answer (a headless Service's pods), and their pools must not pile up."""
        for key, pool in list(self._pools.items()):
            if not pool._idle:
                pool.retired = True
                del self._pools[key]

    async def _connect(self, origin: tuple[str, ...]) -> _Connection:
        """A connection to the origin's host, or to its address when it has one (the 4th
        item): the certificate is checked for, and SNI names, the host either way."""
        scheme, host, port = origin[0], origin[1], origin[2]
        peer = origin[3] if len(origin) > 3 else host
        loop = asyncio.get_running_loop()
        ssl_context: ssl.SSLContext | None = None
        if scheme == "https":
            ssl_context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop), peer, port, ssl=ssl_context,
                    server_hostname=(self._server_name or host) if ssl_context is not None else None)
        except TimeoutError:
            raise ConnectTimeout(self._connect_timeout) from None
        except (OSError, ssl.SSLError) as exc:
            # SSLError is itself an OSError: tested first, or a failed handshake (an expired
            # certificate, a plain-HTTP port) would read as a refused connection.
            raise ConnectError(f"TLS to {peer}:{port} failed: {exc}" if isinstance(exc, ssl.SSLError)
                               else f"cannot connect to {peer}:{port}: {exc.strerror or exc}") from None
        return connection

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def _serialize(head: bytes, headers: Mapping[str, str], body: bytes | None) -> bytes:
    """The request as one buffer. Header values come from clients (Mcp-Param-*, trace
    context): a CR or LF in one would split the request, so it is refused. Each line ends in
    the one CR LF it is given, so the lines are joined first and a count of CRs and LFs above
    one per line finds a break anywhere (cheaper than four searches per header)."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        name = next(name for name, value in headers.items() if "\r" in f"{name}{value}" or "\n" in f"{name}{value}")
        raise ValueError(f"header {name!r} has a line break in its value")
    if body is None:  # GET, DELETE: no body, so no Content-Length (RFC 9110 §8.6)
        return head + f"{text}\r\n".encode("latin-1")
    return b"".join((head, f"{text}content-length: {len(body)}\r\n\r\n".encode("latin-1"), body))


def for_backend(settings: BackendSettings, ssl_context: ssl.SSLContext | None, *,
                max_connections: int | None = None) -> Http1Client:
    """A client for one configured backend: its limits, and its TLS (`ssl_context`, built
    once per backend by backends/tls.py, shared by all of the backend's clients)."""
    return Http1Client(settings.name, max_connections=max_connections or settings.max_connections,
                       connect_timeout=settings.connect_timeout_seconds,
                       max_response_bytes=settings.max_response_bytes, ssl_context=ssl_context,
                       server_name=settings.tls.server_name if settings.tls is not None else None)
