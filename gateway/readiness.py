"""Readiness: what /readyz answers, read from each backend's remembered health at once.

A probe that waited on backends would take as long as the slowest one (the kubelet's 1 s
timeout then marks every replica NotReady together). /readyz asks nobody: it reads the state
that the health machinery keeps (backends/health.py) from the start-up discovery, the active
checks every `backends[].health.check_interval_seconds` (health_checks.py) and every call
that passes (passive outlier detection). /readyz, `mcp_gateway_backend_up` and the ejections
have that one source, so they never disagree, and no second loop asks the backends again.

A backend is "ok" while its health is up (an endpoint in rotation answered last), "failing"
while it is down (every endpoint ejected, or the first word about it was a failure), and
"unknown" until something has said (the start-up discovery is under way). With active
checks off (`check_interval_seconds: 0`) the state is what the start-up discovery and the
calls since then said: a backend that failed its discovery stays "failing" until a call to it
succeeds (at the latest its half-open trial, once an ejection's time is up).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from gateway.observability import metrics

if TYPE_CHECKING:
    from gateway.backends.base import Backend
    from gateway.backends.health import BackendHealth

Requirement = Literal["any", "all", "none"] | int


class BackendState(enum.Enum):
    UNKNOWN = "unknown"  # nothing said yet
    OK = "ok"
    FAILING = "failing"


def state_of(health: BackendHealth) -> BackendState:
    if health.up is None:
        return BackendState.UNKNOWN
    return BackendState.OK if health.up else BackendState.FAILING


class BackendStates:
    """Every backend's health, read as a readiness state, and whether the process is
    draining. What `report` shows is a name and a state only: the reasons (which carry
    upstream addresses) go to the log (health.py), never to a probe's caller."""

    def __init__(self, backends: Iterable[Backend], requirement: Requirement = "any") -> None:
        self._health: dict[str, BackendHealth] = {b.name: b.health for b in backends}
        # A name whose backend a reload replaced reads its old health until the new one has
        # said something (its discovery, at once): a backend that merely got a new header
        # must not flap /readyz.
        self._before: dict[str, BackendHealth] = {}
        self.requirement = requirement
        self.draining = False

    def state(self, name: str) -> BackendState:
        state = state_of(self._health[name])
        if state is BackendState.UNKNOWN and name in self._before:
            return state_of(self._before[name])
        return state

    def follow(self, backends: Iterable[Backend]) -> None:
        """A reload: read the new fleet's health. One swap, so a probe never sees half of it."""
        old = self._health
        health = {b.name: b.health for b in backends}
        self._before = {name: old[name] for name, h in health.items() if name in old and old[name] is not h}
        self._health = health
        # /readyz and mcp_gateway_backend_up keep naming the same backends.
        for name in old.keys() - health.keys():
            metrics.forget_backend_up(name)

    def begin_drain(self) -> None:
        self.draining = True

    def states(self) -> dict[str, BackendState]:
        return {name: self.state(name) for name in self._health}

    @property
    def ready(self) -> bool:
        if self.draining:
            return False
        if self.requirement == "none":
            return True
        states = self.states().values()
        ok = sum(state is BackendState.OK for state in states)
        match self.requirement:
            case "any":
                return ok >= 1 or not states
            case "all":
                return ok == len(states)
            case int(count):
                return ok >= min(count, len(states))
        return False

    def report(self) -> dict[str, object]:
        states = self.states()
        status = "draining" if self.draining else ("ready" if self.ready else "not ready")
        return {"status": status, "backends": {name: s.value for name, s in states.items()}}
