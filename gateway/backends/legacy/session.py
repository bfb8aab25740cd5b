"""One initialize-era session, seen from the gateway acting as its client (digest §h.2, §h.3).

This module is the transport-independent core: the handshake, the id and progress-token
rewriting, and the demultiplexing of whatever the backend sends into the `Exchange` of the
request it belongs to. `http.py` and `stdio.py` only move bytes and say on which stream a
message arrived.

Where a message goes (`LegacySession.route`):

- a response → the exchange with that (rewritten) id;
- `notifications/progress` → the exchange that owns the (rewritten) progress token;
- `ping` from the backend → answered with `{}` at once (L-PING), never forwarded;
- `notifications/cancelled` → the exchange that carried the backend request it names, whichever
  stream it came on (§h.5: the backend withdrew a question to a call, maybe one parked for an
  MRTR retry), and nowhere when no call still awaits an answer to that request;
- resource and list-changed notifications → the session-wide listener (subscriptions, §h.6),
  whichever stream they came on, because a legacy server sends each message on one stream
  only and never broadcasts;
- anything else (log messages, server-to-client requests) → the exchange of
  the stream it arrived on, and nowhere when the stream belongs to no request: a log message
  on the GET stream is dropped (§h.8), a request there is refused (§h.5), except `roots/list`,
  which the configured roots answer (a server that asks at start-up, before any request).
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from gateway import __version__
from gateway.backends.exchange import Exchange, is_request_id
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.versions import BACKEND_LEGACY_VERSIONS, LATEST_LEGACY

log = logging.getLogger("gateway.backends.legacy")

Message = dict[str, Any]
NotificationSink = Callable[[Message], None]

CLIENT_INFO = {"name": "mcp-gateway", "version": __version__}
# Notifications that concern the session as a whole, not one request (§h.6).
SESSION_WIDE = frozenset({
    "notifications/resources/updated",
    "notifications/resources/list_changed",
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
})


# The requests during which a backend may ask the client for input (§h.5).
INPUT_CARRIERS = frozenset({"tools/call", "prompts/get", "resources/read"})


class SessionExpired(Exception):
    """The backend answered 404 to a request carrying our session id: the session is gone
    and the request was not processed (L-TR §Session Management)."""


class LegacySession(abc.ABC):
    """An initialized session; subclasses supply the transport."""

    def __init__(self, backend: str, capabilities: dict[str, Any], on_notification: NotificationSink) -> None:
        self.backend = backend
        self.capabilities = capabilities  # what the gateway declared in initialize
        self.on_notification = on_notification
        self.initialize_result: Message | None = None
        self.version = LATEST_LEGACY
        self.closed = False
        self.last_used = time.monotonic()
        self.log_level_set = False
        self._ids = itertools.count(1)
        self._exchanges: dict[int, Exchange] = {}
        self._by_progress: dict[str, Exchange] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # Called when the last request in flight is done: the pool may now close the session.
        self.on_idle: Callable[[], None] | None = None
        # What a `roots/list` the backend sends outside any client request is answered with
        # (legacy `Root` objects; the backend sets them from `backends[].roots`).
        self.standalone_roots: tuple[Message, ...] = ()

    # -- what a transport implements ----------------------------------------------------

    @abc.abstractmethod
    async def _send_request(self, exchange: Exchange, message: Message) -> None:
        """Deliver a request; what answers it must reach `route(..., exchange)`. Raises
        SessionExpired when the backend no longer knows the session."""

    @abc.abstractmethod
    async def _send(self, message: Message) -> None:
        """Deliver a notification or a response (to a backend request)."""

    @abc.abstractmethod
    async def _initialize(self, message: Message) -> Message:
        """Send the initialize request (no session id yet) and return its response."""

    async def _abandon(self, exchange: Exchange) -> None:
        """Stop reading what belongs to `exchange` (HTTP closes its POST stream)."""

    async def _terminate(self) -> None:
        """Transport-level end of the session (HTTP: DELETE)."""

    def mark_expired(self) -> None:
        """The backend already forgot this session: closing it must not try to end it."""

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def server_capabilities(self) -> dict[str, Any]:
        caps = (self.initialize_result or {}).get("capabilities")
        return caps if isinstance(caps, dict) else {}

    @property
    def server_info(self) -> dict[str, Any] | None:
        info = (self.initialize_result or {}).get("serverInfo")
        return info if isinstance(info, dict) else None

    @property
    def keeps_state(self) -> bool:
        """Whether the backend remembers this session between requests: what subscriptions
        and a notification channel depend on (a stateless HTTP backend mints no session)."""
        return True

    @property
    def in_flight(self) -> int:
        return len(self._exchanges)

    async def open(self) -> None:
        """initialize at the newest legacy version, then notifications/initialized (L-LC)."""
        request = {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": "initialize",
            "params": {"protocolVersion": LATEST_LEGACY, "capabilities": self.capabilities,
                       "clientInfo": CLIENT_INFO},
        }
        response = await self._initialize(request)
        result = response.get("result")
        if not isinstance(result, dict):
            err = response.get("error") or {}
            raise rpc.backend_protocol_error(
                self.backend, f"initialize failed: {err.get('code')} {err.get('message')}")
        version = result.get("protocolVersion")
        if version not in BACKEND_LEGACY_VERSIONS:
            # L-LC: a client that does not support the offered version SHOULD disconnect.
            self.initialize_result = result
            await self.close()
            raise rpc.backend_protocol_error(
                self.backend, f"initialize offered protocol version {version!r}; the gateway speaks "
                              f"{', '.join(BACKEND_LEGACY_VERSIONS)}")
        self.version = version
        self.initialize_result = result
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def fail_all(self, error: rpc.McpError) -> None:
        """Every request in flight fails with `error` (the transport died)."""
        for exchange in list(self._exchanges.values()):
            exchange.fail(error)
        self._exchanges.clear()
        self._by_progress.clear()
        if self.on_idle is not None:
            self.on_idle()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.fail_all(rpc.backend_unavailable(self.backend, "the backend session was closed"))
        try:
            await self._terminate()
        finally:
            for task in list(self._tasks):
                task.cancel()

    # -- requests -----------------------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any], *, progress: bool = False,
                      wants_logs: bool = False) -> Exchange:
        """Send one request under a fresh id (L-BASIC: ids are never reused in a session)."""
        if self.closed:
            raise rpc.backend_unavailable(self.backend, "the backend session was closed")
        self.last_used = time.monotonic()
        exchange = Exchange(next(self._ids), method)
        exchange.wants_logs = wants_logs
        if progress:
            # PROG: tokens must be unique across the session's active requests; the client's
            # own token could collide with another client's, so the gateway mints one.
            token = f"gw-{exchange.backend_id}"
            exchange.progress_token = token
            meta = dict(params.get("_meta") or {})
            meta["progressToken"] = token
            params = {**params, "_meta": meta}
            self._by_progress[token] = exchange
        self._exchanges[exchange.backend_id] = exchange
        message = {"jsonrpc": "2.0", "id": exchange.backend_id, "method": method, "params": params}
        try:
            await self._send_request(exchange, message)
        except BaseException:
            self.forget(exchange)
            raise
        return exchange

    def forget(self, exchange: Exchange) -> None:
        self._exchanges.pop(exchange.backend_id, None)
        if exchange.progress_token is not None:
            self._by_progress.pop(exchange.progress_token, None)
        if not self._exchanges and self.on_idle is not None:
            self.on_idle()

    async def cancel(self, exchange: Exchange, reason: str) -> None:
        """The client went away: legacy disconnects do not cancel, so say it (L-CAN)."""
        if exchange.done:
            self.forget(exchange)
            return
        exchange.fail(rpc.backend_unavailable(self.backend, f"request cancelled: {reason}"))
        self.forget(exchange)
        try:
            await self._send(rpc.notification("notifications/cancelled",
                                              {"requestId": exchange.backend_id, "reason": reason}))
        except (rpc.McpError, SessionExpired) as exc:
            log.info("backend %s: could not deliver cancellation: %s", self.backend, exc)
        await self._abandon(exchange)

    def cancel_soon(self, exchange: Exchange, reason: str) -> None:
        """`cancel` from a place that cannot await (a closing generator, a cancelled task)."""
        if exchange.done:
            self.forget(exchange)
            return
        self.spawn(self.cancel(exchange, reason))

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self._send(rpc.notification(method, params))

    async def respond(self, request_id: Any, *, result: Message | None = None,
                      error: tuple[int, str] | None = None) -> None:
        """Answer a backend-initiated request."""
        carrier = self._carrier(request_id)
        if carrier is not None:
            carrier.open_requests.discard(request_id)
        message: Message = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            message["error"] = {"code": error[0], "message": error[1]}
        else:
            message["result"] = result if result is not None else {}
        await self._send(message)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("backend %s: background send failed: %s", self.backend, task.exception())

    # -- demultiplexing -----------------------------------------------------------------

    def _carrier(self, request_id: Any) -> Exchange | None:
        """The exchange whose call still awaits an answer to backend request `request_id`.
        A scan, not an index: it runs only when a backend request is answered or withdrawn,
        and there is then nothing to keep in step when exchanges come and go."""
        if not is_request_id(request_id):
            return None
        for exchange in self._exchanges.values():
            if request_id in exchange.open_requests:
                return exchange
        return None

    def _withdrawn(self, message: Message) -> None:
        """A backend `notifications/cancelled`: the backend gave up on a request it sent us
        (L-CAN: it names a request issued in the same direction). §h.5: the call that carried
        it must not answer it nor ask the client for it, parked or not; the exchange learns it
        wherever the cancellation came from (its own POST stream, the GET stream, a shared
        stdio or HTTP+SSE stream, on which `sole_origin` skips parked calls). It is never
        forwarded: a modern client has no use for it."""
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        carrier = self._carrier(request_id)
        if carrier is None:
            # Already answered, or never asked of a call: nothing to clear (L-CAN: ignore it).
            log.debug("backend %s: cancellation of request %r, which no call awaits, dropped", self.backend,
                      request_id)
            return
        carrier.withdraw(request_id, message)

    def sole_origin(self, message: Message) -> Exchange | None:
        """The request a log message or backend request on a shared stream (stdio, HTTP+SSE)
        belongs to, when only one can be its origin; None when it is ambiguous. Calls parked
        for an MRTR retry do not count: their backend call is blocked until the gateway
        answers. A backend request can only come from a call that may carry input requests
        (§h.5), so lists and the like in flight beside it do not make it ambiguous."""
        candidates = [e for e in self._exchanges.values() if not e.waiting_for_client]
        if "id" in message:
            candidates = [e for e in candidates if e.method in INPUT_CARRIERS]
        return candidates[0] if len(candidates) == 1 else None

    def decode(self, data: str) -> list[Message]:
        """The messages of one SSE event's data: a JSON-RPC object, or an array of them, which
        2025-03-26 allowed (batches, §h.2). Anything else is dropped with a warning."""
        try:
            payload: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            log.warning("backend %s sent a non-JSON SSE event; dropped", self.backend)
            return []
        return [item for item in (payload if isinstance(payload, list) else (payload,)) if isinstance(item, dict)]

    def route(self, message: Message, origin: Exchange | None) -> None:
        """Deliver one message from the backend; `origin` is the exchange whose stream it
        arrived on (None: the GET stream, or a stdio message nobody can be credited with)."""
        method = message.get("method")
        if not isinstance(method, str):
            exchange = self._exchanges.get(message.get("id"))  # type: ignore[arg-type]
            if exchange is None and origin is not None and not origin.done and message.get("id") in (None, "server-error"):
                exchange = origin  # an error the backend could not tie to an id (e.g. HTTP 400)
            if exchange is None:
                log.debug("backend %s: response to unknown id %r dropped", self.backend, message.get("id"))
                return
            self.forget(exchange)
            exchange.put(message)
            return
        if "id" in message:
            if method == "ping":
                self.spawn(self.respond(message["id"], result={}))
            elif origin is not None and not origin.done:
                origin.put(message)
            elif method == "roots/list":
                # Asked outside any client request (at start-up, on the GET stream): no client
                # to ask, so the configured roots answer (`backends[].roots`, default none).
                # The session declared `roots`, so -32601 would read as a broken client.
                self.spawn(self.respond(message["id"], result={"roots": list(self.standalone_roots)}))
            else:
                # §h.5: a request unrelated to any client request cannot become MRTR.
                self.spawn(self.respond(message["id"], error=(
                    rpc.METHOD_NOT_FOUND, f"{method} is not available outside a client request")))
            return
        if method == "notifications/progress":
            token = (message.get("params") or {}).get("progressToken")
            exchange = self._by_progress.get(str(token)) if token is not None else None
            if exchange is not None:
                exchange.put(message)
            return
        if method == "notifications/cancelled":
            self._withdrawn(message)
            return
        if method in SESSION_WIDE:
            self.on_notification(message)
            return
        if origin is not None and not origin.done:
            origin.put(message)
