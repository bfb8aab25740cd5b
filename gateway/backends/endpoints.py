"""Choosing one of a backend's endpoints for a call (docs/resilience.md "Several endpoints").

Power of two choices on requests in flight (Mitzenmacher; what Envoy's LEAST_REQUEST does):
two endpoints picked at random among those in rotation, the one with fewer requests in flight
wins. It needs no shared state beyond the counts, and it avoids the herd that "the least loaded
of all" sends to one endpoint that has just come back. Health (health.py) decides which
endpoints are in rotation; an ejected endpoint due a half-open trial is offered like the
others, once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection

from gateway.backends.health import EndpointHealth


def choose(endpoints: list[EndpointHealth], avoid: Collection[EndpointHealth] = ()) -> EndpointHealth | None:
    """An endpoint for the next request, or None when none is in rotation (outside `avoid`)."""
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
    return a if a.in_flight <= b.in_flight else b


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
