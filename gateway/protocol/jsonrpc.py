"""JSON-RPC 2.0 framing and the error vocabulary of the gateway.

Every failure the gateway produces is a `McpError`: it carries the JSON-RPC code, the HTTP
status the spec names for it (digest §a.3) and, when it could be read, the request id.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

# Standard JSON-RPC codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# MCP codes in the reserved range (spec: basic/index §Error Codes). The only three defined.
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

# Legacy "resource not found"; modern implementations MUST NOT emit it (digest §a.4).
LEGACY_RESOURCE_NOT_FOUND = -32002

# Gateway-made errors. The spec assigns them nothing and asks that they "cannot be mistaken
# for errors received from the peer" (basic/index), and application codes SHOULD sit outside
# -32768..-32000, so they live in -31xxx and always name the backend in `data`.
BACKEND_UNAVAILABLE = -31001
BACKEND_TIMEOUT = -31002
BACKEND_PROTOCOL_ERROR = -31003
GATEWAY_OVERLOADED = -31004

RequestId = str | int

# The HTTP status that carries a JSON-RPC error with this code (digest §a.3), for answers
# the gateway relays as messages rather than raises: the same error gets the same status
# whichever backend era or replica produced it. Codes not listed travel with 200 (an error the
# peer chose to send is still a delivered answer).
_HTTP_STATUS: dict[int, int] = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
    # Gateway-made codes, as their constructors below raise them (a retry forwarded between
    # replicas comes back as a message and must keep the owner's status).
    BACKEND_UNAVAILABLE: 502,
    BACKEND_TIMEOUT: 504,
    BACKEND_PROTOCOL_ERROR: 502,
    GATEWAY_OVERLOADED: 503,
}


def http_status_for(error_code: Any) -> int:
    """The HTTP status of an answer whose JSON-RPC error has this code (200 for others)."""
    return _HTTP_STATUS.get(error_code, 200) if isinstance(error_code, int) else 200


def http_status_of(message: dict[str, Any]) -> int:
    """The HTTP status of an answer carrying this JSON-RPC message (200 for results)."""
    error = message.get("error")
    return http_status_for(error.get("code")) if isinstance(error, dict) else 200


MAX_MESSAGE_CHARS = 1000


class McpError(Exception):
    """A failure that becomes one JSON-RPC error response with a definite HTTP status."""

    __slots__ = ("code", "message", "data", "status", "request_id", "headers")

    def __init__(
        self,
        code: int,
        message: str,
        *,
        status: int = 200,
        data: Any = None,
        request_id: RequestId | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            # Messages quote what the client sent (a header, a version, a name): bounded, so an
            # error is never as large as the request that caused it.
            message = f"{message[:MAX_MESSAGE_CHARS]}… ({len(message)} characters)"
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.status = status
        self.request_id = request_id
        self.headers = headers or {}

    def with_id(self, request_id: RequestId | None) -> McpError:
        if self.request_id is None:
            self.request_id = request_id
        return self

    def to_message(self) -> dict[str, Any]:
        return error_message(self.request_id, self.code, self.message, self.data)


def error_message(request_id: RequestId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    msg: dict[str, Any] = {"jsonrpc": "2.0", "error": error}
    # The id is omitted only when it could not be read (basic/index §Responses).
    if request_id is not None:
        msg["id"] = request_id
    return msg


def result_message(request_id: RequestId, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def dumps(message: Any) -> bytes:
    return orjson.dumps(message)


def loads(body: bytes) -> Any:
    return orjson.loads(body)


# RFC 8259 §9: "An implementation may set limits on the maximum depth of nesting." The
# gateway's limit is the depth its encoder writes back (orjson: 254 levels; its parser reads
# up to 1,024, deeper is a parse error), so that every message it accepts can be encoded
# again: rewritten for a backend (a prefix stripped, a legacy translation), keyed by the cache,
# quoted in an error message. Deeper, it used to fail there with a 500.
MAX_DEPTH = 254


def too_deep(body: bytes, message: Any) -> bool:
    """Whether `message`, parsed from `body`, nests deeper than MAX_DEPTH. Each level takes two
    bytes and an opening bracket, so a body shorter than that or with fewer brackets is answered
    by a length comparison or two byte counts; only one with more brackets is encoded once."""
    if len(body) <= 2 * MAX_DEPTH or body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return False
    try:
        orjson.dumps(message)
    except orjson.JSONEncodeError:  # parsed input fails to encode only by its depth
        return True
    return False


# -- constructors for the errors of the validation table (digest §a.3) ----------------------


def parse_error(detail: str) -> McpError:
    return McpError(PARSE_ERROR, f"Parse error: {detail}", status=400)


def invalid_request(detail: str, request_id: RequestId | None = None) -> McpError:
    return McpError(INVALID_REQUEST, f"Invalid Request: {detail}", status=400, request_id=request_id)


def header_mismatch(detail: str, request_id: RequestId | None = None, header: str | None = None) -> McpError:
    data = {"header": header} if header else None
    return McpError(HEADER_MISMATCH, f"Header mismatch: {detail}", status=400, data=data, request_id=request_id)


def unsupported_version(requested: str, supported: list[str], request_id: RequestId | None = None) -> McpError:
    return McpError(
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version: {requested!r}",
        status=400,
        # A real version is 10 characters; an absurd one is not echoed whole.
        data={"supported": supported, "requested": requested if len(requested) <= 100 else requested[:100] + "…"},
        request_id=request_id,
    )


def invalid_params(detail: str, request_id: RequestId | None = None, *, status: int = 400, data: Any = None) -> McpError:
    return McpError(INVALID_PARAMS, f"Invalid params: {detail}", status=status, data=data, request_id=request_id)


def method_not_found(method: str, request_id: RequestId | None = None) -> McpError:
    return McpError(
        METHOD_NOT_FOUND, f"Method not found: {method}", status=404, data={"method": method}, request_id=request_id
    )


def missing_capability(required: dict[str, Any], request_id: RequestId | None = None) -> McpError:
    return McpError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        "Missing required client capability",
        status=400,
        data={"requiredCapabilities": required},
        request_id=request_id,
    )


def _about_backend(code: int, backend: str, message: str, request_id: RequestId | None) -> McpError:
    """A gateway-made error about one backend: it names the backend in `data` and travels with
    the status `_HTTP_STATUS` gives its code, raised or relayed."""
    return McpError(code, message, status=_HTTP_STATUS[code], data={"backend": backend}, request_id=request_id)


def backend_unavailable(backend: str, detail: str, request_id: RequestId | None = None) -> McpError:
    return _about_backend(BACKEND_UNAVAILABLE, backend, f"Backend {backend!r} is unavailable: {detail}", request_id)


def backend_timeout(backend: str, seconds: float, request_id: RequestId | None = None) -> McpError:
    return _about_backend(
        BACKEND_TIMEOUT, backend, f"Backend {backend!r} did not answer within {seconds:g}s", request_id
    )


def gateway_overloaded(detail: str, *, limit: str, status: int = 503, retry_after: float | None = None,
                       data: dict[str, Any] | None = None, request_id: RequestId | None = None) -> McpError:
    """A gateway bound was reached; `limit` names the setting that sets it. 503 when the
    gateway (or this replica) is full, 429 when this caller used up its own share (RFC 6585
    §4); `retry_after` seconds become `Retry-After` (RFC 9110 §10.2.3), rounded up."""
    headers = {"Retry-After": str(max(0, math.ceil(retry_after)))} if retry_after is not None else None
    return McpError(GATEWAY_OVERLOADED, detail, status=status, data={"limit": limit, **(data or {})},
                    request_id=request_id, headers=headers)


def request_refused(status: int, message: str, *, headers: dict[str, str] | None = None,
                    data: Any = None) -> McpError:
    """An id-less -32600 answered from the request head, before the body is read (digest §a.3:
    403 Origin/Host, 413, 431; RFC 6750 §3 for 400/401/403 with `WWW-Authenticate`)."""
    return McpError(INVALID_REQUEST, message, status=status, data=data, headers=headers)


def backend_refused(backend: str, status: int, body: bytes, request_id: RequestId | None = None,
                    *, what: str = "the request") -> McpError:
    """A backend's HTTP 4xx that carries no JSON-RPC answer, as -31001 at 502, whatever the era.
    Relayed as-is, a backend's 401/403 (whose WWW-Authenticate is about the gateway's
    credentials, not the client's) would read as the gateway's own auth challenge (AUTH), and
    a 405/406/415 as a fault of the client's request to the gateway; it is the backend
    refusing the gateway, so the client learns which backend and what it answered."""
    detail = f"HTTP {status}"
    try:
        error = orjson.loads(body).get("error") if body[:1] == b"{" else None
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        detail += f" ({error['message'][:200]})"
    elif isinstance(error, str):
        detail += f" ({error[:200]})"
    if status in (401, 403):
        detail += ": the gateway's credentials for it (backends[].headers) were refused"
    return McpError(BACKEND_UNAVAILABLE, f"Backend {backend!r} refused {what}: {detail}", status=502,
                    data={"backend": backend, "status": status}, request_id=request_id)


def backend_protocol_error(backend: str, detail: str, request_id: RequestId | None = None) -> McpError:
    return _about_backend(
        BACKEND_PROTOCOL_ERROR, backend, f"Backend {backend!r} sent an invalid response: {detail}", request_id
    )
