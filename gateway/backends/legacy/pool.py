"""Initialized legacy sessions, kept warm and shared (digest §h.3).

One session per client-capability set (the capabilities are negotiated once per legacy
session but sent per request by modern clients, so clients that declare different ones
cannot share a session). The set is reduced to a handful of flags first
(`translate.session_capabilities`), so clients cannot mint sessions by varying what they
declare. Sessions are also keyed by their `owner`, whose upstream credential they carry: ""
for the gateway's own (static headers, a client-credentials token), a label of the
principal for a token-exchange backend, so that two users' exchanged tokens never share a
session (backends/credentials.py). A session serves any number of
concurrent requests: a warm modern request costs one upstream POST.

The pool is bounded hard: `size` counts every session, busy and pinned ones included. A call
that needs a new session when all are busy waits up to `wait_seconds` for one to go idle
(and be closed to make room), then fails with -31004 naming the backend and the setting.
Concurrent first uses of a key share one handshake (single flight), and nothing per key
outlives its session.

Expiry: a 404 on a request carrying the session id means the backend forgot the session and
did not process the request, so the pool re-initializes and replays it once (L-TR §Session
Management). Idle sessions, and the least recently used idle one when room is needed, are
closed with DELETE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.backends.exchange import Exchange
from gateway.backends.legacy.session import LegacySession, SessionExpired
from gateway.backends.legacy.translate import pool_key
from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc

log = logging.getLogger("gateway.backends.legacy.pool")


def _key(capabilities: dict[str, Any], owner: str) -> str:
    key = pool_key(capabilities)
    return f"{key}|{owner}" if owner else key

# (client capabilities, owner) -> a fresh session carrying the owner's credential.
SessionFactory = Callable[[dict[str, Any], str], LegacySession]
RenewHook = Callable[[LegacySession, LegacySession], None]


class SessionPool:
    def __init__(self, backend: str, factory: SessionFactory, *, size: int, idle_seconds: float,
                 wait_seconds: float = 5.0) -> None:
        self.backend = backend
        self.factory = factory
        self.size = size
        self.idle_seconds = idle_seconds
        self.wait_seconds = wait_seconds
        self._sessions: dict[str, LegacySession] = {}
        # Handshakes in progress, one per key; each holds a place in `size`.
        self._opening: dict[str, asyncio.Future[LegacySession]] = {}
        # Set whenever a session goes idle or leaves: a caller waiting for room looks again.
        self._room = asyncio.Event()
        # Sessions something long-lived depends on (the listen stream) are never idle.
        self.pinned: set[LegacySession] = set()
        self.on_renew: list[RenewHook] = []
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.ensure_future(self._reap())

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for opening in list(self._opening.values()):
            opening.cancel()
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    def sessions(self) -> list[LegacySession]:
        return list(self._sessions.values())

    def unpin(self, session: LegacySession) -> None:
        self.pinned.discard(session)
        self._room.set()

    async def get(self, capabilities: dict[str, Any], owner: str = "") -> LegacySession:
        key = _key(capabilities, owner)
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            return session
        return await self._single_flight(key, capabilities, owner)

    async def _single_flight(self, key: str, capabilities: dict[str, Any], owner: str, *,
                             replaces: LegacySession | None = None, pin: bool = False) -> LegacySession:
        """The session being opened for `key`, opening it if nobody is. A caller that gives
        up (cancelled) does not abort the handshake the others wait for."""
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(self._open(key, capabilities, owner, replaces, pin))
            self._opening[key] = opening
            opening.add_done_callback(lambda done, key=key: self._opened(key, done))
        return await asyncio.shield(opening)

    def _opened(self, key: str, done: asyncio.Future[LegacySession]) -> None:
        if self._opening.get(key) is done:
            del self._opening[key]
        if not done.cancelled() and done.exception() is not None:
            self._room.set()  # the place it held is free again

    async def _open(self, key: str, capabilities: dict[str, Any], owner: str, replaces: LegacySession | None,
                    pin: bool) -> LegacySession:
        await self._make_room()
        session = self.factory(capabilities, owner)
        session.owner = owner
        try:
            await session.open()
        except SessionExpired:
            session.mark_expired()  # the backend does not know it: nothing to end
            await session.close()
            raise rpc.backend_protocol_error(self.backend, "404 on initialize: not a Streamable HTTP endpoint") from None
        except Exception:
            # A handshake that failed after the backend minted a session id (e.g. its
            # notifications/initialized refused) leaves a session nobody will use: end it (L-TR
            # §Session Management: SHOULD DELETE), or every failed handshake leaks one upstream.
            await session.close()
            raise
        session.on_idle = self._room.set
        self._sessions[key] = session
        log.info("backend %s: legacy session opened (version %s, capabilities %s)", self.backend, session.version,
                 key)
        if pin:
            self.pinned.add(session)
        if replaces is not None:
            for hook in self.on_renew:
                hook(replaces, session)
        return session

    async def _make_room(self) -> None:
        """Close idle sessions until this handshake fits in `size`, waiting a little for a
        busy one to finish; -31004 when none does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        # `_opening` already holds this handshake's own place.
        while len(self._sessions) + len(self._opening) > self.size:
            victim = self._evictable()
            if victim is not None:
                self._drop(victim)
                await victim.close()
                continue
            self._room.clear()
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(self._room.wait(), remaining)
            except TimeoutError:
                raise rpc.gateway_overloaded(
                    f"Backend {self.backend!r}: all {self.size} legacy sessions are busy and none became free within "
                    f"{self.wait_seconds:g}s (backends[].session_pool_size)",
                    limit="backends[].session_pool_size", data={"backend": self.backend, "max": self.size},
                ) from None

    def _evictable(self) -> LegacySession | None:
        """A closed session, else the least recently used idle, unpinned one."""
        candidates = [s for s in self._sessions.values()
                      if s.closed or (s.in_flight == 0 and s not in self.pinned)]
        return min(candidates, key=lambda s: (not s.closed, s.last_used), default=None)

    async def renew(self, stale: LegacySession) -> LegacySession:
        """Replace a session the backend expired (unless someone already did)."""
        key = _key(stale.capabilities, stale.owner)
        current = self._sessions.get(key)
        if current is not None and current is not stale and not current.closed:
            return current
        if key not in self._opening:
            pinned = stale in self.pinned
            if current is stale:
                self._drop(stale)
            stale.mark_expired()
            await stale.close()
            log.info("backend %s: legacy session expired; re-initializing", self.backend)
            if key not in self._opening:  # nobody started the replacement while we closed
                return await self._single_flight(key, stale.capabilities, stale.owner, replaces=stale, pin=pinned)
        return await self._single_flight(key, stale.capabilities, stale.owner)

    async def request(self, capabilities: dict[str, Any], method: str, params: dict[str, Any], *,
                      progress: bool = False, wants_logs: bool = False, owner: str = ""
                      ) -> tuple[LegacySession, Exchange]:
        session = await self.get(capabilities, owner)
        try:
            return session, await session.request(method, params, progress=progress, wants_logs=wants_logs)
        except SessionExpired:
            pass
        session = await self.renew(session)
        try:
            return session, await session.request(method, params, progress=progress, wants_logs=wants_logs)
        except SessionExpired:
            raise rpc.backend_unavailable(self.backend, "the backend expired a brand-new session") from None

    def _drop(self, session: LegacySession) -> None:
        for key, candidate in list(self._sessions.items()):
            if candidate is session:
                del self._sessions[key]
        self.pinned.discard(session)
        session.on_idle = None
        self._room.set()

    async def _reap(self) -> None:
        interval = max(0.05, min(self.idle_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if (session.in_flight == 0 and session not in self.pinned
                        and now - session.last_used > self.idle_seconds):
                    self._drop(session)
                    metrics.BACKEND_SESSIONS_EXPIRED.labels(self.backend).inc()
                    log.info("backend %s: closing idle legacy session", self.backend)
                    with contextlib.suppress(Exception):
                        await session.close()
