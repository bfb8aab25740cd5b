"""Active health checks: one background task per backend, every
`backends[].health.check_interval_seconds` (jittered), each bounded by
`check_timeout_seconds`; the outcome goes to the backend's remembered health (health.py).

A check is `Backend.health_check()`: the configured canary `tools/call`, or a fresh
`server/discover` (an initialize on a legacy session, a round trip through a stdio process).
While a backend is ejected the checks keep running at the same interval, so a backend that
recovers is back within one interval (a passing check ends an ejection at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gateway.protocol import jsonrpc as rpc

if TYPE_CHECKING:
    from gateway.backends.base import Backend

log = logging.getLogger("gateway.backends.health")


async def check_once(backend: Backend) -> bool:
    """Check every endpoint of `backend` (at once) and record each outcome; True when all
    passed. Never raises (but cancellation)."""
    results = await asyncio.gather(*(check_endpoint(backend, i) for i in range(len(backend.health.endpoints))))
    return all(results)


async def check_endpoint(backend: Backend, index: int) -> bool:
    """One active check of endpoint `index`, its outcome recorded; True when it passed."""
    endpoint = backend.health.endpoints[index]
    seconds = backend.settings.health.check_timeout_seconds
    try:
        async with asyncio.timeout(seconds):
            await backend.check_endpoint(index)
    except TimeoutError:
        reason = f"no answer within {seconds:g}s (backends[].health.check_timeout_seconds)"
    except rpc.McpError as exc:
        reason = exc.message
    except Exception as exc:  # noqa: BLE001 - a check must never die; it says "failed"
        reason = f"{type(exc).__name__}: {exc}"
    else:
        endpoint.check_passed()
        return True
    endpoint.check_failed(reason)
    return False


class HealthChecks:
    """The background tasks of a fleet's active checks."""

    def __init__(self, backends: Iterable[Backend]) -> None:
        self.backends = _checked(backends)
        # Keyed by the Backend object, not its name: a reload that replaces a backend keeps
        # the name and must still stop the old object's checks.
        self._tasks: dict[Backend, asyncio.Task[None]] = {}

    def start(self) -> None:
        for backend in self.backends:
            if backend not in self._tasks:
                self._tasks[backend] = asyncio.create_task(self._forever(backend), name=f"health-{backend.name}")

    async def follow(self, backends: Iterable[Backend]) -> None:
        """A reload: keep checking the backends still there, stop checking the others, start
        on the new ones."""
        self.backends = _checked(backends)
        gone = [task for b, task in self._tasks.items() if b not in self.backends]
        self._tasks = {b: task for b, task in self._tasks.items() if b in self.backends}
        for task in gone:
            task.cancel()
        for task in gone:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.start()

    async def _forever(self, backend: Backend) -> None:
        interval = backend.settings.health.check_interval_seconds
        # Spread the first checks over the interval: a thousand backends are not all asked in
        # the same instant (start-up discovery asks each once already).
        await asyncio.sleep(interval * random.uniform(0.1, 1.0))
        while True:
            await check_once(backend)
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))

    async def aclose(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _checked(backends: Iterable[Backend]) -> tuple[Backend, ...]:
    return tuple(b for b in backends if b.settings.health.check_interval_seconds > 0)
