"""Legacy Streamable HTTP (2025-03-26 … 2025-11-25) as a client, for one session (digest §h.2).

Every message is a POST carrying `MCP-Session-Id` (once the backend minted one) and
`MCP-Protocol-Version: <negotiated>`; a request is answered with JSON or with an SSE stream
that may carry notifications and backend requests before the response. A stream that ends
before its response is resumed with GET + `Last-Event-ID`, honouring `retry:` (L-TR
§Resumability), so that the modern client never notices. The optional GET stream carries
messages unrelated to any request.

Every request goes over the client of modern pass-through calls (`gateway/backends/http1.py`):
a warm call is one POST on a kept-alive connection. The GET stream, which lives long, has a
pool of its own so that it never holds a slot a POST needs. A POST stream is read to its end
after the response (the backend SHOULD close it then), so that its connection goes back to
the pool instead of being torn down. Lower-layer failures become gateway errors in
`backends/errors.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.backends.errors import UpstreamConnectionError, UpstreamError, describe, never_sent, upstream_errors
from gateway.backends.health import EndpointHealth
from gateway.backends.exchange import Exchange
from gateway.backends.legacy.session import LegacySession, Message, NotificationSink, SessionExpired
from gateway.backends.http1 import Http1Client, UpstreamResponse
from gateway.observability.tracing import add_outgoing_headers
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse

log = logging.getLogger("gateway.backends.legacy.http")

_ACCEPT = "application/json, text/event-stream"
# The header only exists from 2025-06-18 on (0326-TR); older sessions get none.
_VERSIONED = frozenset({"2025-06-18", "2025-11-25"})
_MAX_RESUMES = 3
# After its response, how long a POST stream may take to end before its connection is closed
# rather than reused (L-TR: the server SHOULD end the stream after the response).
_STREAM_END_SECONDS = 1.0
# Reconnecting (L-TR §Resumability): the server's `retry:` is honoured up to this bound, so a
# huge value cannot mean "never again"; backoff starts at the first delay and doubles up to
# the bound until a GET stream stays open for the stable period (one that ends at once is
# not retried every 100 ms forever).
_MAX_RECONNECT_SECONDS = 30.0
_FIRST_RECONNECT_SECONDS = 0.1
_STABLE_STREAM_SECONDS = 10.0


def bounded_retry(retry_ms: int | None) -> float:
    """The server's `retry:` in seconds, capped at _MAX_RECONNECT_SECONDS (0 when unset)."""
    return min((retry_ms or 0) / 1000, _MAX_RECONNECT_SECONDS)


class ReconnectBackoff:
    """Delays between GET-stream connections."""

    def __init__(self) -> None:
        self._delay = _FIRST_RECONNECT_SECONDS

    def _next(self, floor: float = 0.0) -> float:
        delay = min(max(self._delay, floor), _MAX_RECONNECT_SECONDS)
        self._delay = min(self._delay * 2, _MAX_RECONNECT_SECONDS)
        return delay

    def failed(self) -> float:
        """The wait after a connection attempt that failed."""
        return self._next()

    def ended(self, lasted: float, retry_ms: int | None) -> float:
        """The wait after a stream that was open for `lasted` seconds ended."""
        if lasted >= _STABLE_STREAM_SECONDS:
            self._delay = _FIRST_RECONNECT_SECONDS
        return self._next(bounded_retry(retry_ms))


class NoListenStream(Exception):
    """The backend offers no GET stream (405)."""


def _resume_failure(exc: Exception) -> str:
    """Why a resuming GET failed, in words: the client's error must say what failed, and
    str() of these is a bare session id (SessionExpired) or empty (NoListenStream)."""
    if isinstance(exc, SessionExpired):
        return "the backend no longer knows the session (HTTP 404)"
    if isinstance(exc, NoListenStream):
        return "the backend offers no GET stream to resume it on"
    return exc.message if isinstance(exc, rpc.McpError) else str(exc)


class HttpSession(LegacySession):
    def __init__(self, backend: str, capabilities: dict[str, Any], on_notification: NotificationSink, *,
                 client: Http1Client, url: str, headers: dict[str, str], timeout: float,
                 connect_timeout: float, posts: Http1Client | None = None) -> None:
        """`client` carries the GET stream and DELETE; `posts`, when given, every POST
        (otherwise `client` does)."""
        super().__init__(backend, capabilities, on_notification)
        self.client = client
        self.posts = posts if posts is not None else client
        self.url = url
        self.static_headers = headers
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.session_id: str | None = None
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._listening: UpstreamResponse | None = None  # the GET stream `listen_stream` holds
        # Of a backend with several endpoints: the one this session was created on (`url` is
        # its), which hears how each of the session's requests went. The session stays on it
        # and moves (is renewed on another, pool.py) only when it cannot be reached.
        self.endpoint: EndpointHealth | None = None
        # The address connected to instead of the URL's host (an endpoint from a DNS answer).
        self.address: str | None = None
        # Told once when the session ends (the backend counts the sessions on each endpoint).
        self.on_terminate: Callable[[HttpSession], None] | None = None
        # Asked for another endpoint when the initialize cannot reach this one (a session not
        # yet made can go anywhere): it re-targets the session and says whether it did.
        self.replace_endpoint: Callable[[HttpSession], bool] | None = None

    @property
    def keeps_state(self) -> bool:
        # L-TR §Session Management: no MCP-Session-Id means every request stands alone, so a
        # resources/subscribe is forgotten at once and a GET stream belongs to nobody.
        return self.session_id is not None

    def _headers(self, *, initialize: bool = False) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": _ACCEPT, **self.static_headers}
        if not initialize:
            if self.session_id is not None:
                headers["mcp-session-id"] = self.session_id
            if self.version in _VERSIONED:
                headers["mcp-protocol-version"] = self.version
        add_outgoing_headers(headers)  # the gateway's CLIENT span, X-Request-Id
        return headers

    async def _post(self, message: Message, *, initialize: bool = False) -> UpstreamResponse:
        endpoint = self.endpoint
        try:
            response = await self.posts.post(self.url, orjson.dumps(message), self._headers(initialize=initialize),
                                              read_timeout=self.timeout, address=self.address)
        except rpc.McpError as exc:
            if endpoint is not None:
                self._endpoint_failed(endpoint, exc, moves=not initialize and "id" in message and "method" in message)
            raise
        if endpoint is not None:
            if response.status >= 500:
                endpoint.failed(f"HTTP {response.status}")
            else:
                endpoint.succeeded()
        if response.status == 404 and self.session_id is not None and not initialize:
            response.close()
            raise SessionExpired(self.session_id)
        return response

    def _endpoint_failed(self, endpoint: EndpointHealth, exc: rpc.McpError, *, moves: bool) -> None:
        """A request to this session's endpoint failed. One that provably never reached it
        (no connection) moves the session: SessionExpired makes the pool renew it, on another
        endpoint since this one now has a failure, and replay the request there, as after a 404
        (which likewise says the request was not processed)."""
        if exc.code in (rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT):
            endpoint.failed(exc.message)
        if moves and never_sent(exc):
            log.info("backend %s: endpoint %s cannot be reached: its session moves to another", self.backend,
                     endpoint.label)
            raise SessionExpired(self.session_id or "") from None

    # -- LegacySession transport ------------------------------------------------------------

    async def _initialize(self, message: Message) -> Message:
        while True:
            try:
                response = await self._post(message, initialize=True)
                break
            except rpc.McpError as exc:
                # Each endpoint it cannot reach has a failure by now, so the next choice avoids it.
                if not never_sent(exc) or self.replace_endpoint is None or not self.replace_endpoint(self):
                    raise
        session_id = response.headers.get("mcp-session-id")
        if session_id:
            self.session_id = session_id
        holder = Exchange(message["id"], "initialize")
        self._exchanges[holder.backend_id] = holder
        await self._consume(response, holder, resume=False)
        return await holder.next(self.timeout)

    async def _send_request(self, exchange: Exchange, message: Message) -> None:
        response = await self._post(message)
        if response.content_type == "text/event-stream":
            task = asyncio.ensure_future(self._read_stream(response, exchange))
            self._readers[exchange.backend_id] = task
            task.add_done_callback(lambda _t, bid=exchange.backend_id: self._readers.pop(bid, None))
            return
        await self._consume(response, exchange, resume=False)

    async def _send(self, message: Message) -> None:
        response = await self._post(message)
        with upstream_errors(self.backend, timeout=self.timeout):
            body = await response.read()  # usually 202 and empty: the connection goes back to the pool
        if response.status >= 500:
            # A 5xx is the backend being unavailable (README "Errors the gateway makes": -31001),
            # as `_consume` says for a request; it used to read as an invalid answer (-31003).
            raise rpc.backend_unavailable(
                self.backend, f"HTTP {response.status} for {message.get('method') or 'a response'}: {body[:200]!r}")
        if response.status >= 400:
            raise rpc.backend_refused(self.backend, response.status, body,
                                      what=message.get("method") or "a response")

    def mark_expired(self) -> None:
        self.session_id = None

    async def _abandon(self, exchange: Exchange) -> None:
        task = self._readers.pop(exchange.backend_id, None)
        if task is not None:
            task.cancel()

    async def _terminate(self) -> None:
        if self.on_terminate is not None:
            on_terminate, self.on_terminate = self.on_terminate, None
            on_terminate(self)
        for task in list(self._readers.values()):
            task.cancel()
        if self._listening is not None:
            # The backend only MAY end the streams of a session it expired (L-TR §Sending Messages
            # 6); held on, an open one kept the listen from moving to the renewed session
            # (http_backend.py `_hold_get_stream`), whose notifications were then never heard.
            self._listening.close()
        if self.session_id is None:
            return
        # L-TR: SHOULD DELETE when done; 405 (termination not allowed) is fine.
        try:
            response = await self.client.request("DELETE", self.url, self._headers(), address=self.address,
                                                 read_timeout=self.connect_timeout)
            await response.read()
        except (rpc.McpError, UpstreamError, TimeoutError) as exc:
            log.debug("backend %s: DELETE of session failed: %s", self.backend, exc)

    # -- reading ----------------------------------------------------------------------------

    async def _consume(self, response: UpstreamResponse, exchange: Exchange, *, resume: bool) -> None:
        """A POST answer: JSON (read whole), SSE (read to the response) or an HTTP error."""
        if response.content_type == "text/event-stream":
            await self._read_stream(response, exchange, resume=resume)
            return
        try:
            with upstream_errors(self.backend, timeout=self.timeout):
                body = await response.read()
        except rpc.McpError as exc:
            exchange.fail(exc)
            return
        status = response.status
        try:
            message: Any = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            message = None
        # A JSON-RPC answer, not any JSON with an "error" key (an auth proxy's {"error": "..."}).
        if isinstance(message, dict) and ("result" in message or isinstance(message.get("error"), dict)):
            self.route(message, exchange)
            if not exchange.done:  # an answer with someone else's id
                exchange.fail(rpc.backend_protocol_error(self.backend, f"HTTP {status} answered another request"))
            return
        if status >= 500:
            exchange.fail(rpc.backend_unavailable(self.backend, f"HTTP {status} for {exchange.method}"))
        elif status >= 400 and not (status in (404, 405) and exchange.method == "initialize"):
            # As for a modern backend: a 4xx without a JSON-RPC answer is the backend refusing
            # the gateway (-31001). Except a 404/405 to initialize: the URL no longer speaks
            # Streamable HTTP at all (redeployed as HTTP+SSE, say), an invalid answer (-31003)
            # after which detect.py probes the era again.
            exchange.fail(rpc.backend_refused(self.backend, status, body, what=exchange.method))
        else:
            exchange.fail(rpc.backend_protocol_error(
                self.backend, f"HTTP {status} without a JSON-RPC answer for {exchange.method}"))

    async def _read_stream(self, response: UpstreamResponse, exchange: Exchange, *, resume: bool = True) -> None:
        decoder = sse.Decoder()
        for attempt in range(_MAX_RESUMES + 1):
            finished = False  # the response arrived: let the stream end and keep the connection
            broke: str | None = None  # the connection failed (rather than the stream ending)
            try:
                with upstream_errors(self.backend, timeout=self.timeout):
                    try:
                        async for event, data in response.events(decoder):
                            if not data or event != "message":
                                continue  # priming events (id, empty data), unknown types
                            self._deliver(data, exchange)
                            if exchange.done:
                                finished = True
                                return
                    except UpstreamConnectionError as exc:
                        # Not mapped: a broken stream is resumed below when it can be.
                        broke = describe(exc)
                        log.info("backend %s: stream for %s broke: %s", self.backend, exchange.method, broke)
            except rpc.McpError as exc:
                # A timeout, or an event too large (which a resume would only resend).
                exchange.fail(exc)
                return
            finally:
                if finished:
                    self._finish_soon(response)
                else:
                    response.close()
            if exchange.done or not resume or decoder.last_event_id is None or attempt == _MAX_RESUMES:
                break
            # L-TR: the server may close the connection without ending the stream; poll with
            # GET + Last-Event-ID after the `retry` it asked for.
            await asyncio.sleep(bounded_retry(decoder.retry_ms))
            try:
                response = await self._get(decoder.last_event_id)
            except (rpc.McpError, SessionExpired, NoListenStream) as exc:
                exchange.fail(rpc.backend_unavailable(
                    self.backend, f"could not resume the stream for {exchange.method}: {_resume_failure(exc)}"))
                return
        if not exchange.done:
            if broke is not None:
                # A connection reset is the backend being unavailable (README "Errors the
                # gateway makes": -31001), as for a modern backend's broken stream; it used to
                # be reported as an invalid answer (-31003) that "ended without a response".
                exchange.fail(rpc.backend_unavailable(
                    self.backend, f"the stream for {exchange.method} broke before its response: {broke}"))
            else:
                exchange.fail(rpc.backend_protocol_error(
                    self.backend, f"the stream for {exchange.method} ended without a response"))
            self.forget(exchange)

    def _finish_soon(self, response: UpstreamResponse) -> None:
        """Let the rest of an answered stream end and keep its connection."""
        response.finish_soon(_STREAM_END_SECONDS)  # no task: its connection finishes it

    def _deliver(self, data: str, origin: Exchange | None) -> None:
        for message in self.decode(data):
            self.route(message, origin)

    async def _get(self, last_event_id: str | None = None) -> UpstreamResponse:
        headers = self._headers()
        headers["accept"] = "text/event-stream"
        headers.pop("content-type", None)
        if last_event_id is not None:
            headers["last-event-id"] = last_event_id
        try:
            response = await self.client.request("GET", self.url, headers, read_timeout=None, address=self.address)
        except rpc.McpError as exc:
            raise rpc.backend_unavailable(self.backend, f"GET stream: {exc.message}") from None
        if response.status == 404 and self.session_id is not None:
            response.close()
            raise SessionExpired(self.session_id)
        if response.status == 405 or (response.status < 300 and response.content_type != "text/event-stream"):
            response.close()
            raise NoListenStream()
        if response.status >= 300:
            response.close()
            raise rpc.backend_unavailable(self.backend, f"GET stream: HTTP {response.status}")
        return response

    async def listen_stream(self, connected: asyncio.Event) -> None:
        """Hold the GET stream open (L-TR §Listening) until cancelled, reconnecting with
        Last-Event-ID after the server's `retry` and a growing backoff (ReconnectBackoff).
        Raises NoListenStream (405) or SessionExpired (404)."""
        decoder = sse.Decoder()
        backoff = ReconnectBackoff()
        while not self.closed:
            try:
                response = await self._get(decoder.last_event_id)
            except rpc.McpError as exc:
                if self.endpoint is not None and never_sent(exc):
                    # Its endpoint cannot be reached: the listen moves with a renewed session.
                    self._endpoint_failed(self.endpoint, exc, moves=True)
                log.info("backend %s: GET stream unavailable: %s", self.backend, exc.message)
                await asyncio.sleep(backoff.failed())
                continue
            connected.set()
            opened = time.monotonic()
            self._listening = response
            try:
                with upstream_errors(self.backend, timeout=None, what="GET stream dropped"):
                    async for event, data in response.events(decoder):
                        if data and event == "message":
                            self._deliver(data, None)
            except rpc.McpError as exc:
                log.info("backend %s: %s", self.backend, exc.message)
            finally:
                self._listening = None
                response.close()
            if self.closed:
                return
            await asyncio.sleep(backoff.ended(time.monotonic() - opened, decoder.retry_ms))
