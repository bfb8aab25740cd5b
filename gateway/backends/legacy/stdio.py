"""Initialize-era backends over stdio: one legacy session per process incarnation.

A legacy process is one session for its whole life, so it is initialized declaring every
capability MRTR can carry; a client that lacks the one a backend request needs gets -32021.
Log messages and backend requests carry no request reference on stdio, so they are credited
to the one request in flight that can have sent them, and otherwise dropped (logs, §h.8) or
refused (backend requests, §h.5): `sole_origin`. The process itself is
`backends/stdio_process.py`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gateway.backends.base import Message
from gateway.backends.exchange import Exchange
from gateway.backends.legacy.backend import LegacyBackend
from gateway.backends.legacy.session import LegacySession, NotificationSink
from gateway.backends.stdio_process import StdioProcess, stdio_process
from gateway.protocol import jsonrpc as rpc
from gateway.backends.replica import ReplicaContext
from gateway.settings import BackendSettings

# Every capability MRTR can carry back to a modern client (see the module docstring).
ALL_INPUT_CAPABILITIES: dict[str, Any] = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {}}


class StdioSession(LegacySession):
    """The one legacy session of one process incarnation."""

    def __init__(self, backend: str, capabilities: dict[str, Any], on_notification: NotificationSink,
                 process: StdioProcess, wait: float) -> None:
        super().__init__(backend, capabilities, on_notification)
        self.process = process
        self.wait = wait
        self.generation: int | None = None

    def receive(self, message: Message) -> None:
        origin = None
        if "method" in message and message["method"] != "notifications/progress":
            origin = self.sole_origin(message)
        self.route(message, origin)

    async def _write(self, message: Message) -> None:
        generation = await self.process.write(message, wait=self.wait)
        if self.generation is not None and generation != self.generation:
            # The process restarted since this session was initialized: it knows nothing of it.
            await self.close()
            raise rpc.backend_unavailable(self.backend, "the process restarted")

    async def _initialize(self, message: Message) -> Message:
        holder = Exchange(message["id"], "initialize")
        self._exchanges[holder.backend_id] = holder
        self.generation = await self.process.write(message, wait=self.wait)
        try:
            return await holder.next(self.wait)
        finally:
            self.forget(holder)

    async def _send_request(self, exchange: Exchange, message: Message) -> None:
        await self._write(message)

    async def _send(self, message: Message) -> None:
        await self._write(message)


class LegacyStdioBackend(LegacyBackend):
    def __init__(self, settings: BackendSettings, replica: ReplicaContext | None = None, *,
                 process: StdioProcess | None = None) -> None:
        super().__init__(settings, replica)
        assert settings.command is not None
        self.process = stdio_process(settings, on_message=self._receive, on_exit=self._exited, adopt=process)
        self._session: StdioSession | None = None

    def session_capabilities(self, client_capabilities: dict[str, Any]) -> dict[str, Any]:
        return ALL_INPUT_CAPABILITIES

    def _new_session(self, capabilities: dict[str, Any], headers: Mapping[str, str]) -> LegacySession:
        session = StdioSession(self.name, capabilities, self.listens.deliver, self.process,
                               self.settings.connect_timeout_seconds)
        self._session = session
        self.pool.pinned.add(session)  # never idle-closed: a process is initialized only once
        return session

    async def open_channel(self, session: LegacySession) -> tuple[bool, asyncio.Task[None] | None]:
        return True, None  # stdout carries every notification

    async def start(self) -> None:
        self.process.start()
        await super().start()

    async def aclose(self) -> None:
        await super().aclose()
        await self.process.aclose()

    def _receive(self, message: Message) -> None:
        if self._session is not None:
            self._session.receive(message)

    def _exited(self, reason: str) -> None:
        session, self._session = self._session, None
        if session is not None:
            self.pool.unpin(session)
            session.fail_all(rpc.backend_unavailable(self.name, reason))
            if not session.closed:
                session.spawn(session.close())
            self.listens.end_all()  # their subscriptions died with the process
