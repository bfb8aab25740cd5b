"""Choosing one of a backend's endpoints for a call (docs/resilience.md "Several endpoints").

Power of two choices on requests in flight (Mitzenmacher; what Envoy's LEAST_REQUEST does):
two endpoints picked at random among those in rotation, the one with fewer requests in flight
wins. It needs no shared state beyond the counts, and it avoids the herd that "the least loaded
of all" sends to one endpoint that has just come back. Health (health.py) decides which
endpoints are in rotation; an ejected endpoint due a half-open trial is offered like the
others, once.

The set itself may change while calls run (`reconcile`: DNS expansion in resolve.py; any
backend whose endpoints come and go can use it): each endpoint carries its `target`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from gateway.backends.health import BackendHealth, EndpointHealth


def in_flight(endpoint: EndpointHealth) -> int:
    return endpoint.in_flight


def choose(endpoints: list[EndpointHealth], avoid: Collection[EndpointHealth] = (),
           load: Callable[[EndpointHealth], int] = in_flight) -> EndpointHealth | None:
    """An endpoint for the next request, or None when none is in rotation (outside `avoid`).

    `load` is what is compared: requests in flight for a request; what a caller that places
    something longer-lived counts instead (a legacy session: the sessions already there)."""
    now = time.monotonic()
    # Endpoints in rotation first; an ejected one is asked (`admits`) only when it could serve,
    # so that asking does not spend its half-open trial on a call that goes elsewhere.
    ready = [e for e in endpoints if e.ejected_until == 0.0 and e not in avoid]
    if not ready:
        for endpoint in endpoints:
            if endpoint not in avoid and endpoint.admits(now):
                return endpoint
        return None
    if len(ready) == 1:
        return ready[0]
    a, b = random.sample(ready, 2)
    return a if load(a) <= load(b) else b


# -- the endpoint set ------------------------------------------------------------------------

class HttpTarget(NamedTuple):
    """Where an HTTP endpoint's requests go: its URL (Host header, TLS name, path), and the
    address connected to instead of the URL's host (an address of its DNS answer), if any."""

    url: str
    address: str | None = None


def address_label(address: str, port: int) -> str:
    """An expanded endpoint's metric label: bounded by the DNS answer (address:port)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def reconcile(health: BackendHealth, wanted: dict[str, Any], owns: Callable[[EndpointHealth], bool]) -> bool:
    """Make the endpoints `owns` selects exactly `wanted` (label -> target): the new ones are
    added with fresh health, the ones no longer wanted removed (drained: what is under way
    finishes, nothing new is sent), the others kept as they are, health and all. Additions
    come first, so the set is never empty. True when anything changed."""
    current = {e.label: e for e in health.endpoints if owns(e)}
    added = [label for label in wanted if label not in current]
    for label in added:
        health.add(label, wanted[label])
    gone = [e for label, e in current.items() if label not in wanted]
    for endpoint in gone:
        health.remove(endpoint)
    return bool(added or gone)


class InFlightRelease:
    """An endpoint's in-flight count, given back once when a streamed answer closes (it may
    be closed without ever being read, and then no generator `finally` runs)."""

    __slots__ = ("_endpoint",)

    def __init__(self, endpoint: EndpointHealth) -> None:
        self._endpoint: EndpointHealth | None = endpoint

    def release(self) -> None:
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.in_flight -= 1
