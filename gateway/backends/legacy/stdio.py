"""stdio backends of both eras: a subprocess speaking newline-delimited JSON-RPC (STDIO).

`StdioProcess` owns the subprocess: it starts it, reads its stdout line by line, sends its
stderr to the gateway's log, and restarts it with exponential backoff when it dies (STDIO
§Unexpected Termination: in-flight requests are lost and fail with a gateway error).

Both eras multiplex concurrent requests on the one pipe by rewriting ids (and progress
tokens) to process-unique ones. Era detection is the HTTP one (§h.1): `server/discover`
first; a legacy process answers it with an error, or not at all, and is then initialized.

Attribution on a single pipe: responses by id, progress by token, listen notifications by
subscription id. Log messages and legacy backend requests carry no request reference on
stdio, so they are credited to the one request in flight that can have sent them, and
otherwise dropped (logs, §h.8) or refused (backend requests, §h.5): `sole_origin`. A legacy process is one
session for its whole life, so it is initialized declaring every capability MRTR can carry;
a client that lacks the one a backend request needs gets -32021.
"""

from __future__ import annotations

import asyncio
import functools
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.backends.base import Backend, Message, Reply, internal_call
from gateway.backends.legacy.backend import LegacyBackend
from gateway.backends.legacy.detect import Era, verdict
from gateway.backends.legacy.session import Exchange, LegacySession, NotificationSink
from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.request import Call
from gateway.settings import BackendSettings, GatewaySettings

log = logging.getLogger("gateway.backends.stdio")

_LINE_LIMIT = 32 * 1024 * 1024
# What a stdio backend inherits from the gateway's environment. Nothing else passes: the
# gateway's own environment holds its secrets (MCP_GATEWAY_SECURITY__SECRET signs MRTR state,
# an HS256 auth secret mints tokens), and a subprocess is often third-party code (SBP:
# stdio-spawning proxies SHOULD sandbox). `backends[].env` and `inherit_env` add to this.
_BASE_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")


def child_environment(settings: BackendSettings) -> dict[str, str]:
    names = (*_BASE_ENVIRONMENT, *settings.inherit_env)
    inherited = {name: os.environ[name] for name in names if name in os.environ}
    return {**inherited, **settings.env}
_MAX_BACKOFF = 30.0
# A process that ran this long before dying resets the backoff.
_STABLE_SECONDS = 30.0
# Every capability MRTR can carry back to a modern client (see the module docstring).
ALL_INPUT_CAPABILITIES: dict[str, Any] = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {}}


class StdioProcess:
    """One supervised subprocess. `on_message` sees every stdout message, `on_exit` each death."""

    def __init__(self, name: str, command: tuple[str, ...], env: dict[str, str], *, backoff: float,
                 on_message: Callable[[Message], None], on_exit: Callable[[str], None]) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.backoff = backoff
        self.on_message = on_message
        self.on_exit = on_exit
        self.generation = 0  # bumped at each (re)start
        self._proc: asyncio.subprocess.Process | None = None
        self._started = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._write_lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def start(self) -> None:
        if self._supervisor is None:
            self._supervisor = asyncio.ensure_future(self._supervise())

    async def write(self, message: Message, *, wait: float) -> int:
        """Write one message; returns the generation it went to."""
        self.start()
        try:
            await asyncio.wait_for(self._started.wait(), wait)
        except TimeoutError:
            raise rpc.backend_unavailable(self.name, f"process {self.command[0]!r} is not running") from None
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        async with self._write_lock:
            try:
                proc.stdin.write(orjson.dumps(message) + b"\n")
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise rpc.backend_unavailable(self.name, f"process stdin closed: {exc}") from None
        return self.generation

    async def aclose(self) -> None:
        self._closing = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            # STDIO §Shutdown: close stdin, wait, then SIGTERM, then SIGKILL.
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 2.0)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor

    async def _supervise(self) -> None:
        delay = self.backoff
        while not self._closing:
            started_at = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=self.env, limit=_LINE_LIMIT)
            except OSError as exc:
                log.error("backend %s: cannot start %r: %s", self.name, self.command[0], exc)
                reason = f"cannot start {self.command[0]!r}: {exc}"
            else:
                self._proc = proc
                self.generation += 1
                if self.generation > 1:
                    metrics.STDIO_RESTARTS.labels(self.name).inc()
                self._started.set()
                log.info("backend %s: started %r (pid %d)", self.name, self.command[0], proc.pid)
                stderr = asyncio.ensure_future(self._drain_stderr(proc))
                await self._read_stdout(proc)
                code = await proc.wait()
                self._started.clear()
                await stderr
                reason = f"process exited with code {code}"
                if not self._closing:
                    log.warning("backend %s: %s", self.name, reason)
            self.on_exit(reason)
            if self._closing:
                return
            if time.monotonic() - started_at > _STABLE_SECONDS:
                delay = self.backoff
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)

    async def _read_stdout(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                log.error("backend %s: a stdout line exceeded %d bytes; stopping the process", self.name, _LINE_LIMIT)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                return
            if not line:
                return
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.warning("backend %s: non-JSON line on stdout dropped: %r", self.name, line[:200])
                continue
            for item in message if isinstance(message, list) else (message,):
                if isinstance(item, dict):
                    try:
                        self.on_message(item)
                    except Exception:
                        log.exception("backend %s: handling a message failed", self.name)

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while True:
            try:
                line = await proc.stderr.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue
            if not line:
                return
            log.info("backend %s stderr: %s", self.name, line.decode(errors="replace").rstrip())


def stdio_process(settings: BackendSettings, *, on_message: Callable[[Message], None],
                  on_exit: Callable[[str], None], adopt: StdioProcess | None = None) -> StdioProcess:
    """The process `settings.command` names, heard through `on_message` and `on_exit`: `adopt`
    when given (the era probe's, already running), else a new one in the environment it may see."""
    if adopt is not None:
        adopt.on_message, adopt.on_exit = on_message, on_exit
        return adopt
    return StdioProcess(settings.name, settings.command or (), child_environment(settings),
                        backoff=settings.restart_backoff_seconds, on_message=on_message, on_exit=on_exit)


# -- legacy over stdio -------------------------------------------------------------------


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
    def __init__(self, settings: BackendSettings, gateway: GatewaySettings | None = None, *,
                 process: StdioProcess | None = None) -> None:
        super().__init__(settings, gateway)
        assert settings.command is not None
        self.process = stdio_process(settings, on_message=self._receive, on_exit=self._exited, adopt=process)
        self._session: StdioSession | None = None

    def session_capabilities(self, client_capabilities: dict[str, Any]) -> dict[str, Any]:
        return ALL_INPUT_CAPABILITIES

    def _new_session(self, capabilities: dict[str, Any]) -> LegacySession:
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


# -- modern over stdio -------------------------------------------------------------------


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
        return Reply(self.name, stream=self._relay(call, exchange))

    async def _relay(self, call: Call, exchange: Exchange) -> AsyncIterator[Message]:
        """The exchange's messages for the client. A call waits `timeout_seconds` per message
        and ends with -31002 at `max_call_seconds` after it was sent, however often the process
        sends progress (SHTTP: senders SHOULD enforce a maximum); a listen has neither."""
        deadline = None if call.method == "subscriptions/listen" else (
            exchange.started + self.settings.max_call_seconds)
        overdue = functools.partial(self.overdue, call)
        try:
            while True:
                try:
                    if deadline is None or exchange.done:
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
            if not exchange.done:
                self._forget(exchange)
                exchange.done = True
                with contextlib.suppress(rpc.McpError):
                    # STDIO §Cancellation: no stream to close, so say it.
                    await self.process.write(rpc.notification(
                        "notifications/cancelled", {"requestId": exchange.backend_id, "reason": "client went away"}),
                        wait=0.5)


# -- era detection over stdio ------------------------------------------------------------


class StdioAutoProbe:
    """Probes a process with server/discover (§h.1) and hands it over to the backend of its
    era: the process is started once and kept, whatever the verdict."""

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self._answer: asyncio.Future[Message] | None = None
        self.process = stdio_process(settings, on_message=self._probe_message, on_exit=lambda reason: None)

    def _probe_message(self, message: Message) -> None:
        if self._answer is not None and not self._answer.done() and message.get("id") == "gw-era-probe":
            self._answer.set_result(message)

    async def probe(self) -> Era:
        self._answer = asyncio.get_running_loop().create_future()
        call = internal_call("server/discover", request_id="gw-era-probe")
        await self.process.write(orjson.loads(call.wire_body()), wait=self.settings.connect_timeout_seconds)
        try:
            message = await asyncio.wait_for(self._answer, self.settings.connect_timeout_seconds)
        except TimeoutError:
            return "legacy"
        return verdict(message)

    def make(self, era: Era, gateway: GatewaySettings | None) -> Backend:
        if era == "modern":
            return ModernStdioBackend(self.settings, process=self.process)
        return LegacyStdioBackend(self.settings, gateway, process=self.process)
