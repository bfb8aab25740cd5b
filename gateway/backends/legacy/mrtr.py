"""Legacy server-to-client requests as MRTR (digest §h.5, strategy B): continuations and the
sealed `requestState` that points at them.

A parked continuation holds a live backend stream, so it lives on the replica that started
it (the owner). The client's retry may land on any replica; the owner's address travels
inside the sealed state, and a replica that is not the owner forwards the retry to it,
unchanged, over the owner's ordinary MCP endpoint (docs/legacy.md explains why this beats a
Redis mailbox). The state is an HMAC-SHA256 over its payload: the client can read but not
forge it, which is all MRTR asks (MRTR §Server requirements: integrity, principal, expiry,
binding to the originating request).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.backends.errors import upstream_errors
from gateway.backends.http1 import Http1Client, UpstreamResponse
from gateway.backends.replica import UNADVERTISED
from gateway.observability import metrics
from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call

log = logging.getLogger("gateway.backends.legacy.mrtr")

Message = dict[str, Any]
STATE_VERSION = "g1"
FORWARDED_HEADER = "x-mcp-gateway-forwarded"
# Headers of the client's retry that the owner replica needs to validate and authenticate it;
# every `Mcp-Param-*` header too, since the owner checks them against the tool's x-mcp-header
# parameters again (SHTTP §Server Behavior for Custom Headers).
_FORWARD_HEADERS = frozenset({"content-type", "accept", "authorization", "mcp-protocol-version", "mcp-method",
                              "mcp-name", "traceparent", "tracestate", "baggage"})


class StateError(Exception):
    """requestState that fails verification, has expired, or belongs to another request."""


class StateSealer:
    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"mcp-gateway/requestState/" + secret).digest()

    def seal(self, payload: dict[str, Any]) -> str:
        body = base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=")
        mac = base64.urlsafe_b64encode(hmac.new(self._key, body, hashlib.sha256).digest()).rstrip(b"=")
        return f"{STATE_VERSION}.{body.decode()}.{mac.decode()}"

    def open(self, token: Any, *, now: float | None = None) -> dict[str, Any]:
        if not isinstance(token, str):
            raise StateError("requestState must be a string")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != STATE_VERSION:
            raise StateError("requestState was not minted by this gateway")
        body, mac = parts[1].encode(), parts[2].encode()
        expected = base64.urlsafe_b64encode(hmac.new(self._key, body, hashlib.sha256).digest()).rstrip(b"=")
        if not hmac.compare_digest(mac, expected):
            raise StateError("requestState failed its integrity check")
        try:
            payload = orjson.loads(base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4)))
        except (ValueError, orjson.JSONDecodeError):
            raise StateError("requestState is malformed") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("exp"), (int, float)):
            raise StateError("requestState is malformed")
        if (now if now is not None else time.time()) > payload["exp"]:
            raise StateError("requestState has expired")
        return payload


def request_digest(call: Call) -> str:
    """What binds a retry to the original request: method + params, minus what a retry
    legitimately changes (`_meta`, `inputResponses`, `requestState`)."""
    params = {k: v for k, v in call.params.items() if k not in ("_meta", "inputResponses", "requestState")}
    canonical = orjson.dumps({"m": call.method, "p": params}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


@dataclass(eq=False)
class Continuation:
    """A backend call parked on backend requests the client must answer."""

    id: str
    backend: str
    session: Any  # LegacySession
    exchange: Any  # Exchange
    # inputRequests key → the backend's request (its id and method).
    pending: dict[str, Message]
    expires_at: float
    on_expire: Callable[[Continuation], Any] = field(repr=False, default=lambda c: None)
    timer: asyncio.TimerHandle | None = None
    principal: str = "anonymous"


class Continuations:
    """The continuations this replica owns for one backend. Single use: a retry takes its
    continuation out. Each holds a backend request open (and its session busy) until the
    retry or `input_wait_seconds`, so their number is capped, overall and per principal: a
    client that never retries cannot pile them up."""

    def __init__(self, backend: str = "", *, max_total: int = 1000, max_per_principal: int = 100) -> None:
        self.backend = backend
        self.max_total = max_total
        self.max_per_principal = max_per_principal
        self._parked: dict[str, Continuation] = {}
        self._per_principal: dict[str, int] = {}
        self._gauge = metrics.MRTR_PARKED.labels(backend)

    def __len__(self) -> int:
        return len(self._parked)

    def refusal(self, principal: str) -> rpc.McpError | None:
        """Why one more continuation for `principal` cannot be parked, or None."""
        if len(self._parked) >= self.max_total:
            metrics.MRTR_REFUSED.labels(self.backend, "total").inc()
            return rpc.gateway_overloaded(
                f"Backend {self.backend!r}: {self.max_total} calls already wait for an MRTR retry on this replica "
                "(backends[].max_parked_calls); retry later",
                limit="backends[].max_parked_calls", data={"backend": self.backend, "max": self.max_total})
        if self._per_principal.get(principal, 0) >= self.max_per_principal:
            metrics.MRTR_REFUSED.labels(self.backend, "per_principal").inc()
            err = rpc.gateway_overloaded(
                f"Backend {self.backend!r}: this caller already has {self.max_per_principal} calls waiting for an "
                "MRTR retry (backends[].max_parked_calls_per_principal); answer or abandon those first",
                limit="backends[].max_parked_calls_per_principal",
                data={"backend": self.backend, "max": self.max_per_principal})
            err.status = 429
            return err
        return None

    def park(self, continuation: Continuation) -> None:
        self._parked[continuation.id] = continuation
        self._per_principal[continuation.principal] = self._per_principal.get(continuation.principal, 0) + 1
        self._gauge.set(len(self._parked))
        delay = max(0.0, continuation.expires_at - time.time())
        continuation.timer = asyncio.get_running_loop().call_later(delay, self._expire, continuation.id)

    def take(self, continuation_id: str) -> Continuation | None:
        continuation = self._remove(continuation_id)
        if continuation is not None and continuation.timer is not None:
            continuation.timer.cancel()
        return continuation

    def _remove(self, continuation_id: str) -> Continuation | None:
        continuation = self._parked.pop(continuation_id, None)
        if continuation is not None:
            left = self._per_principal.get(continuation.principal, 1) - 1
            if left > 0:
                self._per_principal[continuation.principal] = left
            else:
                self._per_principal.pop(continuation.principal, None)
            self._gauge.set(len(self._parked))
        return continuation

    def _expire(self, continuation_id: str) -> None:
        continuation = self._remove(continuation_id)
        if continuation is not None:
            log.info("backend %s: MRTR continuation %s expired without a retry", continuation.backend,
                     continuation_id)
            continuation.on_expire(continuation)

    def close_all(self) -> None:
        for continuation_id in list(self._parked):
            self._expire(continuation_id)


class Forwarder:
    """Relays an MRTR retry to the replica that owns its continuation, over the same pooled
    upstream client as backend calls."""

    def __init__(self, backend: str, timeout: float, connect_timeout: float) -> None:
        self.backend = backend
        self.timeout = timeout
        self._client = Http1Client(backend, max_connections=64, connect_timeout=connect_timeout)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def forward(self, call: Call, owner: str) -> AsyncIterator[Message] | Message:
        backend = self.backend
        if owner.startswith(UNADVERTISED):
            raise rpc.backend_unavailable(
                backend, "this requestState belongs to a call parked on another gateway replica that advertises no "
                         "address (its security.advertise_url is unset), so the retry cannot be forwarded there; "
                         "set security.advertise_url on every replica", call.id)
        headers = {k: v for k, v in call.headers.items() if k in _FORWARD_HEADERS or k.startswith(h.PARAM_PREFIX)}
        headers[FORWARDED_HEADER] = "1"
        headers["accept"] = "application/json, text/event-stream"
        where = f"the replica {owner} that owns this requestState"
        try:
            response = await self._client.post(owner, call.body, headers, read_timeout=self.timeout,
                                               request_id=call.id)
        except rpc.McpError as exc:
            exc.message = f"{exc.message} (forwarding the MRTR retry to {where})"
            raise
        if response.content_type == "text/event-stream":
            return _relay_events(response, backend, where, call.id, self.timeout)
        with upstream_errors(backend, timeout=self.timeout, request_id=call.id,
                             what=f"reading the answer of {where}"):
            body = await response.read()
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise rpc.backend_protocol_error(backend, f"{where} answered HTTP {response.status} without JSON",
                                             call.id) from None
        if not isinstance(message, dict):
            raise rpc.backend_protocol_error(backend, f"{where} answered a non-object", call.id)
        return message


async def _relay_events(response: UpstreamResponse, backend: str, where: str, request_id: Any, timeout: float
                        ) -> AsyncIterator[Message]:
    messages = response.sse_messages()
    try:
        with upstream_errors(backend, timeout=timeout, request_id=request_id, what=f"stream from {where} broke"):
            async for payload in messages:
                if isinstance(payload, dict):
                    yield payload
    finally:
        await messages.aclose()


def new_continuation_id() -> str:
    return secrets.token_urlsafe(16)
