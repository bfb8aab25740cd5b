"""The legacy Streamable HTTP backend: sessions from http.py, its GET stream for listens."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gateway.backends import http1, tls
from gateway.backends.endpoints import HttpTarget, choose
from gateway.backends.health import EndpointHealth
from gateway.backends.legacy.backend import LegacyBackend
from gateway.backends.legacy.http import HttpSession, NoListenStream
from gateway.backends.legacy.session import LegacySession, SessionExpired
from gateway.backends.replica import ReplicaContext
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.legacy.http")


def _log_move_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("backend session could not move off an ejected endpoint: %s", task.exception())


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
        # Sessions on each endpoint (several endpoints only): what a new session's placement
        # compares.
        self._placed: dict[EndpointHealth, int] = {}

    async def aclose(self) -> None:
        await super().aclose()
        await self._client.aclose()
        await self._posts.aclose()

    def _new_session(self, capabilities: dict[str, Any], headers: Mapping[str, str]) -> HttpSession:
        endpoint = self._endpoint_for_session() if self.spread else None
        target = HttpTarget(self.url) if endpoint is None else endpoint.target
        session = HttpSession(self.name, capabilities, self.listens.deliver, client=self._client, posts=self._posts,
                              url=target.url, headers=headers, timeout=self.settings.timeout_seconds,
                              connect_timeout=self.settings.connect_timeout_seconds)
        session.address = target.address
        session.endpoint = endpoint
        if endpoint is not None:
            # Counted from its creation (handshakes under way included, or sessions opened at
            # once would all see empty endpoints) to its end.
            self._placed[endpoint] = self._placed.get(endpoint, 0) + 1
            session.on_terminate = self._unplace
            session.replace_endpoint = self._replace_endpoint
        return session

    def _replace_endpoint(self, session: HttpSession) -> bool:
        """Another endpoint for a session whose initialize could not reach its own: one
        without a failure, or False when every endpoint has one (the error then stands)."""
        endpoint = self._endpoint_for_session()
        if endpoint is session.endpoint or endpoint.failures > 0:
            return False
        self._unplace(session)
        self._placed[endpoint] = self._placed.get(endpoint, 0) + 1
        session.endpoint, session.url, session.address = endpoint, endpoint.target.url, endpoint.target.address
        return True

    def _unplace(self, session: HttpSession) -> None:
        endpoint = session.endpoint
        if endpoint is not None:
            left = self._placed[endpoint] - 1
            if left > 0:
                self._placed[endpoint] = left
            else:
                del self._placed[endpoint]

    async def start(self) -> None:
        await super().start()
        # Registered here, not at construction: an `era: auto` backend hands its delegate its
        # own health before starting it (detect.AutoBackend).
        if self.spread and self._endpoint_ejected not in self.health.ejection_listeners:
            self.health.ejection_listeners.append(self._endpoint_ejected)

    def _endpoint_ejected(self, endpoint: EndpointHealth) -> None:
        """The sessions on an ejected endpoint move: later calls meet their renewals, created on
        an endpoint in rotation (the pool tells the listens, pool.on_renew)."""
        for session in self.pool.sessions():
            if isinstance(session, HttpSession) and session.endpoint is endpoint and not session.closed:
                self._move(session)

    def _move(self, session: HttpSession) -> None:
        task = asyncio.ensure_future(self.pool.renew(session))
        task.add_done_callback(_log_move_failure)

    def _endpoint_for_session(self) -> EndpointHealth:
        """Where a new session is created (and stays): power of two choices on the sessions
        each endpoint holds, among endpoints in rotation, preferring those whose last request
        did not fail (a session that moves away from an unreachable endpoint must not be
        placed on it again before it is ejected)."""
        endpoints = self.health.endpoints
        failing = [e for e in endpoints if e.failures > 0]
        placed = self._placed
        load = lambda e: placed.get(e, 0)  # noqa: E731
        endpoint = (choose(endpoints, failing, load) if len(failing) < len(endpoints) else None) or choose(
            endpoints, (), load)
        if endpoint is None:
            raise self.health.unavailable()
        return endpoint

    async def check_endpoint(self, index: int) -> None:
        """A `ping` on a pooled session at that endpoint, or where it holds none, an initialize
        on a session of its own, ended at once (a canary, when configured, runs through the
        backend as a whole)."""
        if not self.spread or self.settings.health.canary is not None:
            await self.health_check()
            return
        endpoint = self.health.endpoints[index]
        pooled = next((s for s in self.pool.sessions()
                       if isinstance(s, HttpSession) and s.endpoint is endpoint and not s.closed), None)
        if pooled is not None:
            try:
                exchange = await pooled.request("ping", {})
                # Any answer passes, an error one too (a server without `ping` answers
                # -32601): as for calls (health.py), what fails is no answer or a refusal.
                await exchange.next(self.settings.health.check_timeout_seconds)
            except SessionExpired:
                # The endpoint forgot the session (it restarted), or cannot be reached: the
                # session is renewed, and the endpoint judged by an initialize of its own.
                self._move(pooled)
            else:
                return
        target = endpoint.target
        session = HttpSession(self.name, self.session_capabilities({}), lambda *_: None, client=self._client,
                              posts=self._posts, url=target.url,
                              headers=self.credentials.session_headers(""), timeout=self.settings.timeout_seconds,
                              connect_timeout=self.settings.connect_timeout_seconds)
        session.address = target.address
        try:
            await session.open()
        finally:
            await session.close()

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
