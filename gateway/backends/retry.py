"""Retries for every backend kind (docs/resilience.md "Retries").

What may be sent again, whatever the transport: a call that provably never reached the
backend (no connection could be made, the stdio process was not running: `errors.never_sent`)
whatever its method, and an idempotent read (lists, resources/read, server/discover) after
-31001/-31002 or an HTTP 502/503/504. Never after a byte reached the client: a retry happens
before any Reply leaves the dispatcher, and a streamed answer is never retried.

Each retry waits a jittered exponential backoff ("full jitter": uniform in [0, min(cap,
base·2^n)]) and spends a token of the backend's `RetryBudget`, so that a brown-out is not
amplified: retries stay within `retry_budget_percent` of the calls made, plus a small
allowance per second for quiet backends.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from gateway.backends.errors import never_sent
from gateway.observability import metrics
from gateway.observability.backend_call import next_attempt
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.settings import BackendSettings

if TYPE_CHECKING:
    from gateway.backends.base import Backend, Reply

log = logging.getLogger("gateway.backends.retry")

RETRYABLE_STATUS = frozenset({502, 503, 504})
Reason = Literal["unsent", "idempotent"]


class RetryBudget:
    """Finagle's retry budget: every call deposits `percent`/100 of a token (up to a bound),
    every retry withdraws one; `min_per_second` tokens are granted per second on top, so a
    backend with little traffic can still be retried."""

    __slots__ = ("ratio", "min_per_second", "_balance", "_reserve", "_refilled", "full")

    # The most tokens calls can bank: a long quiet spell does not save up a retry storm.
    _MAX_BALANCE = 100.0

    def __init__(self, percent: float, min_per_second: float) -> None:
        self.ratio = percent / 100.0
        self.min_per_second = min_per_second
        self._balance = 0.0
        self._reserve = min_per_second
        self._refilled = time.monotonic()
        # At the bound, where a backend that is not retried stays: a deposit changes nothing,
        # and the dispatcher skips it (one call less per request).
        self.full = False

    def deposit(self) -> None:
        balance = self._balance + self.ratio
        if balance < self._MAX_BALANCE:
            self._balance = balance
        else:
            self._balance = self._MAX_BALANCE
            self.full = True

    def withdraw(self) -> bool:
        if self._balance >= 1.0:
            self._balance -= 1.0
            self.full = False
            return True
        now = time.monotonic()
        self._reserve = min(self.min_per_second, self._reserve + (now - self._refilled) * self.min_per_second)
        self._refilled = now
        if self._reserve >= 1.0:
            self._reserve -= 1.0
            return True
        return False


def reason_to_retry(call: Call, error: rpc.McpError | None, status: int = 0) -> Reason | None:
    """Why this failure may be retried, or None. `error` is the raised failure, or None for a
    Reply with HTTP `status`."""
    if error is not None and never_sent(error):
        return "unsent"
    if call.spec is None or not call.spec.idempotent:
        return None
    if error is not None:
        return "idempotent" if error.code in (rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT) else None
    return "idempotent" if status in RETRYABLE_STATUS else None


def backoff(settings: BackendSettings, attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first)."""
    ceiling = min(settings.retry_backoff_max_seconds, settings.retry_backoff_seconds * (2 ** attempt))
    return random.uniform(0, ceiling)


async def send_with_retries(backend: Backend, call: Call, failed: Callable[[str], None] | None = None) -> Reply:
    """`backend.send(call)`, sent again while the failure allows it (`reason_to_retry`), up to
    `backends[].retries` times, within the budget, never to an ejected backend. `failed` hears
    every failed attempt (the dispatcher feeds the backend's health with it)."""
    backend.retry_budget.deposit()
    try:
        reply = await backend.send(call)
    except rpc.McpError as exc:
        return await retry_after(backend, call, failed, error=exc)
    if reply.status >= 500:
        return await retry_after(backend, call, failed, reply=reply)
    return reply


async def retry_after(backend: Backend, call: Call, failed: Callable[[str], None] | None, *,
                      error: rpc.McpError | None = None, reply: Reply | None = None) -> Reply:
    """After a first attempt that failed (`error`) or answered 5xx (`reply`): the retries, or
    the failure as it stands. The dispatcher sends the first attempt itself, so that the calls
    that succeed at once (nearly all) pay for none of this."""
    settings = backend.settings
    attempt = 0
    while True:
        if error is not None:
            if failed is not None and error.code in (rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT):
                failed(error.message)
            reason = reason_to_retry(call, error) if attempt < settings.retries else None
            if reason is None or not _may_retry(backend, reason):
                raise error
            log.info("retrying %s on %s (%s) after: %s", call.method, backend.name, reason, error.message)
            # Each attempt its own CLIENT span (the failed one ends with its code).
            call = next_attempt(call, str(error.code), error.message)
        else:
            assert reply is not None
            if reply.status < 500:
                return reply
            if failed is not None:
                failed(f"HTTP {reply.status}")
            reason = (reason_to_retry(call, None, reply.status)
                      if attempt < settings.retries and reply.stream is None else None)
            if reason is None or not _may_retry(backend, reason):
                return reply
            await reply.aclose()
            call = next_attempt(call, str(reply.status), f"HTTP {reply.status}")
        await asyncio.sleep(backoff(settings, attempt))
        attempt += 1
        error = reply = None
        try:
            reply = await backend.send(call)
        except rpc.McpError as exc:
            error = exc


def _may_retry(backend: Backend, reason: Reason) -> bool:
    if backend.health.ejected:
        return False  # the failure ejected it: the retry would fail fast anyway
    if not backend.retry_budget.withdraw():
        metrics.BACKEND_RETRIES.labels(backend.name, reason, "over_budget").inc()
        return False
    metrics.BACKEND_RETRIES.labels(backend.name, reason, "sent").inc()
    return True
