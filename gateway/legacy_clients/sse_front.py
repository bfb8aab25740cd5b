"""HTTP+SSE (the 2024-11-05 transport) for legacy clients, on top of the Streamable HTTP one.

A client opens `GET /sse`; the first event, `endpoint`, names `POST /sse/messages?session_id=…`,
where it sends every message and gets 202; everything the gateway says — responses,
notifications, its own requests — comes back as `message` events on that one GET stream
(2024-11-05 basic/transports §HTTP with SSE).

Rather than a second legacy server, this module drives the Streamable HTTP one (`server.py`)
exactly as a Streamable HTTP client would, and moves what it answers onto the stream: each
POSTed message becomes an internal POST to `LegacyClients.handle` whose answer (JSON, or the
events of its SSE response) is re-emitted on the stream, and after `initialize` an internal
GET holds the session's notification stream open into the same place. Sessions, MRTR, logs,
subscriptions and cancellation are therefore the ones docs/legacy-clients.md describes.

The connection is the session: when the client's GET ends, the gateway session ends with it.
A POST must come from the principal that opened the stream (else 404, as for an unknown id).

Replicas: the stream is one connection to one replica, and only that replica can write the
answers. When sessions are shared by the fleet (fleet.py), the endpoint's `session_id` is
sealed and names that replica, so a POST that a balancer sends elsewhere is forwarded there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import orjson

from gateway import asgi
from gateway.legacy_clients.fleet import FORWARDED_HEADER
from gateway.legacy_clients.sealed import SSE_STREAM, principal_binding
from gateway.legacy_clients.sessions import is_authenticated, per_principal_share, principal_key
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse
from gateway.protocol.principal import principal_of

if TYPE_CHECKING:
    from gateway.legacy_clients.server import LegacyClients

log = logging.getLogger("gateway.legacy_clients.sse")

_EVENT_STREAM = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store"),
                 (b"x-accel-buffering", b"no")]
_INTERNAL_ACCEPT = (b"accept", b"application/json, text/event-stream")
# Messages queued for a client that reads nothing; past this the connection is cut. And a
# write the client's socket does not take within this long cuts it too (a stalled reader
# would otherwise hold the stream, and its session, for ever).
_QUEUE_LIMIT = 1000
_STALLED_WRITE_SECONDS = 60.0


class _Connection:
    """One client's GET stream: the queue of what to write on it, and its gateway session."""

    def __init__(self, connection_id: str, principal: str, scope: asgi.Scope) -> None:
        self.id = connection_id
        self.principal_key = principal
        self.auth = principal_of(scope)
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue(_QUEUE_LIMIT)
        self.closed = asyncio.Event()
        self.session_id: str | None = None  # the gateway session, once initialize succeeded
        self.tasks: set[asyncio.Task[Any]] = set()
        self.write_deadline: asyncio.Timeout | None = None  # of the write in progress (SseFront._pump)

    def push(self, event: bytes) -> None:
        try:
            self.outbox.put_nowait(event)
        except asyncio.QueueFull:
            log.warning("legacy SSE client %s: %d messages unread; closing its stream", self.id[:8], _QUEUE_LIMIT)
            self.close()

    def close(self) -> None:
        """End the stream: the writer stops after what it holds, and at once if the queue is
        full or it waits on a write the client's socket does not take."""
        self.closed.set()
        with contextlib.suppress(asyncio.QueueFull):
            self.outbox.put_nowait(None)
        # A full queue (or a shutdown) finds the writer waiting on a write the client does not
        # read, where neither `closed` nor the None reach it: without this the stream, its
        # session and the work of every POST to it lived on until _STALLED_WRITE_SECONDS, and
        # a shutdown waited for them.
        deadline = self.write_deadline
        if deadline is not None and not deadline.expired():
            deadline.reschedule(asyncio.get_running_loop().time())

    def spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def disconnected(self) -> asgi.Message:
        """The internal requests' `receive`: nothing until the client's stream is gone."""
        await self.closed.wait()
        return {"type": "http.disconnect"}


class _Relay:
    """The `send` of one internal request: its answer, message by message, onto the stream.
    `on_start` sees the status and headers before any of it is relayed."""

    def __init__(self, connection: _Connection,
                 on_start: Callable[[int, dict[bytes, bytes]], bool] | None = None) -> None:
        self.connection = connection
        self.on_start = on_start
        self._relaying = True
        self._decoder: sse.Decoder | None = None
        self._body = bytearray()

    async def __call__(self, message: asgi.Message) -> None:
        if message["type"] == "http.response.start":
            headers = {name.lower(): value for name, value in message.get("headers", [])}
            if self.on_start is not None:
                self._relaying = self.on_start(message["status"], headers)
            if headers.get(b"content-type", b"").startswith(b"text/event-stream"):
                self._decoder = sse.Decoder()
            return
        if not self._relaying:
            return
        chunk = message.get("body", b"")
        if self._decoder is not None:
            # The server's own events, already encoded JSON: relayed as they are.
            for event, data in self._decoder.feed(chunk):
                if event == "message" and data:  # priming events carry no data
                    self.connection.push(b"event: message\ndata: " + data.encode() + b"\n\n")
            return
        self._body += chunk
        if not message.get("more_body") and self._body:
            self.connection.push(b"event: message\ndata: " + bytes(self._body) + b"\n\n")


class SseFront:
    def __init__(self, server: LegacyClients, *, path: str, keepalive_seconds: float, max_connections: int,
                 max_body_bytes: int) -> None:
        self.server = server
        self.path = path
        self.messages_path = f"{path.rstrip('/')}/messages"
        self.keepalive_seconds = keepalive_seconds
        self.max_connections = max_connections
        # An authenticated principal's share of the streams: one principal's flood must not
        # leave every other one with a 503 (see sessions.MAX_SESSIONS_PER_PRINCIPAL).
        self.max_per_principal = per_principal_share(max_connections)
        self.max_body_bytes = max_body_bytes
        self._connections: dict[str, _Connection] = {}
        self._held: Counter[str] = Counter()  # open streams per authenticated principal

    def close_all(self) -> None:
        """Server shutdown: end every stream now (their sessions end with them), so that the
        graceful drain is not held by connections that never finish on their own."""
        for connection in self._connections.values():
            connection.close()

    # -- GET: the stream ------------------------------------------------------------------

    async def stream(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["method"] != "GET":
            await _method_not_allowed(send, scope["method"], "GET", "open the stream with GET")
            return
        if len(self._connections) >= self.max_connections:
            await asgi.send_json(send, 503, rpc.error_message(
                None, rpc.INVALID_REQUEST, f"too many HTTP+SSE clients ({self.max_connections}, "
                                           "server.legacy_max_sessions)"))
            return
        counted = is_authenticated(scope)
        if counted and self._held[principal_key(scope)] >= self.max_per_principal:
            await asgi.send_json(send, 429, rpc.error_message(
                None, rpc.GATEWAY_OVERLOADED, f"Too many HTTP+SSE streams for this caller: {self.max_per_principal} "
                "are open (a share of server.legacy_max_sessions); close one first",
                {"limit": "legacy_clients.MAX_SESSIONS_PER_PRINCIPAL", "max": self.max_per_principal}))
            return
        connection = _Connection(self._connection_id(scope), principal_key(scope), scope)
        self._connections[connection.id] = connection
        if counted:
            self._held[connection.principal_key] += 1
        log.info("legacy SSE client connected (%d live)", len(self._connections))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _EVENT_STREAM})
            endpoint = f"{self.messages_path}?session_id={connection.id}"
            await send({"type": "http.response.body", "more_body": True,
                        "body": f"event: endpoint\ndata: {endpoint}\n\n".encode()})
            await self._pump(connection, receive, send)
            await send({"type": "http.response.body", "body": b""})  # a no-op once the client is gone
        finally:
            del self._connections[connection.id]
            if counted:
                self._held[connection.principal_key] -= 1
                if self._held[connection.principal_key] <= 0:
                    del self._held[connection.principal_key]
            connection.closed.set()
            await self._end(connection)

    def _connection_id(self, scope: asgi.Scope) -> str:
        """Random; with a fleet, sealed around that and this replica's messages URL, so other
        replicas can forward this stream's POSTs here."""
        fleet = self.server.fleet
        random_id = secrets.token_urlsafe(24)
        if fleet is None or not fleet.owner_url.startswith(("http://", "https://")):
            return random_id
        owner = urlsplit(fleet.owner_url)
        here = urlunsplit((owner.scheme, owner.netloc, self.messages_path, "", ""))
        return fleet.sealer.seal(SSE_STREAM, {"c": random_id, "o": here, "p": principal_binding(principal_key(scope))})

    async def _forward(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send, connection_id: str) -> bool:
        """A POST for a stream another replica holds: relayed there, its answer relayed back.
        False when `connection_id` names no such stream of this caller."""
        fleet = self.server.fleet
        headers = asgi.header_dict(scope)
        facts = fleet.sealer.open(SSE_STREAM, connection_id) if fleet is not None else None
        if (facts is None or FORWARDED_HEADER in headers or not isinstance(facts.get("o"), str)
                or not secrets.compare_digest(str(facts.get("p")), principal_binding(principal_key(scope)))):
            return False
        body = await asgi.read_body_or_refuse(receive, send, self.max_body_bytes)
        if body is None:
            return True
        forwarded = {name: headers[name] for name in ("content-type", "authorization", "traceparent", "tracestate")
                     if name in headers}
        forwarded[FORWARDED_HEADER] = "1"
        try:
            response = await fleet.forwarder().post(f"{facts['o']}?session_id={quote(connection_id)}", body, forwarded,
                                                  read_timeout=10.0)
            answer = await response.read()
        except rpc.McpError as exc:
            log.warning("forwarding an HTTP+SSE POST to %s failed: %s", facts["o"], exc.message)
            await _unknown_session(send, self.path)  # the stream died with its replica
            return True
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(b"content-type", response.headers.get("content-type", "text/plain").encode("latin-1")),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})
        return True

    async def _pump(self, connection: _Connection, receive: asgi.Receive, send: asgi.Send) -> None:
        async def disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass  # the GET's (empty) body

        gone = asyncio.ensure_future(disconnect())
        gone.add_done_callback(lambda _task: connection.close())
        try:
            while not connection.closed.is_set():
                try:
                    chunk = await asyncio.wait_for(connection.outbox.get(), self.keepalive_seconds)
                except TimeoutError:
                    chunk = b": keepalive\n\n"
                if chunk is None:
                    return
                try:
                    async with asyncio.timeout(_STALLED_WRITE_SECONDS) as connection.write_deadline:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except TimeoutError:
                    log.warning("legacy SSE client %s: not reading; closing its stream", connection.id[:8])
                    return
                finally:
                    connection.write_deadline = None
        finally:
            gone.cancel()

    async def _end(self, connection: _Connection) -> None:
        for task in list(connection.tasks):
            task.cancel()
        if connection.session_id is not None:
            await self._end_session(connection, connection.session_id)
        log.info("legacy SSE client disconnected (%d live)", len(self._connections))

    # -- POST: the messages ---------------------------------------------------------------

    async def message(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["method"] != "POST":
            await _method_not_allowed(send, scope["method"], "POST", "POST messages here")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        connection_id = (query.get("session_id") or [""])[0]
        connection = self._connections.get(connection_id)
        if connection is None and self.server.fleet is not None and await self._forward(scope, receive, send,
                                                                                        connection_id):
            return
        if connection is None or connection.principal_key != principal_key(scope):
            # Another principal's stream is as unknown as a closed one (no existence oracle).
            await _unknown_session(send, self.path)
            return
        body = await asgi.read_body_or_refuse(receive, send, self.max_body_bytes)
        if body is None:
            return
        if connection.closed.is_set():
            # The stream ended while the body was read: its session is gone, so this POST gets
            # the 404 of a closed stream (2024-11-05 transports §HTTP with SSE: the stream is the
            # session). Accepted, it would run on a connection `_end` had already swept: an
            # `initialize` then made a session no stream would ever end.
            await _unknown_session(send, self.path)
            return
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            await asgi.send_json(send, 400, rpc.parse_error(str(exc)).to_message())
            return
        is_initialize = isinstance(message, dict) and message.get("method") == "initialize"
        # Spawned before the 202 is written (no await in between): from here on `_end`
        # finds the work in `connection.tasks` and cancels it with the stream.
        connection.spawn(self._deliver(connection, scope, body, is_initialize))
        await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"8")]})
        await send({"type": "http.response.body", "body": b"Accepted"})

    async def _deliver(self, connection: _Connection, scope: asgi.Scope, body: bytes, is_initialize: bool) -> None:
        """One message through the Streamable HTTP server, its answer onto the stream."""
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if connection.session_id is not None and not is_initialize:
            headers["mcp-session-id"] = connection.session_id
        replaced: list[str] = []

        def started(status: int, answer_headers: dict[bytes, bytes]) -> bool:
            # The session id is taken before the InitializeResult is relayed: the client's
            # next POST may arrive as soon as it has read it.
            session_id = answer_headers.get(b"mcp-session-id")
            if is_initialize and status == 200 and session_id is not None:
                if connection.session_id is not None:
                    replaced.append(connection.session_id)
                connection.session_id = session_id.decode("latin-1")
            return True

        inner = {**scope, "method": "POST", "query_string": b"", "auth": connection.auth,
                 "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
        try:
            await self.server.handle(inner, body, headers, connection.disconnected, _Relay(connection, started),
                                     old_transport=True)
        except Exception:
            log.exception("legacy SSE client %s: a message failed", connection.id[:8])
            return
        for old in replaced:  # a second initialize on one stream starts over
            await self._end_session(connection, old)
        if is_initialize and connection.session_id is not None and self.server.dispatcher.hub is not None:
            connection.spawn(self._notifications(connection, scope, connection.session_id))

    async def _notifications(self, connection: _Connection, scope: asgi.Scope, session_id: str) -> None:
        """The session's notification stream (the Streamable HTTP GET), held for the client;
        a refusal (no hub, a stream already open) relays nothing."""
        inner = {**scope, "method": "GET", "query_string": b"", "auth": connection.auth,
                 "headers": [_INTERNAL_ACCEPT, (b"mcp-session-id", session_id.encode())]}
        relay = _Relay(connection, lambda status, _headers: status == 200)
        with contextlib.suppress(asyncio.CancelledError):
            await self.server(inner, connection.disconnected, relay)

    async def _end_session(self, connection: _Connection, session_id: str) -> None:
        await self.server.end_session(session_id, connection.principal_key)


async def _unknown_session(send: asgi.Send, path: str) -> None:
    await asgi.send_json(send, 404, rpc.error_message(
        None, rpc.INVALID_REQUEST, f"Unknown session_id: open a stream with GET {path} and POST to the endpoint it names"))


async def _method_not_allowed(send: asgi.Send, method: str, allowed: str, hint: str) -> None:
    await asgi.send_json(send, 405, rpc.error_message(None, rpc.INVALID_REQUEST, f"Method Not Allowed: {method}; {hint}"),
                         [(b"allow", allowed.encode())])

