"""`subscriptions/listen` onto a legacy backend (digest §h.6).

A legacy backend announces changes on its session's GET stream (and, since it never
broadcasts, on whatever POST stream happens to be open), and sends resource updates only for
URIs the session subscribed to with `resources/subscribe`. So: one listen session per
backend, its GET stream held open while anybody listens, `resources/subscribe` reference-
counted per URI, `resources/unsubscribe` when the last listener of a URI leaves. Every
listen call gets a stream that starts with the acknowledgement and then carries the
notifications it asked for, tagged with its own id — exactly what a modern backend's listen
stream looks like, so the hub above cannot tell the difference.

The acknowledgement promises only what can be delivered: list-changed types the backend
advertises (and only with a live channel), resource subscriptions only with
`resources.subscribe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from gateway.backends.base import Message, Reply
from gateway.backends.legacy.pool import SessionPool
from gateway.backends.legacy.session import LegacySession
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.principal import ANONYMOUS, Principal
from gateway.protocol.request import Call
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.legacy.listen")

# Modern filter flag → (legacy capability, the legacy notification it selects).
_LIST_FLAGS = {
    "toolsListChanged": ("tools", "notifications/tools/list_changed"),
    "promptsListChanged": ("prompts", "notifications/prompts/list_changed"),
    "resourcesListChanged": ("resources", "notifications/resources/list_changed"),
}
_QUEUE_LIMIT = 1000


class ListenHost(Protocol):
    """What the listens need of their backend (`LegacyBackend` is one): declared here so that
    this module does not import the backend that imports it."""

    name: str
    settings: BackendSettings
    pool: SessionPool

    def session_capabilities(self, client_capabilities: dict[str, Any]) -> dict[str, Any]: ...

    async def open_channel(self, session: LegacySession) -> tuple[bool, asyncio.Task[None] | None]: ...

    async def authorize(self, principal: Principal, request_id: Any = None) -> str: ...


class _Listener:
    def __init__(self, listen_id: Any, agreed: dict[str, Any]) -> None:
        self.id = listen_id
        self.agreed = agreed
        self.methods = {method for flag, (_, method) in _LIST_FLAGS.items() if agreed.get(flag)}
        self.uris: list[str] = list(agreed.get("resourceSubscriptions") or [])
        self.queue: asyncio.Queue[Message | None] = asyncio.Queue(_QUEUE_LIMIT)

    def wants(self, message: Message) -> bool:
        method = message.get("method")
        if method in self.methods:
            return True
        if method == "notifications/resources/updated":
            uri = (message.get("params") or {}).get("uri")
            # SCHEMA: the uri "might be a sub-resource of the one that the client subscribed to".
            return isinstance(uri, str) and any(uri == u or uri.startswith(u.rstrip("/") + "/") for u in self.uris)
        return False

    def end(self) -> None:
        """End the stream after what is queued (a full queue gives up its oldest message: the
        hub treats the end as a gap anyway)."""
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(None)

    def offer(self, message: Message) -> None:
        if not self.wants(message):
            return
        params = dict(message.get("params") or {})
        params["_meta"] = {**(params.get("_meta") or {}), meta.SUBSCRIPTION_ID: self.id}
        try:
            self.queue.put_nowait(rpc.notification(message["method"], params))
        except asyncio.QueueFull:
            log.warning("listen %r: %d notifications not consumed; dropping", self.id, _QUEUE_LIMIT)


class LegacyListens:
    def __init__(self, backend: ListenHost) -> None:
        self.backend = backend
        self._listeners: set[_Listener] = set()
        self._refs: dict[str, int] = {}
        self._session: LegacySession | None = None
        self._channel: asyncio.Task[None] | None = None
        self._has_channel = False
        self._lock = asyncio.Lock()
        backend.pool.on_renew.append(self._renewed)

    def deliver(self, message: Message) -> None:
        """A session-wide notification from any session of the backend."""
        for listener in list(self._listeners):
            listener.offer(message)

    def end_all(self) -> None:
        """The session the listens lived on is gone and no replacement took over (a stdio
        process died, an HTTP+SSE stream ended and the backend is down): end every listen
        stream. The hub listens again with backoff, on a fresh session, and tells its clients
        what may have been missed (docs/subscriptions.md); left open, the streams would stay
        silent for good, their subscriptions gone with the session."""
        for listener in list(self._listeners):
            listener.end()

    async def aclose(self) -> None:
        if self._channel is not None:
            self._channel.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._channel
            self._channel = None

    async def listen(self, call: Call) -> Reply:
        requested = call.params.get("notifications")
        if not isinstance(requested, dict):
            raise rpc.invalid_params('"notifications" must be an object', call.id)
        async with self._lock:
            session = await self._listen_session()
            caps = session.server_capabilities
            has_channel = self._has_channel and (self._channel is None or not self._channel.done())
            agreed: dict[str, Any] = {}
            if not session.keeps_state:
                # A stateless backend: nothing to subscribe on, no channel to listen to; the
                # ack promises nothing (SUB: the ack is the subset that will be honoured).
                requested = {}
            for flag, (capability, _) in _LIST_FLAGS.items():
                if requested.get(flag) is True and has_channel and (caps.get(capability) or {}).get("listChanged"):
                    agreed[flag] = True
            uris = [u for u in requested.get("resourceSubscriptions") or () if isinstance(u, str)]
            if uris and (caps.get("resources") or {}).get("subscribe"):
                subscribed = [uri for uri in dict.fromkeys(uris) if await self._ref(session, uri)]
                if subscribed:
                    agreed["resourceSubscriptions"] = subscribed
            listener = _Listener(call.id, agreed)
            self._listeners.add(listener)
        return Reply(self.backend.name, stream=self._stream(listener))

    async def _stream(self, listener: _Listener) -> AsyncIterator[Message]:
        try:
            # SUB: the acknowledgement comes first and names what will be delivered.
            yield rpc.notification("notifications/subscriptions/acknowledged", {
                "notifications": listener.agreed, "_meta": {meta.SUBSCRIPTION_ID: listener.id}})
            while (message := await listener.queue.get()) is not None:
                yield message
        finally:
            self._listeners.discard(listener)
            session = self._session
            for uri in listener.uris:
                self._unref(session, uri)
            if not self._listeners:
                await self._stop_channel()

    async def _listen_session(self) -> LegacySession:
        # The hub's listen acts for nobody: the gateway's own credential.
        session = await self.backend.pool.get(self.backend.session_capabilities({}),
                                              await self.backend.authorize(ANONYMOUS))
        if session is not self._session or not self._has_channel or (
                self._channel is not None and self._channel.done()):
            await self._stop_channel()
            self._session = session
            self.backend.pool.pinned.add(session)
            if session.keeps_state:
                self._has_channel, self._channel = await self.backend.open_channel(session)
        # Opening the channel may have met a session the backend forgot (GET → 404) and renewed
        # it (`_renewed`). The stale one is closed and, its id dropped, looks stateless: a listen
        # on it acknowledged nothing at all (the first listen after a backend restart).
        assert self._session is not None
        return self._session

    @property
    def session(self) -> LegacySession | None:
        return self._session

    async def _stop_channel(self) -> None:
        if self._session is not None and not self._listeners:
            self.backend.pool.unpin(self._session)
        if not self._listeners:
            self._has_channel = False
        if self._channel is not None and not self._listeners:
            self._channel.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._channel
            self._channel = None

    async def _ref(self, session: LegacySession, uri: str) -> bool:
        if self._refs.get(uri, 0) == 0:
            try:
                await self._call(session, "resources/subscribe", uri)
            except rpc.McpError as exc:
                log.warning("backend %s: resources/subscribe %s failed: %s", self.backend.name, uri, exc.message)
                return False
        self._refs[uri] = self._refs.get(uri, 0) + 1
        return True

    def _unref(self, session: LegacySession | None, uri: str) -> None:
        count = self._refs.get(uri, 0) - 1
        if count > 0:
            self._refs[uri] = count
            return
        self._refs.pop(uri, None)
        if session is not None and not session.closed:
            session.spawn(self._quiet_call(session, "resources/unsubscribe", uri))

    async def _call(self, session: LegacySession, method: str, uri: str) -> None:
        exchange = await session.request(method, {"uri": uri})
        while True:
            message = await exchange.next(self.backend.settings.timeout_seconds)
            if "method" not in message:
                break
        if "error" in message:
            raise rpc.backend_protocol_error(self.backend.name, f"{method} {uri}: {message['error'].get('message')}")

    async def _quiet_call(self, session: LegacySession, method: str, uri: str) -> None:
        try:
            await self._call(session, method, uri)
        except Exception as exc:
            log.info("backend %s: %s %s failed: %s", self.backend.name, method, uri, exc)

    def _renewed(self, stale: LegacySession, fresh: LegacySession) -> None:
        """The listen session expired (§h.3): subscribe again on the new one, and tell the
        listeners that lists may have changed meanwhile (notifications may have been lost)."""
        if stale is not self._session:
            return
        self._session = fresh

        async def restore() -> None:
            for uri in list(self._refs):
                await self._quiet_call(fresh, "resources/subscribe", uri)
            for listener in list(self._listeners):
                for method in listener.methods:
                    listener.offer(rpc.notification(method))

        fresh.spawn(restore())
