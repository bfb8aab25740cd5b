"""One request in flight to a backend that multiplexes many on one channel (a stdio pipe, a
legacy session): the messages the backend relates to it, in order, ending with its response.
Used by the modern stdio backend and by every initialize-era session."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from gateway.protocol import jsonrpc as rpc

Message = dict[str, Any]


def is_request_id(value: Any) -> bool:
    """Whether `value` can be a JSON-RPC request id (string or number; MCP forbids null): the
    only ids tracked, and a guard against unhashable junk from a misbehaving backend."""
    return isinstance(value, (str, int, float))


class Exchange:
    """One backend request in flight: the messages the backend relates to it, in order,
    ending with its response. One consumer at a time reads them with `next()` (the call's
    answer, later its MRTR retry). A deque and one waiter future rather than an
    asyncio.Queue: the queue's setup and bookkeeping were a visible part of a warm legacy call."""

    __slots__ = ("backend_id", "method", "progress_token", "wants_logs", "done", "started", "waiting_for_client",
                 "open_requests", "_items", "_waiter")

    def __init__(self, backend_id: int, method: str) -> None:
        self.backend_id = backend_id
        self.method = method
        self.progress_token: str | None = None
        self.wants_logs = False
        self.done = False
        self.started = time.monotonic()
        # Parked for an MRTR retry: its backend call is blocked on the gateway's answers.
        self.waiting_for_client = False
        # The ids of the backend's requests that came with this exchange and still wait for the
        # gateway's answer: the gateway answers them (`LegacySession.respond`) or the backend
        # withdraws them (`withdraw`). What a parked call may still answer or ask the client (§h.5).
        self.open_requests: set[Any] = set()
        self._items: collections.deque[Message | rpc.McpError] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, message: Message) -> None:
        if "method" not in message:
            self.done = True
        elif is_request_id(message.get("id")):  # a backend request
            self.open_requests.add(message["id"])
        self._push(message)

    def withdraw(self, request_id: Any, cancellation: Message) -> None:
        """The backend cancelled its request `request_id` (L-CAN): it expects no answer any
        more. The cancellation is queued too, so that a reader gathering requests for an
        InputRequiredResult wakes and leaves it out (§h.5); readers never relay it."""
        self.open_requests.discard(request_id)
        self._push(cancellation)

    def prune(self, requests: dict[str, Message]) -> None:
        """Remove from `requests` (inputRequests key → backend request) those no longer open,
        which the backend withdrew (or the gateway already answered): they are neither
        answered nor asked of the client."""
        for key in [key for key, request in requests.items()
                    if is_request_id(request.get("id")) and request["id"] not in self.open_requests]:
            del requests[key]

    def fail(self, error: rpc.McpError) -> None:
        if not self.done:
            self.done = True
            self._push(error)

    def _push(self, item: Message | rpc.McpError) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _take(self) -> Message:
        item = self._items.popleft()
        if isinstance(item, rpc.McpError):
            raise item
        return item

    async def _arrival(self, timeout: float | None) -> None:
        """Until something is queued; TimeoutError after `timeout` seconds."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._waiter
        finally:
            self._waiter = None

    def ready(self) -> Message | None:
        """The next message if one is already waiting (no suspension)."""
        return self._take() if self._items else None

    def peek_response_only(self) -> Message | None:
        """The response, when it is the only thing waiting (the common JSON case)."""
        if len(self._items) == 1 and self.done:
            return self._take()
        return None

    async def next_within(self, seconds: float) -> Message | None:
        """The next message if one arrives within `seconds`, else None."""
        if not self._items:
            try:
                await self._arrival(seconds)
            except TimeoutError:
                return None
        return self._take()

    async def next(self, timeout: float | None) -> Message:
        # The common JSON answer is already here when the request returns: no timer then.
        if not self._items:
            try:
                await self._arrival(timeout)
            except TimeoutError:
                raise rpc.McpError(rpc.BACKEND_TIMEOUT, f"no message for {self.method} within {timeout:g}s",
                                   status=504) from None
        return self._take()

    async def next_by(self, deadline: float, timeout: float, overdue: Callable[[], rpc.McpError]) -> Message:
        """`next(timeout)`, but no later than `deadline` (time.monotonic()): past it, the error
        `overdue()` makes (a call's max_call_seconds, however often the backend sends progress).
        One timer per wait, the shorter of the two."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise overdue()
        if remaining >= timeout:
            return await self.next(timeout)
        try:
            return await self.next(remaining)
        except rpc.McpError as exc:
            if exc.code == rpc.BACKEND_TIMEOUT:
                raise overdue() from None
            raise
