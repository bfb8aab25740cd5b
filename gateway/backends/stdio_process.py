"""The stdio process supervisor shared by both eras: a subprocess speaking newline-delimited
JSON-RPC (STDIO).

`StdioProcess` owns the subprocess: it starts it, reads its stdout line by line, sends its
stderr to the gateway's log, and restarts it with exponential backoff when it dies (STDIO
§Unexpected Termination: in-flight requests are lost and fail with a gateway error). What is
said over the pipe is the backend's concern: `stdio.py` (modern), `legacy/stdio.py`
(initialize-era), and the era probe in `detect.py`, whose process the chosen backend adopts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

import orjson

from gateway.backends.base import Message
from gateway.backends.errors import mark_never_sent, upstream_errors
from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc
from gateway.settings import BackendSettings

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


# (running?, what happened) -> None: told of each start and each death (stdio_instances.py).
ProcessWatcher = Callable[[bool, str], None]


class StdioProcess:
    """One supervised subprocess. `on_message` sees every stdout message, `on_exit` each death
    (the backend that speaks to it); `watchers` each start and each death too."""

    def __init__(self, name: str, command: tuple[str, ...], env: dict[str, str], *, backoff: float,
                 on_message: Callable[[Message], None], on_exit: Callable[[str], None]) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.backoff = backoff
        self.on_message = on_message
        self.on_exit = on_exit
        self.generation = 0  # bumped at each (re)start
        self.watchers: list[ProcessWatcher] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._started = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._write_lock = asyncio.Lock()
        # The running process's stdout has ended (it is exiting): no more writes to it.
        self._stdout_ended = False

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
            raise mark_never_sent(
                rpc.backend_unavailable(self.name, f"process {self.command[0]!r} is not running")) from None
        async with self._write_lock:
            proc = self._proc
            if proc is None or proc.returncode is not None or not self._started.is_set() or self._stdout_ended:
                # It exited while this caller waited (its death may already have failed the
                # request's exchange): nothing was written, so it may go elsewhere.
                raise mark_never_sent(rpc.backend_unavailable(
                    self.name, f"process {self.command[0]!r} exited before the request was written"))
            assert proc.stdin is not None
            with upstream_errors(self.name, timeout=wait):
                try:
                    proc.stdin.write(orjson.dumps(message) + b"\n")
                    await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError) as exc:
                    # The pipe had no reader left (EPIPE), or the transport had already lost it
                    # and dropped the line: nobody can have read this request (at most a
                    # fragment of it, never a whole line), so it may go to another process
                    # whatever its method (backends/retry.py).
                    raise mark_never_sent(rpc.backend_unavailable(
                        self.name, f"process {self.command[0]!r} closed its stdin before the request was "
                                   f"written ({type(exc).__name__})")) from None
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
                self._stdout_ended = False
                self.generation += 1
                if self.generation > 1:  # a restart, of any stdio process (modern or legacy)
                    metrics.STDIO_RESTARTS.labels(self.name).inc()
                self._started.set()
                log.info("backend %s: started %r (pid %d)", self.name, self.command[0], proc.pid)
                self._tell(True, f"started (pid {proc.pid})")
                stderr = asyncio.ensure_future(self._drain_stderr(proc))
                await self._read_stdout(proc)
                self._stdout_ended = True
                code = await proc.wait()
                self._started.clear()
                await stderr
                reason = f"process exited with code {code}"
                if not self._closing:
                    log.warning("backend %s: %s", self.name, reason)
            self.on_exit(reason)
            self._tell(False, reason)
            if self._closing:
                return
            if time.monotonic() - started_at > _STABLE_SECONDS:
                delay = self.backoff
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)

    def _tell(self, running: bool, what: str) -> None:
        for watcher in self.watchers:
            try:
                watcher(running, what)
            except Exception:
                log.exception("backend %s: a process watcher failed", self.name)

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
