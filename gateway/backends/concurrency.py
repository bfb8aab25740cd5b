"""`backends[].max_concurrent_calls`: calls in flight to one backend, with a short queue.

A backend that is already drowning gets no more work: past the limit a call waits up to
`queue_wait_seconds` among at most `max_queued_calls` others, then fails at once with -31004
(HTTP 503) naming the backend, rather than piling up on it (docs/resilience.md). Listen
streams are not calls and are not counted; a streamed answer holds its slot until it ends.

A slot freed while calls wait is handed to the oldest waiter directly, so a newcomer can never
overtake the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc


class CallLimiter:
    __slots__ = ("name", "limit", "max_queued", "wait", "in_flight", "_waiters")

    def __init__(self, name: str, limit: int, *, max_queued: int, wait: float) -> None:
        self.name = name
        self.limit = limit
        self.max_queued = max_queued
        self.wait = wait
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, request_id: rpc.RequestId | None = None) -> None:
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return
        if len(self._waiters) >= self.max_queued or self.wait <= 0:
            raise self._refused(request_id)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.wait):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as this caller gave up: pass it on.
                self.release()
            else:
                waiter.cancel()
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            if isinstance(exc, TimeoutError):
                raise self._refused(request_id) from None
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands; in_flight stays
                return
        self.in_flight -= 1

    def _refused(self, request_id: rpc.RequestId | None) -> rpc.McpError:
        metrics.BACKEND_OVERLOADED.labels(self.name).inc()
        return rpc.gateway_overloaded(
            f"Backend {self.name!r} is at its limit of {self.limit} concurrent calls with {len(self._waiters)} "
            f"waiting (backends[].max_concurrent_calls)", limit="backends[].max_concurrent_calls",
            data={"backend": self.name}, request_id=request_id)


class Slot:
    """One acquired slot, released once whichever way the call ends (a Reply's closer, the
    end of its stream, or an error before any Reply)."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: CallLimiter) -> None:
        self._limiter: CallLimiter | None = limiter

    def release(self) -> None:
        limiter, self._limiter = self._limiter, None
        if limiter is not None:
            limiter.release()
