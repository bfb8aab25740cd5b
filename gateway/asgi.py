"""Small pure-ASGI helpers shared by the endpoint, the policies and the operational routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from gateway.protocol import jsonrpc as rpc

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]


class _Names(dict[bytes, str]):
    """Raw header name → its lower-case text, decoded on first sight: clients send the same
    few names on every request. Names are the client's, so at most `_MAX_NAMES` are kept;
    past it a new name is decoded each time it comes."""

    def __missing__(self, name: bytes) -> str:
        text = name.decode("latin-1").lower()
        if len(self) < _MAX_NAMES:
            self[name] = text
        return text


_MAX_NAMES = 1024
# Shared by the request's headers (`header_dict`) and a backend's answer's (backends/http1.py).
header_names = _Names()


def header_dict(scope: Scope) -> dict[str, str]:
    """Request headers with lower-case names and trimmed values (OWS is not part of a field
    value, RFC 9110 §5.5). Repeated field lines are combined with ", " as RFC 9110 §5.3 says,
    so a second `Mcp-Method` or `Mcp-Name` can never match the body: an intermediary that
    reads the other copy cannot be steered past the gateway's header/body check."""
    raw = scope["headers"]
    if raw.__class__ is not list:  # ASGI allows any iterable: read once, then counted
        raw = list(raw)
    # One comprehension for the common case, every name once (a third of the loop's cost per
    # header: bench/README.md "The ≤ 5 µs budget, the whole request"); a name repeated shows as
    # fewer keys than lines, and the lines are then combined in order.
    names = header_names
    out = {names[name]: value.decode("latin-1").strip(" \t") for name, value in raw}
    if len(out) == len(raw):
        return out
    out = {}
    for name, value in raw:
        key = names[name]
        text = value.decode("latin-1").strip(" \t")
        out[key] = text if key not in out else f"{out[key]}, {text}"
    return out


_HEADERS_KEY = "mcp_gateway.headers"


def request_headers(scope: Scope) -> dict[str, str]:
    """`header_dict(scope)`, decoded once per request by whichever step asks first and kept in
    the scope for the others (telemetry, host, origin, auth, limits, the endpoint: one pass over
    the raw headers instead of one scan each; bench/README.md "Profile")."""
    headers = scope.get(_HEADERS_KEY)
    if headers is None:
        headers = scope[_HEADERS_KEY] = header_dict(scope)
    return headers


def get_header(scope: Scope, name: bytes) -> bytes | None:
    """One request header by lower-case name (ASGI servers lower-case header names)."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    hdrs = list(headers or JSON_HEADERS)
    hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send_bytes(send, status, orjson.dumps(payload), JSON_HEADERS + (extra or []))


async def send_error(send: Send, error: rpc.McpError) -> None:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send_json(send, error.status, error.to_message(), extra)


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


async def read_body_or_refuse(receive: Receive, send: Send, limit: int) -> bytes | None:
    """The body; None once a too large one was answered 413, or when the client left."""
    try:
        return await read_body(receive, limit)
    except BodyTooLarge:
        await send_json(send, 413, rpc.error_message(None, rpc.INVALID_REQUEST, f"Request body exceeds {limit} bytes"))
    except ClientGone:
        pass
    return None


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing more than `limit` bytes (chunked bodies included)."""
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")  # the usual request: all of it in one message
        if len(body) > limit:
            raise BodyTooLarge()
        return body
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge()
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
        message = await receive()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
