"""One configuration reload: load, validate, plan, build, swap (docs/reload.md).

Reloads run one at a time; a request that arrives while one runs is coalesced into a single
follow-up (ten SIGHUPs in a burst cost two reloads, and the last file wins). A configuration
that does not validate, or whose backends cannot be built, is refused: its problems are
logged field by field (values never, they may be secrets) and the running snapshot keeps
serving. Either way the outcome is counted (metrics.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from gateway.observability.metrics import count_reload
from gateway.reload import metrics
from gateway.reload.plan import plan
from gateway.settings import ConfigError, GatewaySettings

if TYPE_CHECKING:
    from gateway.runtime import Runtime

log = logging.getLogger("gateway.reload")

Result = Literal["applied", "unchanged", "refused"]


class Reloader:
    def __init__(self, runtime: Runtime, load: Callable[[], GatewaySettings]) -> None:
        self.runtime = runtime
        # Reads the configuration the way `serve` read it at start-up (file, environment,
        # command-line overrides): a reload compares like with like.
        self.load = load
        self._lock = asyncio.Lock()
        self._queued: asyncio.Task[Result] | None = None
        self._tasks: set[asyncio.Task[Result]] = set()

    def request(self, reason: str) -> asyncio.Task[Result]:
        """Start a reload in the background (from a signal handler or the watcher); a request
        made while another waits to run joins that one."""
        if self._queued is not None and not self._queued.done():
            return self._queued
        task = asyncio.create_task(self.reload(reason), name=f"reload-{reason}")
        self._queued = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def reload(self, reason: str) -> Result:
        async with self._lock:
            if self._queued is asyncio.current_task():
                self._queued = None  # running now: a later request queues a new reload
            return await self._reload(reason)

    async def _reload(self, reason: str) -> Result:
        runtime = self.runtime
        try:
            new = self.load()
        except ConfigError as exc:
            return self._refused(reason, exc.problems)
        change = plan(runtime.settings, new)
        metrics.NEEDS_RESTART.set(1 if change.needs_restart else 0)
        for field in change.needs_restart:
            log.warning("reload (%s): %s changed, which only a restart applies; still serving with the "
                        "running value", reason, field)
        if not change.changes_fleet:
            count_reload("unchanged")
            log.info("reload (%s): no backend changed (generation %d stays)", reason, runtime.snapshot.generation)
            return "unchanged"
        try:
            backends = runtime.build_backends(change.settings, change.kept)
        except ConfigError as exc:  # what a backend constructor refuses (serve would refuse it too)
            return self._refused(reason, exc.problems)
        snapshot = await runtime.apply(change.settings, backends, renamed=change.renamed)
        count_reload("applied")
        metrics.GENERATION.set(snapshot.generation)
        metrics.LAST_APPLIED.set(time.time())
        log.info("reload (%s): configuration generation %d serving: %s", reason, snapshot.generation,
                 change.summary())
        return "applied"

    def _refused(self, reason: str, problems: list[tuple[str, str]]) -> Result:
        count_reload("refused")
        log.error("reload (%s) refused: the configuration is invalid; generation %d keeps serving:%s",
                  reason, self.runtime.snapshot.generation,
                  "".join(f"\n  {loc}: {msg}" for loc, msg in problems))
        return "refused"

    async def aclose(self) -> None:
        for task in tuple(self._tasks):
            task.cancel()
        for task in tuple(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
