"""The running gateway: settings compiled into backends, a route table, the cache and the
hub, with their lifecycle.

What a request reads of the configuration is one immutable `Snapshot` (settings, backends,
route table, dispatcher), taken once when the request starts (`LiveDispatcher`): a reload
(`Runtime.apply`, driven by gateway/reload/) builds the next snapshot beside the current one
and swaps it in with one assignment, so a request sees the old fleet or the new one, never a
mix (DESIGN.md principle 4). The cache and the hub live as long as the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway.backends import create_backend
from gateway.backends.base import Backend, Reply
from gateway.backends.health_checks import HealthChecks
from gateway.backends.resolve import AddressWatches
from gateway.backends.replica import ReplicaContext
from gateway.cache import ResponseCache
from gateway.cache.factory import build_cache
from gateway.dispatch import Dispatcher, Hub
from gateway.policies.authorization import RuleSet
from gateway.policies.ratelimit import RateLimits
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.readiness import BackendStates
from gateway.routing.curation import Curation
from gateway.routing.pins import Pins
from gateway.routing.table import RouteTable, Target
from gateway.routing.views import views_of
from gateway.settings import ConfigError, GatewaySettings
from gateway.subscriptions import build_hub

log = logging.getLogger("gateway.runtime")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One configuration as the request path uses it; never changed, only replaced."""

    generation: int
    settings: GatewaySettings
    backends: tuple[Backend, ...]
    table: RouteTable
    dispatcher: Dispatcher
    # One dispatcher per view path (routing/views.py), over the same table, cache and hub.
    views: dict[str, Dispatcher]


class LiveDispatcher:
    """What the fronts (the MCP endpoint, initialize-era sessions) call: the current
    snapshot's dispatcher, read once per request. `dispatch` hands back that dispatcher's
    coroutine itself, so the indirection costs one attribute read, not a coroutine frame."""

    __slots__ = ("snapshot",)

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def dispatch(self, call: Call) -> Awaitable[Reply]:
        return self.snapshot.dispatcher.dispatch(call)

    def tool_param_headers(self, name: str) -> Awaitable[tuple[Any, ...]]:
        return self.snapshot.dispatcher.tool_param_headers(name)

    @property
    def hub(self) -> Hub | None:
        return self.snapshot.dispatcher.hub


class LiveView:
    """A view's `LiveDispatcher`: the current snapshot's dispatcher for one view path, read
    once per request (through the main `LiveDispatcher`, so that a reload's swap is one
    assignment for every endpoint)."""

    __slots__ = ("live", "path")

    def __init__(self, live: LiveDispatcher, path: str) -> None:
        self.live = live
        self.path = path

    def dispatch(self, call: Call) -> Awaitable[Reply]:
        return self.live.snapshot.views[self.path].dispatch(call)

    def tool_param_headers(self, name: str) -> Awaitable[tuple[Any, ...]]:
        return self.live.snapshot.views[self.path].tool_param_headers(name)

    @property
    def hub(self) -> Hub | None:
        return self.live.snapshot.dispatcher.hub


class Runtime:
    def __init__(self, settings: GatewaySettings, *, backends: list[Backend] | None = None,
                 cache: ResponseCache | None = None, hub: Hub | None = None) -> None:
        # Compiled once: what every legacy backend shares with the fleet (MRTR key, address).
        self.replica = ReplicaContext.from_settings(settings)
        built = backends if backends is not None else [create_backend(b, self.replica) for b in settings.backends]
        # Governance, compiled once (docs/governance.md): None when not configured. Changing it
        # needs a restart (a reload applies `backends` only; docs/reload.md).
        self.rules = RuleSet.from_settings(settings)
        self.rate_limits = RateLimits.from_settings(settings)
        self.pins = Pins.from_settings(settings, on_change=self._pins_changed)
        # Compiled with the rest of governance: restart-only like it (docs/reload.md).
        self.views = views_of(settings)
        table = _table(settings, built, self.pins)
        self.cache: ResponseCache = cache if cache is not None else build_cache(settings.cache, settings.redis)
        self.hub: Hub = hub if hub is not None else build_hub(settings, table, self.cache)
        self.snapshot = Snapshot(0, settings, tuple(built), table, self._dispatcher(table), self._views(table))
        self.live = LiveDispatcher(self.snapshot)
        self._discovery: asyncio.Task[None] | None = None
        # Backends a reload took out of the fleet, while their calls under way finish.
        self._drains: dict[asyncio.Task[None], Backend] = {}
        # Active health checks (backends/health_checks.py): with discovery and the calls, they
        # keep each backend's remembered health (backends/health.py).
        self.health_checks = HealthChecks(built)
        # DNS expansion of `backends[].resolve` backends into endpoints (backends/resolve.py).
        self.address_watches = AddressWatches(built)
        self.shutting_down = False
        # What /readyz reads: that remembered health, never a probe of its own.
        self.readiness = BackendStates(built, settings.server.readiness)
        if "readiness_interval_seconds" in settings.server.model_fields_set:
            log.warning("server.readiness_interval_seconds has no effect any more: /readyz reads the state the "
                        "health checks keep (backends[].health.check_interval_seconds)")

    # The current snapshot's parts (what the rest of the process and tests read).
    @property
    def settings(self) -> GatewaySettings:
        return self.snapshot.settings

    @property
    def backends(self) -> list[Backend]:
        return list(self.snapshot.backends)

    @property
    def table(self) -> RouteTable:
        return self.snapshot.table

    @property
    def dispatcher(self) -> Dispatcher:
        return self.snapshot.dispatcher

    def _dispatcher(self, table: RouteTable) -> Dispatcher:
        return Dispatcher(table, cache=self.cache, hub=self.hub, rules=self.rules, rate_limits=self.rate_limits)

    def _views(self, table: RouteTable) -> dict[str, Dispatcher]:
        return {view.path: Dispatcher(table, cache=self.cache, hub=self.hub, rules=self.rules,
                                      rate_limits=self.rate_limits, view=view) for view in self.views}

    def live_view(self, path: str) -> LiveView:
        return LiveView(self.live, path)

    def _pins_changed(self) -> None:
        # What is withheld changed: no kept aggregated list may be reused (cache/assembled.py).
        self.table.revision += 1

    async def start(self) -> None:
        if self.pins is not None:
            await self.pins.reload()
        await asyncio.gather(*(b.start() for b in self.snapshot.backends))
        await self.cache.start()
        if self.rate_limits is not None:
            await self.rate_limits.start()
        await self.hub.start()
        self.address_watches.start()
        # Learn capabilities in the background: a backend that is down at start-up must not
        # keep the gateway from serving the others.
        self._discovery = asyncio.create_task(self.discover_all(), name="discover-backends")
        self.health_checks.start()

    async def discover_all(self, timeout: float = 10.0, backends: Iterable[Backend] | None = None) -> None:
        async def one(backend: Backend) -> None:
            try:
                await asyncio.wait_for(backend.discover(max_age=0), timeout)
                log.info("backend %s: discovered (capabilities: %s)", backend.name,
                         ", ".join(sorted(backend.capabilities or {})) or "none")
            except (rpc.McpError, TimeoutError) as exc:
                backend.last_error = getattr(exc, "message", None) or f"no answer within {timeout:g}s"
                log.warning("backend %s: discovery failed: %s", backend.name, backend.last_error)
                _check_result(backend, backend.last_error)
            else:
                _check_result(backend, None)

        await asyncio.gather(*(one(b) for b in (self.snapshot.backends if backends is None else backends)))

    @property
    def discovery_task(self) -> asyncio.Task[None] | None:
        """The start-up discovery of every backend, while or after it runs."""
        return self._discovery

    # -- a reload -------------------------------------------------------------------------

    def build_backends(self, settings: GatewaySettings, keep: frozenset[str]) -> list[Backend]:
        """The next fleet, in configured order: the current Backend object for each name in
        `keep` (its settings did not change: pools, sessions, processes and upstream listens
        carry on), a new one for every other. Raises ConfigError naming each backend whose
        constructor refuses; nothing is started yet."""
        current = {b.name: b for b in self.snapshot.backends}
        built: list[Backend] = []
        problems: list[tuple[str, str]] = []
        for i, b in enumerate(settings.backends):
            try:
                built.append(current[b.name] if b.name in keep else create_backend(b, self.replica))
            except Exception as exc:  # noqa: BLE001 - any refusal is a problem to report, field-named
                problems.append((f"backends.{i}", str(exc) or type(exc).__name__))
        if problems:
            raise ConfigError(problems)
        return built

    async def apply(self, settings: GatewaySettings, backends: list[Backend], *,
                    renamed: frozenset[str] = frozenset()) -> Snapshot:
        """Swap in the snapshot of `settings` (validated) over `backends` (`build_backends`):
        start the new backends, compile the route table (keeping what the old one learned of
        the kept backends), swap, then let readiness, the health checks and the hub follow, and drain
        the backends no longer in the fleet. `renamed`: kept backends whose prefix changed."""
        old = self.snapshot
        fresh = [b for b in backends if b not in old.backends]
        await asyncio.gather(*(b.start() for b in fresh))
        table = _table(settings, backends, self.pins, max_uris=old.table._max_uris)
        table.inherit(old.table)
        snapshot = Snapshot(old.generation + 1, settings, tuple(backends), table, self._dispatcher(table),
                            self._views(table))
        # The swap: every request from here on reads the new snapshot; those under way finish
        # on the one they started with.
        self.snapshot = self.live.snapshot = snapshot
        # /readyz reads the new objects' health: what a removed or replaced backend's calls
        # under way (the drain) still report cannot mark the name, which may now be a new
        # backend's. A replaced one reads as its predecessor until its first check (at once).
        self.readiness.follow(backends)
        await self.health_checks.follow(backends)
        await self.address_watches.follow(backends)
        # New backends' capabilities first (bounded by each one's list deadline): the hub
        # needs them to attach listeners and to say which lists changed.
        await self.discover_all(timeout=max((b.settings.list_timeout_seconds for b in fresh), default=1.0),
                                backends=fresh)
        reconfigure = getattr(self.hub, "reconfigure", None)
        if reconfigure is not None:
            await reconfigure(table, renamed=renamed)
        grace = settings.server.graceful_shutdown_seconds
        for backend in old.backends:
            if backend not in backends:
                task = asyncio.create_task(backend.drain(grace), name=f"drain-{backend.name}")
                self._drains[task] = backend
                task.add_done_callback(lambda done: self._drains.pop(done, None))
        return snapshot

    # -- shutdown -------------------------------------------------------------------------

    async def begin_shutdown(self) -> None:
        """Called when the server stops accepting: long-lived streams get their graceful end
        so that in-flight requests can drain."""
        self.shutting_down = True
        await self.hub.begin_shutdown()

    async def aclose(self) -> None:
        if self._discovery is not None and not self._discovery.done():
            self._discovery.cancel()
        await self.health_checks.aclose()
        await self.address_watches.aclose()
        await self.hub.aclose()
        await self.cache.aclose()
        if self.rate_limits is not None:
            await self.rate_limits.aclose()
        if self.pins is not None:
            await self.pins.aclose()
        # Backends a reload is still draining are closed with the rest, now: the process's own
        # drain (graceful_shutdown_seconds) already waited for the requests under way.
        draining = list(self._drains.items())
        self._drains.clear()
        for task, _ in draining:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(b.aclose() for b in (*self.snapshot.backends, *(b for _, b in draining))),
                             return_exceptions=True)


def _table(settings: GatewaySettings, backends: list[Backend], pins: Pins | None,
           max_uris: int | None = None) -> RouteTable:
    table = RouteTable([Target(backend, settings.prefix_of(backend.settings), Curation.of(backend.settings))
                        for backend in backends],
                       max_uris=settings.server.max_resource_uris if max_uris is None else max_uris)
    table.pins = pins
    return table


def _check_result(backend: Backend, failure: str | None) -> None:
    """A discovery the gateway made for itself counts as an active check (of a backend with
    one endpoint: with several, it does not say which one answered)."""
    if len(backend.health.endpoints) > 1:
        return
    for endpoint in backend.health.endpoints:
        if failure is None:
            endpoint.check_passed()
        else:
            endpoint.check_failed(failure)
