"""Legacy client sessions that every replica can serve (`security.secret` + Redis).

- The id seals the session's immutable facts (sealed.py), so any replica can open it, check
  the principal binding and serve the request. It seals a random key too, which names the
  session's shared state in Redis (shared.py): log level, subscriptions, liveness, shares.
- Each replica materializes a `LegacySession` for the sessions its requests reach (in its
  local `SessionStore`, bounded as before); it holds only what lives on that replica: the
  streams it writes, the calls it runs, the requests it parked on the client, and, where the
  session's GET stream is, the listener that feeds it. Forgetting a materialization (LRU,
  idle) ends nothing but those; ending the session (DELETE, expiry, eviction) ends it
  everywhere through the shared key and an event.
- A replica that dies loses its streams and calls; the session lives on in the id and Redis.
- Redis unreachable: the sealed id still opens, so requests go on with what the replica knew
  (its materialization, or the sealed facts alone); nothing is refused for the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.legacy_clients.sealed import INPUT_REQUEST, SESSION, Sealer, principal_binding
from gateway.legacy_clients.sessions import LegacySession, SessionStore, per_principal_share
from gateway.legacy_clients.shared import LiveState, SharedSessions, SharedUnavailable
from gateway.observability import metrics

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.legacy_clients.fleet")

# Marks a request one replica forwards to another (the marker MRTR retries use too): the
# receiver serves it itself and never forwards it again.
FORWARDED_HEADER = "x-mcp-gateway-forwarded"
# A stream kept open on a replica renews its session's idle clock in Redis this often (at
# most), so a session that only listens does not expire under its open GET stream.
_HEARTBEAT_MAX_SECONDS = 60.0


class FleetSessions:
    def __init__(self, store: SessionStore, sealer: Sealer, shared: SharedSessions, *, owner_url: str,
                 max_per_principal: int, max_total: int) -> None:
        self.store = store
        self.sealer = sealer
        self.shared = shared
        # Where other replicas forward what belongs to this one (an answer to a request it
        # parked on a client): security.advertise_url, as for MRTR retries.
        self.owner_url = owner_url
        self.replica_id = shared.replica_id
        # Stream ids must not collide between replicas of one session (Last-Event-ID names one).
        self.stream_tag = secrets.token_hex(4) + "."
        self.max_per_principal = max_per_principal
        self.max_total = max_total
        self._by_key: dict[str, str] = {}  # shared key -> session id, for the events
        self._heartbeat: asyncio.Task[None] | None = None
        self._forwarder: Any = None
        # Set by the server: what to do when a session's subscriptions or GET stream moved.
        self.on_subscriptions: Callable[[LegacySession], None] = lambda session: None
        self.on_stream_elsewhere: Callable[[LegacySession], None] = lambda session: None

    async def start(self) -> None:
        log.info("legacy client sessions are shared by the fleet (sealed ids, state in Redis): any replica serves them")
        if not self.owner_url.startswith(("http://", "https://")):
            log.warning("security.advertise_url is not set and server.host names no address other replicas can "
                        "reach: an answer to an elicitation, sampling or roots request of this replica, or an "
                        "HTTP+SSE POST for a stream it holds, that the balancer sends to another replica cannot "
                        "be forwarded here (set MCP_GATEWAY_SECURITY__ADVERTISE_URL)")
        await self.shared.start(self._on_event, self._on_resync)
        self._heartbeat = asyncio.create_task(self._renew_active(), name="legacy-sessions-heartbeat")

    async def aclose(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        await self.shared.aclose()
        if self._forwarder is not None:
            await self._forwarder.aclose()

    def forwarder(self) -> Any:
        """The HTTP client that relays to other replicas what belongs to them (an answer to a
        request they parked on a client, an HTTP+SSE POST for a stream they hold)."""
        if self._forwarder is None:
            from gateway.backends.http1 import Http1Client

            self._forwarder = Http1Client("gateway-replica", max_connections=64, connect_timeout=5.0)
        return self._forwarder

    # -- sessions ---------------------------------------------------------------------------------

    async def create(self, principal_key: str, protocol_version: str, client_capabilities: dict[str, Any],
                     client_info: dict[str, Any] | None, server_capabilities: dict[str, Any], *,
                     authenticated: bool) -> LegacySession:
        key = secrets.token_urlsafe(16)
        binding = principal_binding(principal_key)
        session_id = self.sealer.seal(SESSION, {
            "k": key, "p": binding, "v": protocol_version, "c": client_capabilities, "i": client_info,
            "s": server_capabilities,
        })
        recorded = True
        try:
            await self.shared.create(key, binding, counted=authenticated, per_principal=self.max_per_principal,
                                     total=self.max_total)
        except SharedUnavailable:
            recorded = False  # written at its next request, once Redis answers again
        session = self._materialize(session_id, key, principal_key, protocol_version, client_capabilities,
                                    client_info, server_capabilities)
        session.recorded = recorded
        metrics.LEGACY_SESSIONS_CREATED.inc()  # once in the fleet: by the replica that answered initialize
        return session

    async def get(self, session_id: str, principal_key: str) -> LegacySession | None:
        """The session `session_id` of this principal, wherever it was created; None when it
        is not ours, not this principal's, or has ended anywhere in the fleet."""
        session = self.store.get(session_id, principal_key)
        if session is None:
            facts = self.sealer.open(SESSION, session_id)
            if facts is None or not isinstance(facts.get("k"), str) or not isinstance(facts.get("v"), str):
                return None
            if not secrets.compare_digest(str(facts.get("p")), principal_binding(principal_key)):
                log.warning("legacy session presented by a different principal; treated as unknown")
                return None
            key = facts["k"]
        else:
            key = session.shared_key or ""
        binding = principal_binding(principal_key)
        try:
            state = await self.shared.touch(key, binding)
        except SharedUnavailable:
            state = LiveState(session.log_level if session else None,
                              set(session.subscriptions) if session else set())
        else:
            if state is None and session is not None and not session.recorded:
                # Created while Redis was away: recorded now, not ended.
                with contextlib.suppress(SharedUnavailable):
                    await self.shared.create(key, binding, counted=False, per_principal=self.max_per_principal,
                                             total=self.max_total)
                    session.recorded = True
                    state = LiveState(session.log_level, set(session.subscriptions))
            if state is None:
                if session is not None:
                    await self.store.end(session)
                return None
        if session is None:
            caps = facts.get("c") if isinstance(facts.get("c"), dict) else {}
            info = facts.get("i") if isinstance(facts.get("i"), dict) else None
            server_caps = facts.get("s") if isinstance(facts.get("s"), dict) else {}
            session = self._materialize(session_id, key, principal_key, facts["v"], caps, info, server_caps)
            session.initialized = True  # it was, on the replica that answered initialize
        session.log_level = state.log_level
        if state.subscriptions != session.subscriptions:
            session.subscriptions = set(state.subscriptions)
        session.stream_holder = state.stream_holder
        return session

    def _materialize(self, session_id: str, key: str, principal_key: str, protocol_version: str,
                     client_capabilities: dict[str, Any], client_info: dict[str, Any] | None,
                     server_capabilities: dict[str, Any]) -> LegacySession:
        session = LegacySession(session_id, principal_key, protocol_version, client_capabilities, client_info)
        session.server_capabilities = server_capabilities
        session.shared_key = key
        session.stream_tag = self.stream_tag
        # The gateway's requests to the client name this replica (sealed): an answer POSTed
        # to another replica is forwarded here (server.py `_client_response`).
        session.input_id_suffix = "." + self.sealer.seal(INPUT_REQUEST, {"k": key, "o": self.owner_url})
        self.store.adopt(session)
        self._by_key[key] = session_id
        return session

    def owner_of(self, session: LegacySession, request_id: str) -> str | None:
        """The replica (URL) that sent the client the request `request_id` of this session,
        when it is one of ours and not this replica."""
        _, dot, sealed = request_id.partition(".")
        facts = self.sealer.open(INPUT_REQUEST, sealed) if dot else None
        if facts is None or facts.get("k") != session.shared_key or not isinstance(facts.get("o"), str):
            return None
        return None if facts["o"] == self.owner_url else facts["o"]

    async def end(self, session: LegacySession) -> None:
        await self.store.end(session)
        if session.shared_key:
            await self.shared.end(session.shared_key)

    async def set_log_level(self, session: LegacySession, level: str) -> None:
        session.log_level = level
        if session.shared_key:
            await self.shared.set_log_level(session.shared_key, level)

    async def update_subscription(self, session: LegacySession, uri: str, *, subscribe: bool) -> None:
        if session.shared_key:
            await self.shared.update_subscription(session.shared_key, uri, subscribe=subscribe)

    async def stream_opened(self, session: LegacySession) -> None:
        session.stream_holder = self.replica_id
        if session.shared_key:
            await self.shared.claim_stream(session.shared_key)

    async def stream_closed(self, session: LegacySession) -> None:
        if session.shared_key and not session.closed:
            await self.shared.release_stream(session.shared_key)

    def notification_stream_of_another_replica(self, stream_id: str) -> bool:
        """Does `stream_id` name a GET (notification) stream some other replica opened?"""
        tag, dot, rest = stream_id.partition(".")
        return bool(dot) and tag + "." != self.stream_tag and rest.startswith("g-")

    def stream_held_elsewhere(self, session: LegacySession) -> bool:
        return session.stream_holder not in (None, self.replica_id)

    # -- what other replicas say ------------------------------------------------------------------

    def _local(self, key: str) -> LegacySession | None:
        session_id = self._by_key.get(key)
        session = self.store.peek(session_id) if session_id is not None else None
        if session is None or session.shared_key != key:
            self._by_key.pop(key, None)
            return None
        return session

    async def _on_event(self, event: dict[str, Any]) -> None:
        session = self._local(event["k"])
        if session is None:
            return
        kind = event.get("e")
        if kind == "end":
            self._by_key.pop(event["k"], None)
            await self.store.end(session)
        elif kind == "level":
            level = event.get("lvl")
            session.log_level = level if isinstance(level, str) else None
        elif kind == "subs":
            subscriptions = await self.shared.subscriptions(event["k"])
            if subscriptions is not None and subscriptions != session.subscriptions:
                session.subscriptions = subscriptions
                self.on_subscriptions(session)
        elif kind == "stream" and event.get("r") != self.replica_id:
            session.stream_holder = event.get("r") if isinstance(event.get("r"), str) else None
            self.on_stream_elsewhere(session)

    async def _on_resync(self) -> None:
        """Events were lost while the channel was down: catch up on the sessions this replica
        listens for."""
        for key in list(self._by_key):
            session = self._local(key)
            if session is None or session.listener is None:
                continue
            subscriptions = await self.shared.subscriptions(key)
            if subscriptions is not None and subscriptions != session.subscriptions:
                session.subscriptions = subscriptions
                self.on_subscriptions(session)

    async def _renew_active(self) -> None:
        period = min(_HEARTBEAT_MAX_SECONDS, self.shared.idle_ms / 3000)
        while True:
            await asyncio.sleep(period)
            for key in list(self._by_key):
                session = self._local(key)
                if session is None or not session.active:
                    continue
                try:
                    state = await self.shared.touch(key, principal_binding(session.principal_key))
                except SharedUnavailable:
                    break
                if state is None and session.recorded:
                    self._by_key.pop(key, None)
                    await self.store.end(session)


def fleet_from_settings(settings: GatewaySettings, owner_url: str, view: str | None = None
                        ) -> Callable[[SessionStore], FleetSessions] | None:
    """Sessions any replica can serve need a key all replicas share (`security.secret`) and a
    Redis they share (the listen bus's: `GatewaySettings.bus_redis()`). Without
    either, None: each replica keeps its own sessions in memory, as a single replica does.
    `owner_url` is this replica's address for forwarded answers (`Runtime.replica.owner`).
    `view`: the sessions of that view's path (routing/views.py), sealed with a key of their
    own and kept under keys of their own, so that a view's session id means nothing on
    another path (and the other way round)."""
    from gateway.redis_client.plan import plan_of

    secret = settings.security.secret
    redis = settings.bus_redis()
    if not secret or redis is None:
        return None
    plan = plan_of(redis)
    server = settings.server
    share = per_principal_share(server.legacy_max_sessions)
    replica_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    prefix = settings.subscriptions.redis_key_prefix
    key = secret.get_secret_value().encode()
    if view is not None:
        prefix = f"{prefix}:view:{view}"
        key = hashlib.sha256(b"mcp-gateway view sessions\0" + view.encode() + b"\0" + key).digest()
        if owner_url.startswith(("http://", "https://")) and owner_url.endswith(server.path):
            owner_url = owner_url[: len(owner_url) - len(server.path)] + view

    def build(store: SessionStore) -> FleetSessions:
        shared = SharedSessions(plan, prefix=prefix, idle_seconds=server.legacy_session_idle_seconds,
                                replica_id=replica_id)
        return FleetSessions(store, Sealer(key), shared, owner_url=owner_url,
                             max_per_principal=share, max_total=server.legacy_max_sessions)

    return build
