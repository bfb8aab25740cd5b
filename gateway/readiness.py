"""Readiness: what /readyz answers, kept by background checks and read by the probe at once.

A probe that waited on backends would take as long as the slowest one (the kubelet's 1 s
timeout then marks every replica NotReady together). Here each backend has a small task that
refreshes its discovery every `server.readiness_interval_seconds` and records the outcome;
the probe only reads the record. `BackendStates` is the seam for per-backend health: anything
that learns a backend's state (these checks, later ejection on call failures) calls `record`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc

if TYPE_CHECKING:
    from gateway.backends.base import Backend

log = logging.getLogger("gateway.readiness")

Requirement = Literal["any", "all", "none"] | int


class BackendState(enum.Enum):
    UNKNOWN = "unknown"  # not checked yet
    OK = "ok"
    FAILING = "failing"


class BackendStates:
    """The last known state of every backend, and whether the process is draining. What
    `report` shows is a name and a state only: error details (which carry upstream
    addresses) go to the log, never to a probe's caller."""

    def __init__(self, names: Iterable[str], requirement: Requirement = "any") -> None:
        self._states = {name: BackendState.UNKNOWN for name in names}
        self.requirement = requirement
        self.draining = False

    def record(self, name: str, state: BackendState, detail: str | None = None) -> None:
        before = self._states.get(name)
        self._states[name] = state
        # One source for /readyz and mcp_gateway_backend_up, so the two never disagree.
        metrics.set_backend_up(name, state is BackendState.OK)
        if state is not before:
            if state is BackendState.FAILING:
                log.warning("backend %s: not ready: %s", name, detail or "no detail")
            elif state is BackendState.OK and before is BackendState.FAILING:
                log.info("backend %s: ready again", name)

    def state(self, name: str) -> BackendState:
        return self._states[name]

    def follow(self, kept: Iterable[str], fresh: Iterable[str]) -> None:
        """A reload: `kept` names keep their state, `fresh` ones start unknown, the others
        are forgotten. One swap, so a probe never sees half of it."""
        states = {name: self._states.get(name, BackendState.UNKNOWN) for name in kept}
        states.update({name: BackendState.UNKNOWN for name in fresh})
        forgotten = [name for name in self._states if name not in states]
        self._states = states
        # /readyz and mcp_gateway_backend_up keep naming the same backends.
        for name in forgotten:
            metrics.forget_backend_up(name)

    def begin_drain(self) -> None:
        self.draining = True

    @property
    def ready(self) -> bool:
        if self.draining:
            return False
        ok = sum(state is BackendState.OK for state in self._states.values())
        match self.requirement:
            case "none":
                return True
            case "any":
                return ok >= 1 or not self._states
            case "all":
                return ok == len(self._states)
            case int(count):
                return ok >= min(count, len(self._states))
        return False

    def report(self) -> dict[str, object]:
        status = "draining" if self.draining else ("ready" if self.ready else "not ready")
        return {"status": status, "backends": {name: s.value for name, s in self._states.items()}}


class ReadinessChecks:
    """One background task per backend: refresh its discovery, record the outcome, sleep."""

    def __init__(self, states: BackendStates, backends: Iterable[Backend], interval: float) -> None:
        self.states = states
        self.backends = tuple(backends)
        self.interval = interval
        self._tasks: dict[Backend, asyncio.Task[None]] = {}

    def start(self) -> None:
        for b in self.backends:
            if b not in self._tasks:
                self._tasks[b] = asyncio.create_task(self._check_forever(b), name=f"readiness-{b.name}")

    async def follow(self, backends: Iterable[Backend]) -> None:
        """A reload: keep checking the backends still there, stop checking the others, start
        on the new ones."""
        self.backends = tuple(backends)
        gone = [task for b, task in self._tasks.items() if b not in self.backends]
        self._tasks = {b: task for b, task in self._tasks.items() if b in self.backends}
        for task in gone:
            task.cancel()
        for task in gone:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.start()

    async def check(self, backend: Backend) -> BackendState:
        """One check: a discovery no older than the interval (the request path keeps it fresh
        for free), within the backend's list deadline (Backend.discover applies it). A backend
        its remembered health has ejected (backends/health.py) is failing without asking."""
        if backend.health.ejected:
            self.states.record(backend.name, BackendState.FAILING, backend.health.reason)
            return BackendState.FAILING
        try:
            await backend.discover(max_age=self.interval)
        except rpc.McpError as exc:
            self.states.record(backend.name, BackendState.FAILING, exc.message)
            return BackendState.FAILING
        except Exception as exc:  # noqa: BLE001 - a check must never die; its state says failing
            self.states.record(backend.name, BackendState.FAILING, f"{type(exc).__name__}: {exc}")
            return BackendState.FAILING
        self.states.record(backend.name, BackendState.OK)
        return BackendState.OK

    async def _check_forever(self, backend: Backend) -> None:
        while True:
            await self.check(backend)
            # Jitter, so that a thousand backends are not all asked in the same instant.
            await asyncio.sleep(self.interval * random.uniform(0.9, 1.1))

    async def aclose(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
