"""Remembered health of a backend and of each of its endpoints (docs/resilience.md).

Envoy's outlier detection, MCP-aware and kept per endpoint:

- passive: every call that passes the dispatcher reports how it went. `consecutive_failures`
  failures in a row (no connection, a reset, a timeout, an HTTP 5xx) eject the endpoint for
  `base_ejection_seconds` times the number of ejections it has had in a row (capped at
  `max_ejection_seconds`); never more than `max_ejected_percent` of a backend's endpoints at
  once, and at least one may always be ejected.
- active: a background check (health_checks.py) reports too. A check that passes ends an
  ejection at once; `failed_checks` failed checks in a row eject.
- half-open: once an ejection's time is up, one trial call is let through; its success puts
  the endpoint back, its failure ejects it again for longer.

An ejected backend (every endpoint out) costs nothing: `admit` fails a call at once with
-31001 naming the backend and the reason, and an aggregated list leaves the backend out of
the page (its share goes into the cursor as a retry, routing/fanout.py).

State changes are logged once, exported as metrics, and told to `listeners` (the readiness
state feeds from them). Nothing here does I/O: this is a state machine driven by the
dispatcher and the checks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc
from gateway.settings import HealthSettings

log = logging.getLogger("gateway.backends.health")

# (backend name, in rotation?, reason when not) -> None
Listener = Callable[[str, bool, str | None], None]


class EndpointHealth:
    """One endpoint's outlier state. `ejected_until` is 0.0 while in rotation; `up` is None
    until something (a call or a check) has said how it is. `target` is what the backend
    sends to (an `endpoints.HttpTarget`, a process), opaque here."""

    __slots__ = ("backend", "label", "settings", "target", "removed", "failures", "failed_checks", "ejections",
                 "ejected_until", "last_ejected", "reason", "up", "trial_until", "in_flight")

    def __init__(self, backend: BackendHealth, label: str, settings: HealthSettings, target: Any = None) -> None:
        self.backend = backend
        self.label = label
        self.settings = settings
        self.target = target
        # Out of the endpoint set (its address left the DNS answer): what is under way on it
        # finishes, and nothing it reports reaches the backend's state or the metrics.
        self.removed = False
        self.failures = 0
        self.failed_checks = 0
        self.ejections = 0
        self.ejected_until = 0.0
        self.last_ejected = float("-inf")
        self.reason: str | None = None
        self.up: bool | None = None
        self.trial_until = 0.0
        # Requests on this endpoint now (endpoint selection reads it: power of two choices).
        self.in_flight = 0

    @property
    def ejected(self) -> bool:
        return self.ejected_until != 0.0

    def admits(self, now: float) -> bool:
        """In rotation, or ejected with its time up and no trial under way (then this caller
        is the half-open trial: the others keep failing fast until it answers)."""
        if self.ejected_until == 0.0:
            return True
        if now < self.ejected_until or now < self.trial_until:
            return False
        # One trial at a time, for at most one base ejection time (a trial whose caller went
        # away must not keep the endpoint out forever).
        self.trial_until = now + self.settings.base_ejection_seconds
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self.failed_checks = 0
        if self.ejected_until != 0.0 or self.up is not True:
            self._restore()

    def failed(self, reason: str) -> None:
        self.failures += 1
        self.reason = reason
        if self.ejected_until != 0.0:
            # A half-open trial that failed: out again, for longer.
            if self.trial_until != 0.0:
                self._eject(f"half-open trial failed: {reason}")
            return
        if self.failures >= self.settings.consecutive_failures:
            self._eject(f"{self.failures} consecutive failures (last: {reason})")
        elif self.up is None:
            self._mark(False)

    def check_passed(self) -> None:
        metrics.HEALTH_CHECKS.labels(self.backend.name, "ok").inc()
        self.failures = 0
        self.failed_checks = 0
        if self.ejected_until != 0.0 or self.up is not True:
            self._restore()

    def check_failed(self, reason: str) -> None:
        metrics.HEALTH_CHECKS.labels(self.backend.name, "failed").inc()
        self.failed_checks += 1
        self.reason = f"health check failed: {reason}"
        if self.ejected_until != 0.0:
            return
        if self.failed_checks >= self.settings.failed_checks:
            self._eject(f"{self.failed_checks} failed health checks (last: {reason})")
        elif self.up is None:
            self._mark(False)

    def lost(self, reason: str) -> None:
        """Known to be gone (its stdio process died): out of rotation now, rather than after
        `consecutive_failures` calls have found out one by one; down even where the cap keeps
        it in rotation."""
        self.reason = reason
        self._eject(reason)
        self._mark(False)

    def _eject(self, reason: str) -> None:
        now = time.monotonic()
        if not self.backend.may_eject(self):
            # The cap on ejected endpoints: this one stays in rotation, failing on its own.
            log.warning("backend %s: endpoint %s would be ejected (%s) but max_ejected_percent is reached",
                        self.backend.name, self.label, reason)
            return
        # Repeated ejections grow; a quiet spell as long as the cap forgets them.
        if now - self.last_ejected > self.settings.max_ejection_seconds:
            self.ejections = 0
        self.ejections += 1
        self.last_ejected = now
        seconds = min(self.settings.base_ejection_seconds * self.ejections, self.settings.max_ejection_seconds)
        first = self.ejected_until == 0.0
        self.ejected_until = now + seconds
        self.trial_until = 0.0
        self.reason = reason
        metrics.EJECTIONS.labels(self.backend.name).inc()
        if first:
            log.warning("backend %s: endpoint %s ejected for %gs: %s", self.backend.name, self.label, seconds, reason)
        self._mark(False)
        if first:
            for listener in self.backend.ejection_listeners:
                listener(self)

    def _restore(self) -> None:
        was_ejected = self.ejected_until != 0.0
        self.ejected_until = 0.0
        self.trial_until = 0.0
        self.failures = 0
        if was_ejected:
            log.info("backend %s: endpoint %s back in rotation", self.backend.name, self.label)
        self.reason = None
        self._mark(True)

    def _mark(self, up: bool) -> None:
        if self.removed:
            return
        if self.up is not up:
            self.up = up
            metrics.BACKEND_ENDPOINT_UP.labels(self.backend.name, self.label).set(1 if up else 0)
        self.backend.endpoint_changed()


class BackendHealth:
    """A backend's endpoints' health, and what the rest of the gateway asks of it."""

    def __init__(self, name: str, settings: HealthSettings, endpoints: tuple[str, ...] = ("default",),
                 targets: Sequence[Any] | None = None) -> None:
        self.name = name
        self.settings = settings
        self.endpoints = [EndpointHealth(self, label, settings, None if targets is None else targets[i])
                          for i, label in enumerate(endpoints)]
        # The endpoint the dispatcher's whole-call reports go to (`succeeded`, `failed`; read
        # by the dispatcher inline); None once the backend reports per endpoint.
        self.single = self.endpoints[0] if len(self.endpoints) == 1 else None
        # True when no endpoint is in rotation: the one flag the hot path reads.
        self.ejected = False
        self.up: bool | None = None
        self.listeners: list[Listener] = []
        # Told of each endpoint as it is ejected (a backend that keeps something on an
        # endpoint, a legacy session, moves it).
        self.ejection_listeners: list[Callable[[EndpointHealth], None]] = []

    # -- the request path -------------------------------------------------------------

    def admit(self, request_id: rpc.RequestId | None = None) -> None:
        """Raise -31001 at once when every endpoint is ejected and none is due a trial."""
        now = time.monotonic()
        for endpoint in self.endpoints:
            if endpoint.admits(now):
                return
        raise self.unavailable(request_id)

    def unavailable(self, request_id: rpc.RequestId | None = None) -> rpc.McpError:
        reason = self.reason or "ejected"
        wait = max(0.0, min(e.ejected_until for e in self.endpoints) - time.monotonic())
        error = rpc.backend_unavailable(self.name, f"ejected after failing ({reason}); next try in {wait:.1f}s",
                                        request_id)
        error.data = {**(error.data or {}), "reason": reason}
        return error

    @property
    def reason(self) -> str | None:
        for endpoint in self.endpoints:
            if endpoint.reason is not None:
                return endpoint.reason
        return None

    # What the dispatcher reports of a whole call. With one endpoint it is that endpoint's;
    # a backend with several reports each request to the endpoint that served it itself
    # (modern.py), since only it knows which one that was.
    def succeeded(self) -> None:
        if self.single is not None:
            self.single.succeeded()

    def failed(self, reason: str) -> None:
        if self.single is not None:
            self.single.failed(reason)

    # -- the endpoint set ----------------------------------------------------------------

    def reported_per_endpoint(self) -> None:
        """The backend reports each request to the endpoint that served it (its set may
        change: DNS expansion, instances): the dispatcher's whole-call reports are ignored."""
        self.single = None

    def add(self, label: str, target: Any = None) -> EndpointHealth:
        """A new endpoint, in rotation with fresh health (nothing said of it yet)."""
        self.single = None
        endpoint = EndpointHealth(self, label, self.settings, target)
        self.endpoints.append(endpoint)
        # In rotation from now on, which its series says at once (an address that joined
        # the answer shows before its first call).
        metrics.BACKEND_ENDPOINT_UP.labels(self.name, label).set(1)
        log.info("backend %s: endpoint %s added", self.name, label)
        return endpoint

    def remove(self, endpoint: EndpointHealth) -> None:
        """Out of the set: no new call goes to it, the calls under way on it finish (it is
        drained, not ejected), and its metric series goes."""
        self.single = None
        with contextlib.suppress(ValueError):
            self.endpoints.remove(endpoint)
        endpoint.removed = True
        with contextlib.suppress(KeyError):
            metrics.BACKEND_ENDPOINT_UP.remove(self.name, endpoint.label)
        log.info("backend %s: endpoint %s removed (%d call(s) under way finish there)", self.name, endpoint.label,
                 endpoint.in_flight)
        self.endpoint_changed()

    # -- the cap and the summary -------------------------------------------------------

    def may_eject(self, endpoint: EndpointHealth) -> bool:
        out = sum(1 for e in self.endpoints if e.ejected and e is not endpoint)
        if out == 0:
            return True  # at least one may always be ejected
        return (out + 1) * 100 <= len(self.endpoints) * self.settings.max_ejected_percent

    def endpoint_changed(self) -> None:
        if not self.endpoints:
            return  # between a removal and an addition (endpoints.reconcile adds first)
        ejected = all(e.ejected for e in self.endpoints)
        states = [e.up for e in self.endpoints]
        up: bool | None = True if any(s is True for s in states) and not ejected else (
            None if all(s is None for s in states) else False)
        self.ejected = ejected
        if up is self.up or up is None:
            return
        self.up = up
        metrics.BACKEND_UP.labels(self.name).set(1 if up else 0)
        if up:
            log.info("backend %s: up", self.name)
        else:
            log.warning("backend %s: down: %s", self.name, self.reason or "failing")
        for listener in self.listeners:
            listener(self.name, up, None if up else self.reason)

    def state(self) -> str:
        """'ok', 'unknown' (nothing said yet), or why it is not ok."""
        if self.up is True:
            return "ok"
        if self.up is None:
            return "unknown"
        return self.reason or "failing"
