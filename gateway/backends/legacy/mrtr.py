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

import httpx
import orjson
from httpx_sse import EventSource

from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.backends.legacy.mrtr")

Message = dict[str, Any]
STATE_VERSION = "g1"
FORWARDED_HEADER = "x-mcp-gateway-forwarded"
# Headers of the client's retry that the owner replica needs to validate and authenticate it.
_FORWARD_HEADERS = ("content-type", "accept", "authorization", "mcp-protocol-version", "mcp-method", "mcp-name",
                    "traceparent", "tracestate", "baggage")


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


_PROCESS_SECRET: bytes | None = None


def sealer_from_settings(settings: GatewaySettings) -> StateSealer:
    global _PROCESS_SECRET
    secret = settings.security.secret
    if secret:
        return StateSealer(secret.encode())
    if _PROCESS_SECRET is None:
        _PROCESS_SECRET = secrets.token_bytes(32)
    return StateSealer(_PROCESS_SECRET)


def warn_if_ephemeral(settings: GatewaySettings) -> None:
    global _WARNED
    if not settings.security.secret and not _WARNED:
        _WARNED = True
        log.warning("security.secret is not set: MRTR requestState is sealed with a random per-process key, "
                    "so retries only work on this replica; several replicas need a shared one "
                    "(MCP_GATEWAY_SECURITY__SECRET)")


_WARNED = False


def owner_url(settings: GatewaySettings) -> str:
    if settings.security.advertise_url:
        return settings.security.advertise_url
    server = settings.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    return f"http://{host}:{server.port}{server.path}"


def request_digest(call: Call) -> str:
    """What binds a retry to the original request: method + params, minus what a retry
    legitimately changes (`_meta`, `inputResponses`, `requestState`)."""
    params = {k: v for k, v in call.params.items() if k not in ("_meta", "inputResponses", "requestState")}
    canonical = orjson.dumps({"m": call.method, "p": params}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def principal_key(call: Call) -> str:
    key = getattr(call.principal, "key", None)
    return key if isinstance(key, str) else "anonymous"


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


class Continuations:
    """The continuations this replica owns. Single use: a retry takes its continuation out."""

    def __init__(self) -> None:
        self._parked: dict[str, Continuation] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, continuation: Continuation) -> None:
        self._parked[continuation.id] = continuation
        delay = max(0.0, continuation.expires_at - time.time())
        continuation.timer = asyncio.get_running_loop().call_later(delay, self._expire, continuation.id)

    def take(self, continuation_id: str) -> Continuation | None:
        continuation = self._parked.pop(continuation_id, None)
        if continuation is not None and continuation.timer is not None:
            continuation.timer.cancel()
        return continuation

    def _expire(self, continuation_id: str) -> None:
        continuation = self._parked.pop(continuation_id, None)
        if continuation is not None:
            log.info("backend %s: MRTR continuation %s expired without a retry", continuation.backend,
                     continuation_id)
            continuation.on_expire(continuation)

    def close_all(self) -> None:
        for continuation_id in list(self._parked):
            self._expire(continuation_id)


class Forwarder:
    """Relays an MRTR retry to the replica that owns its continuation."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=5.0), trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def forward(self, call: Call, owner: str, backend: str) -> AsyncIterator[Message] | Message:
        headers = {k: v for k, v in call.headers.items() if k in _FORWARD_HEADERS}
        headers[FORWARDED_HEADER] = "1"
        headers["accept"] = "application/json, text/event-stream"
        where = f"the replica {owner} that owns this requestState"
        try:
            response = await self._http().send(
                self._http().build_request("POST", owner, content=call.body, headers=headers), stream=True)
        except httpx.HTTPError as exc:
            raise rpc.backend_unavailable(backend, f"cannot reach {where}: {type(exc).__name__}: {exc}",
                                          call.id) from None
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return _relay_events(response, backend, where, call.id)
        try:
            body = await response.aread()
        finally:
            await response.aclose()
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise rpc.backend_protocol_error(backend, f"{where} answered HTTP {response.status_code} without JSON",
                                             call.id) from None
        if not isinstance(message, dict):
            raise rpc.backend_protocol_error(backend, f"{where} answered a non-object", call.id)
        return message


async def _relay_events(response: httpx.Response, backend: str, where: str, request_id: Any
                        ) -> AsyncIterator[Message]:
    try:
        async for event in EventSource(response).aiter_sse():
            if event.data and event.event in ("message", ""):
                yield orjson.loads(event.data)
    except httpx.HTTPError as exc:
        raise rpc.backend_unavailable(backend, f"stream from {where} broke: {exc}", request_id) from None
    finally:
        await response.aclose()


def new_continuation_id() -> str:
    return secrets.token_urlsafe(16)
