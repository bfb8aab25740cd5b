"""DNS expansion: a backend URL's hostname resolved into one endpoint per address, asked
again every `backends[].resolve.interval_seconds` (docs/resilience.md "Several endpoints").

A Kubernetes headless Service answers with the address of every ready pod; behind one URL the
pooled keep-alive connections would otherwise stick to whichever pods they first reached.
Each address becomes an endpoint (endpoints.HttpTarget: the URL, and the address connected
to; the Host header, TLS SNI and certificate check keep the hostname, http1.py), labelled
`address:port` in the metrics (bounded by the answer). At each re-resolution:

- an address that joined the answer joins the endpoint set with fresh health;
- one that left is removed: drained, not ejected (what is under way on it finishes, nothing
  new goes to it; a legacy session there stays until its endpoint cannot be reached);
- a failed resolution (or an empty answer) keeps the last good set; it is logged once until
  the name resolves again, and counted (`mcp_gateway_backend_resolve_failures_total`).

Names are resolved by the system resolver (`loop.getaddrinfo`: /etc/hosts, resolv.conf and
its search domains, as every other connection of the process). IP literals are left alone.
Until the first answer, the URL is one endpoint connected by name, as without expansion.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.backends.endpoints import HttpTarget, address_label, reconcile
from gateway.observability import metrics

if TYPE_CHECKING:
    from gateway.backends.base import Backend
    from gateway.backends.health import EndpointHealth

log = logging.getLogger("gateway.backends.resolve")

# (host, port) -> the addresses, in the answer's order.
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolvable(url: str) -> tuple[str, int] | None:
    """(host, port) of a URL whose host is a name, or None for an IP literal."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return None
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return None
    return host, parts.port or (443 if parts.scheme == "https" else 80)


class AddressWatch:
    """The DNS expansion of one backend's URLs."""

    def __init__(self, backend: Backend, resolver: Resolver = system_resolver) -> None:
        assert backend.settings.resolve is not None
        self.backend = backend
        self.interval = backend.settings.resolve.interval_seconds
        self.resolver = resolver
        self.names = [(url, *named) for url in backend.settings.endpoint_urls if (named := resolvable(url))]
        self._failing: set[str] = set()  # hosts whose last resolution failed (logged once)

    async def resolve_once(self) -> None:
        """Resolve every name and bring the endpoint set in line with the answers."""
        for url, host, port in self.names:
            seconds = self.backend.settings.connect_timeout_seconds
            try:
                async with asyncio.timeout(seconds):
                    addresses = await self.resolver(host, port)
                if not addresses:
                    raise OSError("no address in the answer")
            except (OSError, TimeoutError) as exc:
                metrics.BACKEND_RESOLVE_FAILURES.labels(self.backend.name).inc()
                if host not in self._failing:
                    self._failing.add(host)
                    reason = f"no answer within {seconds:g}s" if isinstance(exc, TimeoutError) else str(exc)
                    log.warning("backend %s: cannot resolve %s (%s); the last good endpoints keep serving",
                                self.backend.name, host, reason)
                continue
            if host in self._failing:
                self._failing.discard(host)
                log.info("backend %s: %s resolves again", self.backend.name, host)
            self._apply(url, port, addresses)

    def _apply(self, url: str, port: int, addresses: Iterable[str]) -> None:
        health = self.backend.health
        others = {e.label for e in health.endpoints if not _of(e, url)}
        wanted: dict[str, HttpTarget] = {}
        for address in addresses:
            label = address_label(address, port)
            if label in others:  # two URLs on one address (different paths): the URL tells them apart
                label = f"{label}{urlsplit(url).path}"
            wanted[label] = HttpTarget(url, address)
        if reconcile(health, wanted, lambda e: _of(e, url)):
            log.info("backend %s: %s is now %s", self.backend.name, url,
                     ", ".join(e.label for e in health.endpoints if _of(e, url)))

    async def run(self) -> None:
        while True:
            await self.resolve_once()
            await asyncio.sleep(self.interval * random.uniform(0.9, 1.1))


def _of(endpoint: EndpointHealth, url: str) -> bool:
    target = endpoint.target
    return isinstance(target, HttpTarget) and target.url == url


class AddressWatches:
    """The background tasks of a fleet's DNS expansion (like health_checks.HealthChecks)."""

    def __init__(self, backends: Iterable[Backend], resolver: Resolver = system_resolver) -> None:
        self.resolver = resolver
        self.backends = _watched(backends)
        self._tasks: dict[Backend, asyncio.Task[None]] = {}

    def start(self) -> None:
        for backend in self.backends:
            if backend not in self._tasks:
                watch = AddressWatch(backend, self.resolver)
                self._tasks[backend] = asyncio.create_task(watch.run(), name=f"resolve-{backend.name}")

    async def follow(self, backends: Iterable[Backend]) -> None:
        """A reload: keep the watches of the backends still there, stop the others', start new ones."""
        self.backends = _watched(backends)
        gone = [task for b, task in self._tasks.items() if b not in self.backends]
        self._tasks = {b: task for b, task in self._tasks.items() if b in self.backends}
        await _cancel(gone)
        self.start()

    async def aclose(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        await _cancel(tasks)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _watched(backends: Iterable[Backend]) -> tuple[Backend, ...]:
    return tuple(b for b in backends if b.settings.resolve is not None
                 and any(resolvable(url) for url in b.settings.endpoint_urls))
