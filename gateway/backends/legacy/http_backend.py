"""The legacy Streamable HTTP backend: sessions from http.py, its GET stream for listens."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gateway.backends import http1, tls
from gateway.backends.legacy.backend import LegacyBackend
from gateway.backends.legacy.http import HttpSession, NoListenStream
from gateway.backends.legacy.session import LegacySession, SessionExpired
from gateway.backends.replica import ReplicaContext
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.legacy.http")


class LegacyHttpBackend(LegacyBackend):
    """A legacy Streamable HTTP backend (2025-03-26 … 2025-11-25)."""

    def __init__(self, settings: BackendSettings, replica: ReplicaContext | None = None) -> None:
        super().__init__(settings, replica)
        assert settings.url is not None
        self.url = settings.url
        # POSTs and DELETE over the client of modern backends; the GET stream, which lives as
        # long as the session, over a pool of its own so that it never holds a POST's slot.
        context = tls.client_context(settings.tls)
        self._posts = http1.for_backend(settings, context)
        self._client = http1.for_backend(settings, context)

    async def aclose(self) -> None:
        await super().aclose()
        await self._client.aclose()
        await self._posts.aclose()

    def _new_session(self, capabilities: dict[str, Any], headers: Mapping[str, str]) -> HttpSession:
        return HttpSession(self.name, capabilities, self.listens.deliver, client=self._client, posts=self._posts, url=self.url,
                           headers=headers, timeout=self.settings.timeout_seconds,
                           connect_timeout=self.settings.connect_timeout_seconds)

    async def open_channel(self, session: LegacySession) -> tuple[bool, asyncio.Task[None] | None]:
        assert isinstance(session, HttpSession)
        connected = asyncio.Event()
        holder = asyncio.ensure_future(self._hold_get_stream(session, connected))
        waiter = asyncio.ensure_future(connected.wait())
        await asyncio.wait({holder, waiter}, timeout=self.settings.connect_timeout_seconds,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if holder.done():
            exc = holder.exception()
            if not isinstance(exc, NoListenStream):
                log.info("backend %s: no GET stream: %r", self.name, exc)
            return False, None
        return True, holder

    async def _hold_get_stream(self, session: HttpSession, connected: asyncio.Event) -> None:
        """The GET stream of the listen session, re-opened on a renewed session (§h.3)."""
        while True:
            try:
                await session.listen_stream(connected)
            except SessionExpired:
                session = await self.pool.renew(session)  # type: ignore[assignment]
                continue
            current = self.listens.session
            if current is session and session.closed:
                # Closed by a renewal still under way (a request met the 404 first): wait for the
                # new session instead of returning, which left the listeners deaf for good.
                current = await self.pool.renew(session)
            if not isinstance(current, HttpSession) or current is session or current.closed:
                return
            session = current
