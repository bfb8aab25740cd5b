"""The gateway as a legacy (initialize-era) Streamable HTTP server (digest §h.9, §h.2).

`McpEndpoint` hands this class every request it `claims`: POSTs of legacy clients (an
`initialize`, or anything carrying `Mcp-Session-Id` or a legacy `MCP-Protocol-Version`), and
GET/DELETE. Legacy clients therefore never see a modern validation error, and modern requests
never pay for more than one header lookup here.

What a session adds on top of the modern, stateless core:

- `initialize` → a session (sessions.py) and the fleet's capabilities from the Dispatcher's
  merged `server/discover`; `ping` and `logging/setLevel` are answered here.
- Every other request becomes a modern call (translate.py) through the same Dispatcher. An
  `InputRequiredResult` becomes server-to-client requests on the request's SSE stream; the
  client's answers come back as POSTed responses and the modern call is retried with
  `inputResponses` / `requestState`: the mirror of the backend-side MRTR (digest §h.5).
- `resources/subscribe` and the GET stream are fed by one `subscriptions/listen` per session
  through the subscription hub.
- Streams carry event ids and can be resumed with GET + `Last-Event-ID`; a dropped connection
  does not cancel (L-TR §Sending 6), `notifications/cancelled` does (L-CAN).
- With a `FleetSessions` (fleet.py: `security.secret` + Redis) sessions are sealed into their
  ids and shared, so any replica serves any request; an answer to a request parked on another
  replica is forwarded there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from gateway import asgi
from gateway.backends.base import internal_call
from gateway.dispatch import SERVER_INFO, Dispatcher
from gateway.legacy_clients import translate
from gateway.legacy_clients.calls import LegacyCallRunner
from gateway.legacy_clients.fleet import FORWARDED_HEADER, FleetSessions
from gateway.legacy_clients.notifications import SessionNotifications
from gateway.legacy_clients.sessions import (
    EventLog,
    LegacySession,
    Message,
    SessionStore,
    is_authenticated,
    parse_event_id,
    principal_key,
)
from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta, sse
from gateway.protocol.methods import is_long_running
from gateway.protocol.principal import principal_of
from gateway.protocol.request_meta import check_initialize_declarations
from gateway.protocol.versions import LEGACY_VERSIONS, MODERN_VERSIONS

log = logging.getLogger("gateway.legacy_clients")

SESSION_HEADER = "mcp-session-id"
_SESSION_HEADER_BYTES = SESSION_HEADER.encode()
_ALLOW = [(b"allow", b"POST")]
# Reconnect delay the priming event asks for (L-TR §Sending 6: the client MUST respect it).
RETRY_MS = 1000
# Forwarded requests one session may have in flight. A dropped stream does not cancel its
# request (L-TR §Sending 6), so without a bound a client could start work, walk away and start
# more: each a task, a backend call, input requests parked for up to the input timeout.
MAX_IN_FLIGHT_PER_SESSION = 100
# How long a new GET stream waits for the one it replaces to let go.
_REPLACE_WAIT_SECONDS = 0.5
# What of the client's request the replica it is forwarded to needs to authenticate and place it.
_FORWARD_HEADERS = ("content-type", "accept", "authorization", SESSION_HEADER, h.PROTOCOL_VERSION,
                    "traceparent", "tracestate", "baggage")


class LegacyClients:
    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        idle_seconds: float = 1800.0,
        max_sessions: int = 10_000,
        keepalive_seconds: float = 15.0,
        input_timeout_seconds: float = 300.0,
        fleet: Callable[[SessionStore], FleetSessions] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.sessions = SessionStore(idle_seconds=idle_seconds, max_sessions=max_sessions)
        self.keepalive_seconds = keepalive_seconds
        self.calls = LegacyCallRunner(dispatcher, input_timeout_seconds=input_timeout_seconds)
        self.notifications = SessionNotifications(dispatcher)
        self.closing = False
        # Sessions any replica can serve, or None: this replica's own, in memory, as alone.
        self.fleet = fleet(self.sessions) if fleet is not None else None
        if self.fleet is not None:
            self.fleet.on_subscriptions = self._subscriptions_changed_elsewhere
            self.fleet.on_stream_elsewhere = self._stream_opened_elsewhere

    async def start(self) -> None:
        if self.fleet is not None:
            await self.fleet.start()

    async def aclose(self) -> None:
        await self.sessions.aclose()
        if self.fleet is not None:
            await self.fleet.aclose()

    async def _session(self, session_id: str, scope: asgi.Scope) -> LegacySession | None:
        """The caller's live session `session_id`, or None (404)."""
        if self.fleet is None:
            return self.sessions.get(session_id, principal_key(scope))
        session = await self.fleet.get(session_id, principal_key(scope))
        if session is not None and session.principal is None:
            session.principal = scope.get("auth")  # materialized here by this request
        return session

    async def end_session(self, session_id: str, principal: str) -> None:
        """End the session `session_id` of `principal`, if it is live (HTTP+SSE: its stream ended)."""
        session = self.sessions.get(session_id, principal)
        if session is None:
            return
        if self.fleet is not None:
            await self.fleet.end(session)
        else:
            await self.sessions.end(session)

    def end_streams(self) -> None:
        """Server shutdown: every standalone GET stream ends now, cleanly (a client reconnects
        to another replica), and no new one opens; requests in flight finish as usual."""
        self.closing = True
        self.sessions.end_notification_streams()

    # -- the endpoint seam ----------------------------------------------------------------

    def claims(self, body: bytes, headers: dict[str, str]) -> bool:
        """Is this POST from a legacy client? Decided before modern validation (digest §h.9:
        `initialize` selects legacy semantics; a session id or a legacy version header means
        a session is in use)."""
        version = headers.get(h.PROTOCOL_VERSION)
        if version is not None:
            if version in MODERN_VERSIONS:
                return False  # the modern fast path: one lookup
            if version in LEGACY_VERSIONS:
                return True
        if SESSION_HEADER in headers:
            return True
        # No version header (2025-03-26 and every initialize): only `initialize` itself is
        # unambiguous. Anything else stays modern and gets the modern "missing header" 400.
        if version is None and b'"initialize"' in body:
            try:
                msg = orjson.loads(body)
            except orjson.JSONDecodeError:
                return False
            return isinstance(msg, dict) and msg.get("method") == "initialize"
        return False

    async def handle(
        self, scope: asgi.Scope, body: bytes, headers: dict[str, str], receive: asgi.Receive, send: asgi.Send,
        *, old_transport: bool = False,
    ) -> None:
        """One POST of a legacy client. `old_transport`: it came over the HTTP+SSE transport
        (sse_front.py), so `initialize` may negotiate 2024-11-05, the revision whose clients
        speak it."""
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            await _send_error(send, rpc.parse_error(str(exc)))
            return
        if isinstance(msg, list):
            # 2025-03-26 allowed batches; 2025-06-18 removed them, and no SDK client sends them.
            await _send_error(
                send, rpc.invalid_request("JSON-RPC batches are not supported; send one message per POST")
            )
            return
        if not isinstance(msg, dict):
            await _send_error(send, rpc.invalid_request("the body must be one JSON-RPC 2.0 message"))
            return
        if msg.get("jsonrpc") != "2.0":
            # The id is omitted only when it could not be read (L-BASIC §Responses).
            await _send_error(send, rpc.invalid_request("the body must be one JSON-RPC 2.0 message",
                                                        _request_id(msg)))
            return
        if rpc.too_deep(body, msg):
            await _send_error(send, rpc.invalid_request(f"the message nests deeper than {rpc.MAX_DEPTH} levels",
                                                        _request_id(msg)))
            return
        if "id" in msg and not _valid_id(msg["id"]):
            # L-BASIC: an id is a string or an integer, never null. Checked before the id is
            # used as a key anywhere.
            await _send_error(send, rpc.invalid_request('"id" must be a string or an integer, never null'))
            return
        version = headers.get(h.PROTOCOL_VERSION)
        if version is not None and version not in LEGACY_VERSIONS:
            # L-TR §Protocol Version Header: an unsupported value MUST get 400.
            await _send_error(
                send,
                rpc.unsupported_version(
                    version, list(LEGACY_VERSIONS) + list(MODERN_VERSIONS), _request_id(msg)
                ),
            )
            return
        method = msg.get("method")
        if method == "initialize":
            await self._initialize(scope, msg, send, old_transport)
            return
        session_id = headers.get(SESSION_HEADER)
        if session_id is None:
            # L-TR §Session Management 2: servers that require a session SHOULD answer 400.
            await _send_error(
                send,
                rpc.invalid_request(
                    "Mcp-Session-Id header is required: send initialize first and echo the session id "
                    "it returns",
                    _request_id(msg),
                ),
            )
            return
        session = await self._session(session_id, scope)
        if session is None:
            await _send_session_not_found(send, _request_id(msg))
            return
        if version is not None and version != session.protocol_version:
            await _send_error(
                send,
                rpc.invalid_request(
                    f"MCP-Protocol-Version {version!r} differs from the version negotiated for this session "
                    f"({session.protocol_version!r})",
                    _request_id(msg),
                ),
            )
            return
        if not isinstance(method, str):
            await self._client_response(session, msg, body, headers, send)
        elif "id" not in msg:
            self._client_notification(session, method, msg.get("params"))
            await _accepted(send)
        else:
            await self._request(session, msg, headers, receive, send)

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        """GET (the standalone stream, or resuming one) and DELETE (end the session)."""
        headers = asgi.header_dict(scope)
        session_id = headers.get(SESSION_HEADER)
        if session_id is None:
            if headers.get(h.PROTOCOL_VERSION) in LEGACY_VERSIONS:
                await _send_error(send, rpc.invalid_request("Mcp-Session-Id header is required"))
            else:
                await asgi.send_json(
                    send,
                    405,
                    rpc.error_message(
                        None, rpc.INVALID_REQUEST, f"Method Not Allowed: {scope['method']}; use POST"
                    ),
                    _ALLOW,
                )
            return
        session = await self._session(session_id, scope)
        if session is None:
            await _send_session_not_found(send, None)
            return
        if scope["method"] == "DELETE":
            if self.fleet is not None:
                await self.fleet.end(session)
            else:
                await self.sessions.end(session)
            await _empty(send, 200)
            return
        if "text/event-stream" not in headers.get("accept", "") and "*/*" not in headers.get("accept", ""):
            await asgi.send_json(
                send,
                406,
                rpc.error_message(
                    None, rpc.INVALID_REQUEST, "Not Acceptable: a GET stream needs Accept: text/event-stream"
                ),
            )
            return
        last_event_id = headers.get("last-event-id")
        if last_event_id is not None:
            await self._resume(session, last_event_id, receive, send)
            return
        if self.dispatcher.hub is None:
            # L-TR §Listening 3: 405 means "no GET stream at this endpoint". Without the hub
            # nothing could ever arrive on it.
            await asgi.send_json(
                send,
                405,
                rpc.error_message(
                    None, rpc.INVALID_REQUEST, "This gateway has no notification stream (no subscription hub)"
                ),
                _ALLOW,
            )
            return
        if self.closing:
            await asgi.send_json(send, 503, rpc.error_message(
                None, rpc.INTERNAL_ERROR, "This replica is shutting down: open the GET stream again"),
                [(b"retry-after", b"1")])
            return
        await self._notification_stream(session, receive, send)

    async def _notification_stream(self, session: LegacySession, receive: asgi.Receive, send: asgi.Send) -> None:
        """The session's GET stream. A new GET replaces the one open before, at once: each
        message goes to exactly one stream (L-TR §Multiple Connections), and a client opens a
        new one when it believes the old one dead, which this server may not have noticed yet
        (a connection lost without a FIN is only seen when a keep-alive write fails)."""
        previous = session.stream_stop
        if previous is not None:
            previous.set()
        stop = session.stream_stop = asyncio.Event()
        stream = session.notification_stream()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _REPLACE_WAIT_SECONDS
        while stream.readers and loop.time() < deadline:
            # The replaced reader lets go at its next step; one stuck in a write to a dead
            # socket is not waited for (it stops after that write).
            await asyncio.sleep(0.005)
            if stop.is_set():
                return  # replaced in turn before it began
            stream = session.notification_stream()
        if self.fleet is not None:
            await self.fleet.stream_opened(session)
        self.notifications.ensure_listener(session)
        if stream.last_seq == 0:
            stream.prime(RETRY_MS)
        try:
            await self._write_sse(session, stream, stream.delivered, receive, send, stop=stop, flush_head=True)
        finally:
            if session.stream_stop is stop:
                session.stream_stop = None
                if self.fleet is not None:
                    await self.fleet.stream_closed(session)

    def _stream_opened_elsewhere(self, session: LegacySession) -> None:
        """Another replica holds the session's GET stream now: this one's ends, and so does the
        listener that fed it (the new holder runs its own)."""
        if session.stream_stop is not None:
            session.stream_stop.set()
        if session.listener is not None:
            session.listener.cancel()
            session.listener = None

    def _subscriptions_changed_elsewhere(self, session: LegacySession) -> None:
        if session.listener is not None and not session.listener.done():
            self.notifications.ensure_listener(session, restart=True)

    # -- initialize ---------------------------------------------------------------------------

    async def _initialize(self, scope: asgi.Scope, msg: Message, send: asgi.Send, old_transport: bool) -> None:
        request_id = _request_id(msg)
        params = msg.get("params")
        if request_id is None:
            await _send_error(send, rpc.invalid_request("initialize must be a request with an id"))
            return
        if not isinstance(params, dict) or not isinstance(params.get("capabilities", {}), dict):
            await _send_error(send, rpc.invalid_params('"params.capabilities" must be an object', request_id))
            return
        try:
            # They become every later request's _meta: refused once, here, naming the field.
            check_initialize_declarations(params, request_id)
        except rpc.McpError as exc:
            await _send_error(send, exc)
            return
        version = translate.negotiate_version(params.get("protocolVersion"), old_transport=old_transport)
        try:
            reply = await self.dispatcher.dispatch(internal_call("server/discover", request_id=request_id))
            fleet = (await reply.final()).get("result") or {}
        except rpc.McpError as exc:
            await _send_error(send, exc.with_id(request_id))
            return
        client_info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else None
        server_capabilities = translate.legacy_capabilities(
            fleet.get("capabilities") or {}, notifications=self.dispatcher.hub is not None
        )
        if self.fleet is not None:
            session = await self.fleet.create(
                principal_key(scope), version, params.get("capabilities") or {}, client_info, server_capabilities,
                authenticated=is_authenticated(scope),
            )
        else:
            session = await self.sessions.create(
                principal_key(scope), version, params.get("capabilities") or {}, client_info,
                authenticated=is_authenticated(scope),
            )
        session.principal = principal_of(scope)
        session.server_capabilities = server_capabilities
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": session.server_capabilities,
            "serverInfo": SERVER_INFO,
        }
        if isinstance(fleet.get("instructions"), str):
            result["instructions"] = fleet["instructions"]
        log.info("legacy client session started (version %s, %d live)", version, len(self.sessions))
        await asgi.send_json(
            send, 200, rpc.result_message(request_id, result), [(_SESSION_HEADER_BYTES, session.id.encode())]
        )

    # -- messages from the client -------------------------------------------------------------

    async def _client_response(
        self, session: LegacySession, msg: Message, body: bytes, headers: dict[str, str], send: asgi.Send
    ) -> None:
        """The client's answer to a request the gateway sent it."""
        answer_id = msg.get("id")
        future = session.pending.get(answer_id) if isinstance(answer_id, str) else None
        if (future is None and self.fleet is not None and isinstance(answer_id, str)
                and ("result" in msg or "error" in msg) and FORWARDED_HEADER not in headers):
            owner = self.fleet.owner_of(session, answer_id)
            if owner is not None:
                await self._forward_answer(owner, body, headers, answer_id, send)
                return
        if future is None or ("result" not in msg and "error" not in msg):
            await _send_error(
                send,
                rpc.invalid_request(
                    f"no request with id {msg.get('id')!r} is waiting for an answer in this session"
                ),
            )
            return
        if not future.done():
            future.set_result(msg)
        await _accepted(send)

    async def _forward_answer(
        self, owner: str, body: bytes, headers: dict[str, str], answer_id: str, send: asgi.Send
    ) -> None:
        """The answer belongs to a request another replica parked on the client: relay it
        there, as an MRTR retry is relayed to the replica holding its call (docs/legacy.md),
        and give the client that replica's verdict."""
        assert self.fleet is not None
        if owner.startswith("unadvertised:"):
            await _send_error(send, rpc.invalid_request(
                f"the request {answer_id!r} was sent by another gateway replica that advertises no address "
                "(security.advertise_url is unset there), so this answer cannot reach it"))
            return
        forwarded = {name: headers[name] for name in _FORWARD_HEADERS if name in headers}
        forwarded[FORWARDED_HEADER] = "1"
        try:
            response = await self.fleet.forwarder().post(owner, body, forwarded, read_timeout=10.0)
            answer = await response.read()
        except rpc.McpError as exc:
            log.warning("forwarding a legacy client's answer to %s failed: %s", owner, exc.message)
            await _send_error(send, rpc.invalid_request(
                f"the gateway replica that sent request {answer_id!r} cannot be reached ({exc.message}); the call "
                "that waited for this answer ended with it"))
            return
        content_type = response.headers.get("content-type", "application/json")
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(b"content-type", content_type.encode("latin-1")),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    def _client_notification(self, session: LegacySession, method: str, params: Any) -> None:
        if method == "notifications/initialized":
            session.initialized = True
        elif method == "notifications/cancelled" and isinstance(params, dict):
            # L-CAN: stop the work; no response is sent for a cancelled request.
            request_id = params.get("requestId")
            task = session.in_flight.get(request_id) if _valid_id(request_id) else None
            if task is not None:
                task.cancel()
        # Anything else (roots/list_changed, progress) has no modern counterpart to feed.

    async def _request(
        self,
        session: LegacySession,
        msg: Message,
        headers: dict[str, str],
        receive: asgi.Receive,
        send: asgi.Send,
    ) -> None:
        method, request_id, params = msg["method"], msg["id"], msg.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "ping":
            await _send_result(send, request_id, {})
        elif method == "logging/setLevel":
            level = params.get("level")
            if level not in meta.LOG_LEVELS:
                await _send_message(
                    send, rpc.invalid_params(f"unknown log level {level!r}", request_id).to_message()
                )
                return
            session.log_level = level  # becomes each later request's modern logLevel (digest §h.8)
            if self.fleet is not None:
                await self.fleet.set_log_level(session, level)
            await _send_result(send, request_id, {})
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            await self._subscription(session, method, request_id, params, send)
        elif method in translate.FORWARDED:
            await self._forward(session, msg, headers, receive, send)
        else:
            await _send_message(send, rpc.method_not_found(method, request_id).to_message())

    async def _subscription(
        self, session: LegacySession, method: str, request_id: Any, params: dict[str, Any], send: asgi.Send
    ) -> None:
        if not session.server_capabilities.get("resources", {}).get("subscribe"):
            await _send_message(send, rpc.method_not_found(method, request_id).to_message())
            return
        uri = params.get("uri")
        if not isinstance(uri, str) or not uri:
            await _send_message(
                send, rpc.invalid_params('"params.uri" must be a string', request_id).to_message()
            )
            return
        before = set(session.subscriptions)
        if method == "resources/subscribe":
            session.subscriptions.add(uri)
        else:
            session.subscriptions.discard(uri)
        if self.fleet is not None:
            await self.fleet.update_subscription(session, uri, subscribe=method == "resources/subscribe")
        if session.subscriptions != before:
            if self.fleet is not None and self.fleet.stream_held_elsewhere(session):
                # The replica with the GET stream hears the change and re-listens there.
                self._subscriptions_changed_elsewhere(session)
            else:
                self.notifications.ensure_listener(session, restart=True)
        await _send_result(send, request_id, {})

    # -- forwarded requests ---------------------------------------------------------------------

    async def _forward(
        self,
        session: LegacySession,
        msg: Message,
        headers: dict[str, str],
        receive: asgi.Receive,
        send: asgi.Send,
    ) -> None:
        request_id = msg["id"]
        if request_id in session.in_flight:
            # L-BASIC: an id is never reused within a session. Replacing the entry would leave
            # the first request's work running untracked (uncancellable, and uncounted below).
            await _send_message(send, rpc.invalid_request(
                f"request id {request_id!r} is still in flight in this session", request_id).to_message())
            return
        if len(session.in_flight) >= MAX_IN_FLIGHT_PER_SESSION:
            await _send_message(send, rpc.gateway_overloaded(
                f"this session already has {MAX_IN_FLIGHT_PER_SESSION} requests in flight; wait for (or cancel) "
                "some of them", limit="legacy_clients.MAX_IN_FLIGHT_PER_SESSION", request_id=request_id).to_message())
            return
        accept = headers.get("accept", "")
        # Long-running methods' answers may need a stream (progress, logs, server-to-client
        # requests for input): SSE whenever the client accepts it, as the SDK servers do.
        streamed = is_long_running(msg["method"]) and ("text/event-stream" in accept or "*/*" in accept)
        stream = session.new_stream() if streamed else None
        if stream is not None:
            stream.prime(RETRY_MS)
        work = asyncio.create_task(self._work(session, msg, stream))
        session.in_flight[msg["id"]] = work
        if stream is not None:
            # The work outlives this connection: a dropped stream is resumed, not cancelled.
            await self._write_sse(session, stream, 0, receive, send)
            return
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not work.done():
            work.cancel()  # a JSON answer has nowhere to go once the client is gone
            return
        if work.cancelled():
            await _accepted(send)  # cancelled by notifications/cancelled: no response (L-CAN)
            return
        await _send_message(send, work.result())

    async def _work(self, session: LegacySession, msg: Message, stream: EventLog | None) -> Message:
        legacy_id = msg["id"]
        try:
            final = await self.calls.run(session, msg, stream)
        except rpc.McpError as exc:
            final = {**exc.to_message(), "id": legacy_id}
        except asyncio.CancelledError:
            if stream is not None:
                stream.finish()
            raise
        except Exception:
            log.exception("legacy client request %s failed", msg.get("method"))
            final = rpc.error_message(legacy_id, rpc.INTERNAL_ERROR, "Internal error in the gateway")
        finally:
            if session.in_flight.get(legacy_id) is asyncio.current_task():
                del session.in_flight[legacy_id]
        if stream is not None:
            stream.append(final)
            stream.finish()
        return final

    # -- writing streams ------------------------------------------------------------------------

    async def _resume(
        self, session: LegacySession, last_event_id: str, receive: asgi.Receive, send: asgi.Send
    ) -> None:
        parsed = parse_event_id(last_event_id)
        stream = session.streams.get(parsed[0]) if parsed else None
        if (stream is None and parsed is not None and self.fleet is not None and self.dispatcher.hub is not None
                and self.fleet.notification_stream_of_another_replica(parsed[0])):
            # The session's GET stream was held by another replica (dead, or the balancer sent
            # the client here): what it had not delivered went with it, and the client gets
            # the session's notification stream from here on.
            await self._notification_stream(session, receive, send)
            return
        if stream is None or parsed is None or not stream.can_resume_after(parsed[1]):
            await _send_error(
                send,
                rpc.invalid_request(
                    f"Last-Event-ID {last_event_id!r} names no stream of this session that can still be "
                    "resumed"
                ),
            )
            return
        if stream.readers:
            await asgi.send_json(
                send,
                409,
                rpc.error_message(None, rpc.INVALID_REQUEST, "Conflict: that stream is already being read"),
            )
            return
        await self._write_sse(session, stream, parsed[1], receive, send)

    async def _write_sse(
        self, session: LegacySession, stream: EventLog, after: int, receive: asgi.Receive, send: asgi.Send,
        *, stop: asyncio.Event | None = None, flush_head: bool = False,
    ) -> None:
        """Relay `stream` from event `after` until it finishes, the client goes away or `stop`
        is set (a newer GET stream replaced this one), with keep-alive comments on quiet
        stretches. `flush_head`: with no event to send at once, a comment goes out first."""
        await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS})
        if flush_head and after >= stream.last_seq:
            # The response head leaves with the first body bytes: a re-opened GET stream with
            # nothing new to say was answered only at the next keep-alive, keepalive_seconds
            # later, its client left wondering. A comment is no event: the stream's ids go on
            # without a gap (L-TR §Resumability).
            await send({"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True})
        events = stream.follow(after)
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
        upcoming: asyncio.Future[tuple[int, bytes]] | None = None
        try:
            while True:
                if upcoming is None:
                    upcoming = asyncio.ensure_future(events.__anext__())
                waiting = (upcoming, watcher) if stopped is None else (upcoming, watcher, stopped)
                done, _ = await asyncio.wait(
                    waiting, timeout=self.keepalive_seconds, return_when=asyncio.FIRST_COMPLETED
                )
                if stopped is not None and stopped in done:
                    break  # replaced: what is not yet written goes to the new stream
                if upcoming in done:
                    try:
                        seq, payload = upcoming.result()
                    except StopAsyncIteration:
                        break
                    upcoming = None
                    await send({"type": "http.response.body", "body": payload, "more_body": True})
                    stream.delivered = max(stream.delivered, seq)
                    self.sessions.touch(session)
                elif watcher in done:
                    return  # the client left; the stream stays resumable
                else:
                    await send({"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            for task in (upcoming, watcher, stopped):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                        await task
            await events.aclose()
            self.sessions.touch(session)


# -- helpers -----------------------------------------------------------------------------------



def _request_id(msg: Any) -> rpc.RequestId | None:
    rid = msg.get("id") if isinstance(msg, dict) else None
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None


async def _wait_disconnect(receive: asgi.Receive) -> None:
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


async def _empty(send: asgi.Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def _accepted(send: asgi.Send) -> None:
    await _empty(send, 202)


async def _send_message(send: asgi.Send, message: Message) -> None:
    """A JSON-RPC answer inside a live session: HTTP 200 whatever it says, as legacy clients
    expect (a legacy transport reserves 4xx for transport and session failures)."""
    await asgi.send_bytes(send, 200, orjson.dumps(message))


async def _send_result(send: asgi.Send, request_id: Any, result: dict[str, Any]) -> None:
    await _send_message(send, rpc.result_message(request_id, result))


async def _send_error(send: asgi.Send, error: rpc.McpError) -> None:
    """A transport-level refusal: 400 unless the error says otherwise."""
    status = error.status if error.status >= 400 else 400
    await asgi.send_json(send, status, error.to_message())


async def _send_session_not_found(send: asgi.Send, request_id: rpc.RequestId | None) -> None:
    # L-TR §Session Management 3: an ended or unknown session MUST get 404; the client then
    # starts over with initialize.
    await asgi.send_json(
        send,
        404,
        rpc.error_message(
            request_id,
            rpc.INVALID_REQUEST,
            "Session not found: it ended or expired; send initialize to start a new one",
        ),
    )


def _valid_id(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)
