"""Initialized legacy sessions, kept warm and shared (digest §h.3).

One session per client-capability set (the capabilities are negotiated once per legacy
session but sent per request by modern clients, so clients that declare different ones
cannot share a session). The upstream credential is the backend's static configuration, the
same for every session of a backend, so it needs no key of its own. A session serves any
number of concurrent requests: a warm modern request costs one upstream POST.

Expiry: a 404 on a request carrying the session id means the backend forgot the session and
did not process the request, so the pool re-initializes and replays it once (L-TR §Session
Management). Idle sessions, and the least recently used beyond the pool size, are closed with
DELETE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.backends.legacy.session import Exchange, LegacySession, SessionExpired
from gateway.backends.legacy.translate import pool_key
from gateway.protocol import jsonrpc as rpc

log = logging.getLogger("gateway.backends.legacy.pool")

SessionFactory = Callable[[dict[str, Any]], LegacySession]
RenewHook = Callable[[LegacySession, LegacySession], None]


class SessionPool:
    def __init__(self, backend: str, factory: SessionFactory, *, size: int, idle_seconds: float) -> None:
        self.backend = backend
        self.factory = factory
        self.size = size
        self.idle_seconds = idle_seconds
        self._sessions: dict[str, LegacySession] = {}
        self._locks: dict[str, asyncio.Lock] = {}
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
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    def sessions(self) -> list[LegacySession]:
        return list(self._sessions.values())

    async def get(self, capabilities: dict[str, Any]) -> LegacySession:
        key = pool_key(capabilities)
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            return session
        async with self._locks.setdefault(key, asyncio.Lock()):
            session = self._sessions.get(key)
            if session is not None and not session.closed:
                return session
            return await self._open(key, capabilities)

    async def _open(self, key: str, capabilities: dict[str, Any]) -> LegacySession:
        session = self.factory(capabilities)
        try:
            await session.open()
        except SessionExpired:
            raise rpc.backend_protocol_error(self.backend, "404 on initialize: not a Streamable HTTP endpoint") from None
        self._sessions[key] = session
        await self._evict_beyond_size()
        log.info("backend %s: legacy session opened (version %s, capabilities %s)", self.backend, session.version,
                 key)
        return session

    async def renew(self, stale: LegacySession) -> LegacySession:
        """Replace a session the backend expired (unless someone already did)."""
        key = pool_key(stale.capabilities)
        async with self._locks.setdefault(key, asyncio.Lock()):
            current = self._sessions.get(key)
            if current is not None and current is not stale and not current.closed:
                return current
            self._sessions.pop(key, None)
            stale.mark_expired()
            await stale.close()
            log.info("backend %s: legacy session expired; re-initializing", self.backend)
            fresh = await self._open(key, stale.capabilities)
        if stale in self.pinned:
            self.pinned.discard(stale)
            self.pinned.add(fresh)
        for hook in self.on_renew:
            hook(stale, fresh)
        return fresh

    async def request(self, capabilities: dict[str, Any], method: str, params: dict[str, Any], *,
                      progress: bool = False, wants_logs: bool = False) -> tuple[LegacySession, Exchange]:
        session = await self.get(capabilities)
        try:
            return session, await session.request(method, params, progress=progress, wants_logs=wants_logs)
        except SessionExpired:
            pass
        session = await self.renew(session)
        try:
            return session, await session.request(method, params, progress=progress, wants_logs=wants_logs)
        except SessionExpired:
            raise rpc.backend_unavailable(self.backend, "the backend expired a brand-new session") from None

    async def _evict_beyond_size(self) -> None:
        if len(self._sessions) <= self.size:
            return
        idle = sorted((s for s in self._sessions.values() if s.in_flight == 0 and s not in self.pinned),
                      key=lambda s: s.last_used)
        for session in idle[: len(self._sessions) - self.size]:
            self._drop(session)
            await session.close()

    def _drop(self, session: LegacySession) -> None:
        for key, candidate in list(self._sessions.items()):
            if candidate is session:
                del self._sessions[key]

    async def _reap(self) -> None:
        interval = max(0.05, min(self.idle_seconds / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if (session.in_flight == 0 and session not in self.pinned
                        and now - session.last_used > self.idle_seconds):
                    self._drop(session)
                    log.info("backend %s: closing idle legacy session", self.backend)
                    with contextlib.suppress(Exception):
                        await session.close()
