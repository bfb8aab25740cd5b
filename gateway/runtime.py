"""The running gateway: settings compiled into backends, a route table, the cache and the
hub, with their lifecycle. Built once per process from frozen settings."""

from __future__ import annotations

import asyncio
import logging

from gateway.backends import create_backend
from gateway.backends.base import Backend
from gateway.backends.health_checks import HealthChecks
from gateway.backends.replica import ReplicaContext
from gateway.cache import ResponseCache
from gateway.cache.factory import build_cache
from gateway.dispatch import Dispatcher, Hub
from gateway.policies.authorization import RuleSet
from gateway.policies.ratelimit import RateLimits
from gateway.protocol import jsonrpc as rpc
from gateway.readiness import BackendState, BackendStates, ReadinessChecks
from gateway.routing.curation import Curation
from gateway.routing.pins import Pins
from gateway.routing.table import RouteTable, Target
from gateway.settings import GatewaySettings
from gateway.subscriptions import build_hub

log = logging.getLogger("gateway.runtime")


class Runtime:
    def __init__(self, settings: GatewaySettings, *, backends: list[Backend] | None = None,
                 cache: ResponseCache | None = None, hub: Hub | None = None) -> None:
        self.settings = settings
        # Compiled once: what every legacy backend shares with the fleet (MRTR key, address).
        self.replica = ReplicaContext.from_settings(settings)
        self.backends = backends if backends is not None else [
            create_backend(b, self.replica) for b in settings.backends]
        self.table = RouteTable(
            [Target(backend, settings.prefix_of(backend.settings), Curation.of(backend.settings))
             for backend in self.backends],
            max_uris=settings.server.max_resource_uris,
        )
        self.table.pins = Pins.from_settings(settings, on_change=self._pins_changed)
        self.cache: ResponseCache = cache if cache is not None else build_cache(settings.cache, settings.redis)
        self.hub: Hub = hub if hub is not None else build_hub(settings, self.table, self.cache)
        # Governance, compiled once (docs/governance.md): None when not configured.
        self.rules = RuleSet.from_settings(settings)
        self.rate_limits = RateLimits.from_settings(settings)
        self.dispatcher = Dispatcher(self.table, cache=self.cache, hub=self.hub, rules=self.rules,
                                     rate_limits=self.rate_limits)
        self._discovery: asyncio.Task[None] | None = None
        # Active health checks (backends/health_checks.py); their state feeds /readyz.
        self.health_checks = HealthChecks(self.backends)
        self.shutting_down = False
        # What /readyz reads: kept by background checks, never probed on the request.
        self.readiness = BackendStates((b.name for b in self.backends), settings.server.readiness)
        self.readiness_checks = ReadinessChecks(self.readiness, self.backends,
                                                settings.server.readiness_interval_seconds)
        for backend in self.backends:
            # Remembered health (backends/health.py) feeds readiness: an ejection is "failing" at once.
            backend.health.listeners.append(self._health_changed)

    def _health_changed(self, name: str, up: bool, reason: str | None) -> None:
        if not up:
            self.readiness.record(name, BackendState.FAILING, reason)

    def _pins_changed(self) -> None:
        # What is withheld changed: no kept aggregated list may be reused (cache/assembled.py).
        self.table.revision += 1

    async def start(self) -> None:
        if self.table.pins is not None:
            await self.table.pins.reload()
        await asyncio.gather(*(b.start() for b in self.backends))
        await self.cache.start()
        if self.rate_limits is not None:
            await self.rate_limits.start()
        await self.hub.start()
        # Learn capabilities in the background: a backend that is down at start-up must not
        # keep the gateway from serving the others.
        self._discovery = asyncio.create_task(self.discover_all(), name="discover-backends")
        self.health_checks.start()
        # Their first round joins that discovery (Backend.discover runs one at a time).
        self.readiness_checks.start()

    async def discover_all(self, timeout: float = 10.0) -> None:
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

        await asyncio.gather(*(one(b) for b in self.backends))

    @property
    def discovery_task(self) -> asyncio.Task[None] | None:
        """The start-up discovery of every backend, while or after it runs."""
        return self._discovery

    async def begin_shutdown(self) -> None:
        """Called when the server stops accepting: long-lived streams get their graceful end
        so that in-flight requests can drain."""
        self.shutting_down = True
        await self.hub.begin_shutdown()

    async def aclose(self) -> None:
        await self.readiness_checks.aclose()
        if self._discovery is not None and not self._discovery.done():
            self._discovery.cancel()
        await self.health_checks.aclose()
        await self.hub.aclose()
        await self.cache.aclose()
        if self.rate_limits is not None:
            await self.rate_limits.aclose()
        if self.table.pins is not None:
            await self.table.pins.aclose()
        await asyncio.gather(*(b.aclose() for b in self.backends), return_exceptions=True)


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
