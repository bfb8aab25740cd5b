"""Signals and the order of a stop, for the listeners of one `serve` process.

uvicorn's own handling (Server.capture_signals / handle_exit) stops accepting the moment
SIGTERM arrives and re-raises the signal at the end; a rollout then loses the requests that
load balancers still send until the endpoint removal reaches them. Here, instead:

- SIGTERM: /readyz answers 503 at once (`BackendStates.begin_drain`); the listeners keep
  accepting for `server.drain_delay_seconds`; then the MCP listener stops accepting, its
  long-lived streams end cleanly, in-flight requests finish within
  `server.graceful_shutdown_seconds`, the runtime closes (legacy backend sessions included);
  then the operations listener, then the embedded demo backend; the process exits 0.
- SIGINT (Ctrl+C at a terminal): the same without the drain delay. A second SIGTERM/SIGINT
  cuts the delay short; a third one stops waiting for in-flight requests.
- SIGHUP: `on_reload`, the one reload entry point: it runs every reloader joined with
  `add_reloader` (the configuration, gateway/reload/; others may join, e.g. certificates),
  each on its own so that one failing does not stop the others. Never a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from gateway.observability.logs import SECONDARY_LISTENER
from gateway.readiness import BackendStates

log = logging.getLogger("gateway.lifecycle")


class Listener(uvicorn.Server):
    """A uvicorn server whose signals are the process lifecycle's, not its own.

    `secondary`: a listener beside the MCP one (the operations listener, the embedded demo
    backend). Every uvicorn server of a process logs its start and stop ("Started server
    process [pid]", "Shutting down", ...) through the one shared `uvicorn.error` logger, so
    without this each line was printed once per listener; a secondary listener's lines below
    WARNING are dropped (observability/logs.py `OneBanner`), the MCP listener's are kept."""

    def __init__(self, config: uvicorn.Config, *, secondary: bool = False) -> None:
        super().__init__(config)
        self.secondary = secondary

    async def serve(self, sockets: Any = None) -> None:
        # Each listener is served in a task of its own (run_until_stopped, cli._serve): the
        # mark stays in that task's context, reset when it ends for a caller that awaits here.
        token = SECONDARY_LISTENER.set(self.secondary)
        try:
            await super().serve(sockets)
        finally:
            SECONDARY_LISTENER.reset(token)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Lifecycle:
    def __init__(self, states: BackendStates, *, drain_delay_seconds: float) -> None:
        self.states = states
        self.drain_delay_seconds = drain_delay_seconds
        self.stop_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self._stop_signals = 0
        # Run on SIGHUP, in the order joined: (what it reloads, a callable that starts it).
        self.reloaders: list[tuple[str, Callable[[], object]]] = []
        # Called on the third stop signal: give up waiting for in-flight requests.
        self.on_force: Callable[[], None] = lambda: None

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        loop = loop or asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_hup)

    def uninstall(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        loop = loop or asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        self._stop_signals += 1
        if self._stop_signals == 1:
            # First, and synchronously: the next probe already sees 503.
            self.states.begin_drain()
            self.stop_requested.set()
            if sig == signal.SIGINT:
                self._hurry.set()
            log.info("%s: draining (readiness 503; accepting for %gs more, then a graceful shutdown)",
                     signal.Signals(sig).name, 0 if sig == signal.SIGINT else self.drain_delay_seconds)
        elif self._stop_signals == 2:
            log.info("%s again: ending the drain delay now", signal.Signals(sig).name)
            self._hurry.set()
        else:
            log.warning("%s a third time: no longer waiting for in-flight requests", signal.Signals(sig).name)
            self.on_force()

    async def drain_delay(self) -> None:
        """Keep serving (load balancers are still removing this replica), at most the delay."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), self.drain_delay_seconds)

    def add_reloader(self, what: str, reload: Callable[[], object]) -> None:
        """Join the SIGHUP reload: `reload` is called from the signal handler, in the event
        loop, and must not block (schedule the work as a task)."""
        self.reloaders.append((what, reload))

    def on_reload(self) -> None:
        if not self.reloaders:
            log.warning("SIGHUP: nothing reloads in this process; the gateway keeps running as it is")
            return
        log.info("SIGHUP: reloading %s", ", ".join(what for what, _ in self.reloaders))
        for what, reload in self.reloaders:
            try:
                reload()
            except Exception:  # noqa: BLE001 - one reloader's fault must not stop the others
                log.exception("SIGHUP: reloading %s failed", what)

    def _on_hup(self) -> None:
        self.on_reload()


async def run_until_stopped(lifecycle: Lifecycle, mcp: uvicorn.Server, mcp_sockets: list[Any],
                            ops: uvicorn.Server | None, ops_sockets: list[Any],
                            on_started: Callable[[], None] = lambda: None) -> None:
    """Serve until a stop signal, then stop in the documented order (module docstring)."""
    lifecycle.install()
    lifecycle.on_force = lambda: setattr(mcp, "force_exit", True)
    mcp_task = asyncio.create_task(mcp.serve(sockets=mcp_sockets), name="mcp-listener")
    ops_task: asyncio.Task[None] | None = None
    stop = asyncio.create_task(lifecycle.stop_requested.wait())
    try:
        while not mcp.started and not mcp_task.done() and not stop.done():
            await asyncio.sleep(0.01)
        if ops is not None and not mcp_task.done():
            ops_task = asyncio.create_task(ops.serve(sockets=ops_sockets), name="ops-listener")
            while not ops.started and not ops_task.done():
                await asyncio.sleep(0.01)
        if mcp.started:
            on_started()
        await asyncio.wait({mcp_task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not mcp_task.done():
            await lifecycle.drain_delay()
            mcp.should_exit = True
        await mcp_task
    finally:
        stop.cancel()
        if ops is not None and ops_task is not None:
            ops.should_exit = True
            await ops_task
        lifecycle.uninstall()
