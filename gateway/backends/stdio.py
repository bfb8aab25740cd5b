"""Modern (2026-07-28) stdio backends: stateless requests over one supervised process.

Concurrent requests are multiplexed on the one pipe by rewriting ids (and progress tokens)
to process-unique ones. Attribution on a single pipe: responses by id, progress by token,
listen notifications by subscription id; a log message carries no request reference, so it
is credited to the one request in flight that asked for logs, and otherwise dropped. The
process itself is `stdio_process.py`'s.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator

from gateway.backends.base import Backend, Message, Reply
from gateway.backends.exchange import Exchange
from gateway.backends.stdio_process import StdioProcess, stdio_process
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.request import Call
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.stdio")


class ModernStdioBackend(Backend):
    """A 2026-07-28 server on stdio: stateless requests multiplexed by rewritten ids."""

    def __init__(self, settings: BackendSettings, *, process: StdioProcess | None = None) -> None:
        super().__init__(settings)
        assert settings.command is not None
        self.process = stdio_process(settings, on_message=self._receive, on_exit=self._exited, adopt=process)
        self._ids = itertools.count(1)
        self._exchanges: dict[int, Exchange] = {}
        self._by_token: dict[str, Exchange] = {}

    async def start(self) -> None:
        self.process.start()

    async def aclose(self) -> None:
        await self.process.aclose()

    def _receive(self, message: Message) -> None:
        method = message.get("method")
        if method is None:
            exchange = self._exchanges.pop(message.get("id"), None)  # type: ignore[arg-type]
            if exchange is not None:
                self._forget(exchange)
                exchange.put(message)
            return
        params = message.get("params") or {}
        if method == "notifications/progress":
            exchange = self._by_token.get(str(params.get("progressToken")))
        else:
            sub = (params.get("_meta") or {}).get(meta.SUBSCRIPTION_ID)
            if sub is not None:
                exchange = self._exchanges.get(sub)
            elif method == "notifications/cancelled":
                exchange = self._exchanges.get(params.get("requestId"))
            else:
                loggers = [e for e in self._exchanges.values() if e.wants_logs]
                exchange = loggers[0] if len(loggers) == 1 else None
        if exchange is not None and not exchange.done:
            exchange.put(message)

    def _exited(self, reason: str) -> None:
        exchanges, self._exchanges = self._exchanges, {}
        self._by_token.clear()
        for exchange in exchanges.values():
            exchange.fail(rpc.backend_unavailable(self.name, reason))

    def _forget(self, exchange: Exchange) -> None:
        self._exchanges.pop(exchange.backend_id, None)
        if exchange.progress_token is not None:
            self._by_token.pop(exchange.progress_token, None)

    async def send(self, call: Call) -> Reply:
        if call.is_notification:
            return Reply(self.name, status=202)
        exchange = Exchange(next(self._ids), call.method)
        exchange.wants_logs = call.log_level is not None
        params = dict(call.params)
        if meta.PROGRESS_TOKEN in call.meta:
            exchange.progress_token = f"gw-{exchange.backend_id}"
            params["_meta"] = {**call.meta, meta.PROGRESS_TOKEN: exchange.progress_token}
            self._by_token[exchange.progress_token] = exchange
        self._exchanges[exchange.backend_id] = exchange
        try:
            await self.process.write({"jsonrpc": "2.0", "id": exchange.backend_id, "method": call.method,
                                      "params": params}, wait=self.settings.connect_timeout_seconds)
        except rpc.McpError as exc:
            self._forget(exchange)
            raise exc.with_id(call.id)
        if call.stream_only:
            return Reply(self.name, stream=self._relay(call, exchange))
        # The first message is awaited here, not in the stream: a process that dies or stays
        # silent before saying anything fails the call from `send`, where the retries see it
        # (an idempotent read goes to another attempt, of another instance with `instances`),
        # and a lone response is a plain JSON answer.
        try:
            first = await self._first(call, exchange)
        except BaseException:
            await self._abandon(exchange)
            raise
        if "method" not in first:
            message = {**first, "id": call.id}
            return Reply(self.name, status=rpc.http_status_of(message), message=message)
        return Reply(self.name, stream=self._relay(call, exchange, first))

    async def _first(self, call: Call, exchange: Exchange) -> Message:
        try:
            return await exchange.next_by(exchange.started + self.settings.max_call_seconds,
                                          self.settings.timeout_seconds, functools.partial(self.overdue, call))
        except rpc.McpError as exc:
            exc.data = exc.data or {"backend": self.name}
            raise exc.with_id(call.id) from None

    async def _abandon(self, exchange: Exchange) -> None:
        """Stop waiting for `exchange`, and tell the process (STDIO §Cancellation: no stream
        to close, so say it)."""
        if exchange.done:
            return
        self._forget(exchange)
        exchange.done = True
        with contextlib.suppress(rpc.McpError):
            await self.process.write(rpc.notification(
                "notifications/cancelled", {"requestId": exchange.backend_id, "reason": "client went away"}),
                wait=0.5)

    async def _relay(self, call: Call, exchange: Exchange, first: Message | None = None) -> AsyncIterator[Message]:
        """The exchange's messages for the client (`first` already read). A call waits
        `timeout_seconds` per message and ends with -31002 at `max_call_seconds` after it was
        sent, however often the process sends progress (SHTTP: senders SHOULD enforce a
        maximum); a listen has neither."""
        deadline = None if call.stream_only else (
            exchange.started + self.settings.max_call_seconds)
        overdue = functools.partial(self.overdue, call)
        try:
            while True:
                try:
                    if first is not None:
                        message, first = first, None
                    elif deadline is None or exchange.done:
                        # A listen; or the answer is in (queued, with what came before it):
                        # nothing is waited for, so a slow reader does not make it overdue.
                        message = await exchange.next(None)
                    else:
                        # Timed around the read only, never across a yield.
                        message = await exchange.next_by(deadline, self.settings.timeout_seconds, overdue)
                except rpc.McpError as exc:
                    exc.data = exc.data or {"backend": self.name}
                    raise exc.with_id(call.id) from None
                method = message.get("method")
                if method is None:
                    yield {**message, "id": call.id}
                    return
                params = message.get("params") or {}
                if method == "notifications/cancelled" and params.get("requestId") == exchange.backend_id:
                    return  # STDIO: the server tore the listen down
                if method == "notifications/progress":
                    message = {**message, "params": {**params, "progressToken": call.meta.get(meta.PROGRESS_TOKEN)}}
                elif meta.SUBSCRIPTION_ID in (params.get("_meta") or {}):
                    message = {**message, "params": {**params, "_meta": {**params["_meta"],
                                                                         meta.SUBSCRIPTION_ID: call.id}}}
                yield message
        finally:
            await self._abandon(exchange)
