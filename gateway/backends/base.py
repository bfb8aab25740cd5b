"""The backend interface.

Like httpx's transport, a backend has one working method: `send(call) -> Reply`. Everything
clever (routing, aggregation, caching, the subscription hub) lives above it, and every
protocol era lives below it, so a new era or transport is a new subclass and nothing else.

`subscriptions/listen` is just a call whose reply is a long-lived stream, so the hub needs no
extra method. `discover()` is a convenience over `send` that the gateway uses for itself.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway.backends.concurrency import CallLimiter
from gateway.backends.health import BackendHealth
from gateway.backends.endpoints import HttpTarget
from gateway.backends.retry import RetryBudget, send_with_retries
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.methods import METHODS
from gateway.protocol.request import Call
from gateway.protocol.versions import LATEST_MODERN
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends")

Message = dict[str, Any]

# How long a failed server/discover is remembered (and re-raised without asking again).
DISCOVER_FAILURE_MEMORY_SECONDS = 5.0


@dataclass(slots=True)
class Reply:
    """A backend's answer to one call: a complete message, or a stream of messages that ends
    with the final response (notifications scoped to the request come first)."""

    backend: str
    status: int = 200
    message: Message | None = None
    stream: AsyncIterator[Message] | None = None
    # The body as received, when it can be relayed unchanged (saves one encode).
    raw: bytes | None = None
    # Extra response headers for the client (e.g. X-Cache), set above the backend.
    headers: list[tuple[bytes, bytes]] | None = None
    # Run by `aclose()`: what must be released even if the stream was never iterated (an
    # async generator that never started runs no `finally` when closed).
    closers: list[Callable[[], None]] = field(default_factory=list)

    async def final(self) -> Message:
        """The final JSON-RPC response; notifications on a stream are dropped."""
        if self.message is not None:
            return self.message
        assert self.stream is not None
        last: Message | None = None
        try:
            async for msg in self.stream:
                if "method" not in msg:
                    last = msg
                    break
        finally:
            await aclose(self.stream)
        if last is None:
            raise rpc.backend_protocol_error(self.backend, "stream ended without a response")
        self.message = last
        return last

    async def aclose(self) -> None:
        try:
            if self.stream is not None:
                await aclose(self.stream)
        finally:
            for closer in self.closers:
                closer()


async def aclose(stream: AsyncIterator[Any]) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        await closer()


def _text_of(result: Message) -> str:
    """The text a tool result carries: its text blocks and its structured content."""
    parts = [block.get("text", "") for block in result.get("content") or ()
             if isinstance(block, dict) and isinstance(block.get("text"), str)]
    if "structuredContent" in result:
        parts.append(orjson.dumps(result["structuredContent"]).decode())
    return "\n".join(parts)


def internal_call(method: str, params: dict[str, Any] | None = None, *, request_id: rpc.RequestId = 0) -> Call:
    """A request the gateway makes on its own behalf (discovery, hub listens, index refresh)."""
    p = dict(params or {})
    p["_meta"] = {
        meta.PROTOCOL_VERSION: LATEST_MODERN,
        meta.CLIENT_CAPABILITIES: {},
        **p.get("_meta", {}),
    }
    spec = METHODS.get(method)
    name = p.get(spec.name_field) if spec and spec.name_field else None
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": p})
    return Call(request_id, method, p, LATEST_MODERN, spec, name, body, {})


class Backend(abc.ABC):
    """One upstream MCP server."""

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self._discovered: Message | None = None
        self._discovered_at = 0.0
        self._discover_lock = asyncio.Lock()
        self._discover_failure: rpc.McpError | None = None
        self._discover_failed_at = 0.0
        self.last_error: str | None = None
        # Remembered health and the concurrency bound (docs/resilience.md): built from the
        # settings alone, so a reload that keeps these settings can keep this backend whole.
        self.health = BackendHealth(settings.name, settings.health, self.endpoint_labels(), self.endpoint_targets())
        if settings.resolve is not None:
            self.health.reported_per_endpoint()  # its set changes with the DNS answer (resolve.py)
        self.limiter = (None if settings.max_concurrent_calls is None else CallLimiter(
            settings.name, settings.max_concurrent_calls, max_queued=settings.max_queued_calls,
            wait=settings.queue_wait_seconds))
        self.retry_budget = RetryBudget(settings.retry_budget_percent, settings.retry_budget_min_per_second)
        # The clock of the discovery cache and failure memory (a test's ManualClock).
        self.clock: Callable[[], float] = time.monotonic
        # Client calls under way (counted by the dispatcher, the one place they all pass):
        # what `drain` waits for when a reload removes or replaces this backend.
        self.in_flight = 0

    def endpoint_labels(self) -> tuple[str, ...]:
        """What the health metrics call each endpoint: its origin, or the process."""
        if self.settings.url is not None:
            origins = tuple(f"{p.scheme}://{p.netloc}" for p in map(urlsplit, self.settings.endpoint_urls))
            # Two endpoints on one origin (different paths) are told apart by their whole URL.
            return origins if len(set(origins)) == len(origins) else self.settings.endpoint_urls
        if self.settings.instances > 1:
            return tuple(f"instance-{i}" for i in range(self.settings.instances))  # stdio_instances.py
        return ("process",)

    def endpoint_targets(self) -> tuple[HttpTarget, ...] | None:
        """Where each endpoint's requests go (HTTP backends: its URL), beside its label."""
        if self.settings.url is None:
            return None
        return tuple(HttpTarget(url) for url in self.settings.endpoint_urls)

    @property
    def spread(self) -> bool:
        """Whether calls choose among endpoints (several URLs, or a DNS answer's addresses)."""
        return len(self.settings.endpoint_urls) > 1 or self.settings.resolve is not None

    async def check_endpoint(self, index: int) -> None:
        """An active check of one endpoint; a backend with one endpoint checks itself."""
        await self.health_check()

    async def health_check(self) -> None:
        """One active check (health_checks.py), raising McpError when it fails: the canary
        `tools/call` when one is configured, else a fresh `server/discover` (for stdio, a
        round trip through the live process) and `round_trip` (for a legacy backend, whose
        `server/discover` is its open session's initialize, a `ping` on that session)."""
        canary = self.settings.health.canary
        if canary is None:
            await self.discover(max_age=0)
            await self.round_trip()
            return
        reply = await self.send(internal_call("tools/call", {"name": canary.tool, "arguments": canary.arguments}))
        message = await reply.final()
        result = message.get("result")
        if not isinstance(result, dict) or result.get("isError"):
            error = message.get("error") or {}
            raise rpc.backend_unavailable(self.name, f"canary {canary.tool!r} failed: "
                                          f"{error.get('message') or 'isError result'}")
        if canary.expect is not None and canary.expect not in _text_of(result):
            raise rpc.backend_unavailable(self.name, f"canary {canary.tool!r} answered without {canary.expect!r}")

    async def round_trip(self) -> None:
        """What an active check adds to `discover(max_age=0)` so that it reaches the backend:
        nothing here, where that discovery is itself a request to it."""

    @abc.abstractmethod
    async def send(self, call: Call) -> Reply:
        """Deliver one call and return the answer. Raises McpError for gateway-made failures
        (unreachable, timeout, protocol violation); a backend's own JSON-RPC error is a Reply."""

    def overdue(self, call: Call) -> rpc.McpError:
        """-31002 for a call that ran past `max_call_seconds`, however much progress the
        backend sent (SHTTP: senders SHOULD enforce a maximum duration)."""
        limit = self.settings.max_call_seconds
        return rpc.McpError(
            rpc.BACKEND_TIMEOUT,
            f"Backend {self.name!r} did not finish {call.method} within {limit:g}s (backends[].max_call_seconds)",
            status=504, data={"backend": self.name, "limit": "backends[].max_call_seconds"}, request_id=call.id)

    async def start(self) -> None:
        """Open pools, spawn processes. Must not fail when the backend is down."""

    async def aclose(self) -> None:
        """Release everything; called once at shutdown."""

    async def drain(self, deadline_seconds: float, poll_seconds: float = 0.05) -> None:
        """A reload removed or replaced this backend: let the calls under way finish (at most
        `deadline_seconds`), then release it. No new call reaches it: the new snapshot no
        longer routes to it."""
        waited = 0.0
        while self.in_flight > 0 and waited < deadline_seconds:
            await asyncio.sleep(poll_seconds)
            waited += poll_seconds
        if self.in_flight > 0:
            log.warning("backend %s: %d call(s) still under way after %gs of drain; closing it anyway",
                        self.name, self.in_flight, deadline_seconds)
        await self.aclose()

    @property
    def capabilities(self) -> dict[str, Any] | None:
        """The backend's advertised capabilities, or None while unknown."""
        if self._discovered is None:
            return None
        caps = self._discovered.get("capabilities")
        return caps if isinstance(caps, dict) else {}

    @property
    def discover_result(self) -> Message | None:
        return self._discovered

    async def discover(self, *, max_age: float = 300.0, stale_ok: bool = False) -> Message:
        """The backend's DiscoverResult, refreshed when older than `max_age` seconds.

        A refresh gets `list_timeout_seconds`, however many retries `send` makes inside it. A
        failed refresh is remembered for `DISCOVER_FAILURE_MEMORY_SECONDS` and re-raised at once
        meanwhile, so a dead backend costs one deadline per few seconds, not one per request
        (`max_age=0` asks for an answer now and skips that memory). With `stale_ok` the last
        known result stands in when a refresh fails, is late, or is already under way for
        another caller; otherwise the failure is raised."""
        now = self.clock()
        if self._discovered is not None and now - self._discovered_at < max_age:
            return self._discovered
        if stale_ok and self._discovered is not None and (
                self._discover_lock.locked() or self._failed_recently(max_age)):
            return self._discovered
        if self._failed_recently(max_age):
            raise self._remembered_failure()
        async with self._discover_lock:
            # Another caller may have refreshed (or failed) while this one waited.
            if self._discovered is not None and self.clock() - self._discovered_at < max_age:
                return self._discovered
            if self._failed_recently(max_age):
                if stale_ok and self._discovered is not None:
                    return self._discovered
                raise self._remembered_failure()
            deadline = self.settings.list_timeout_seconds
            try:
                async with asyncio.timeout(deadline):
                    result = await self._fetch_discover()
            except TimeoutError:
                failure = rpc.McpError(
                    rpc.BACKEND_TIMEOUT,
                    f"Backend {self.name!r}: server/discover got no answer within {deadline:g}s "
                    "(backends[].list_timeout_seconds)", status=504, data={"backend": self.name})
            except rpc.McpError as exc:
                failure = exc
            else:
                self._discovered, self._discovered_at = result, self.clock()
                self._discover_failure = None
                self.last_error = None
                return result
            self._discover_failure, self._discover_failed_at = failure, self.clock()
            self.last_error = failure.message
            if stale_ok and self._discovered is not None:
                log.warning("backend %s: server/discover refresh failed (%s); serving the last known result",
                            self.name, failure.message)
                return self._discovered
            raise self._remembered_failure()

    async def _fetch_discover(self) -> Message:
        reply = await send_with_retries(self, internal_call("server/discover"))
        msg = await reply.final()
        result = msg.get("result")
        if not isinstance(result, dict):
            err = msg.get("error") or {}
            raise rpc.backend_protocol_error(
                self.name, f"server/discover failed: {err.get('code')} {err.get('message')}"
            )
        return result

    def _failed_recently(self, max_age: float) -> bool:
        return (max_age > 0 and self._discover_failure is not None
                and self.clock() - self._discover_failed_at < DISCOVER_FAILURE_MEMORY_SECONDS)

    def _remembered_failure(self) -> rpc.McpError:
        """A fresh copy per raise: an McpError takes on each request's id (`with_id`)."""
        f = self._discover_failure
        assert f is not None
        return rpc.McpError(f.code, f.message, status=f.status, data=f.data)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
