"""Upstream failures, and the one place they become the gateway's errors.

The HTTP client (`http1.py`) and the stdio supervisor raise the lower-layer exceptions below;
`upstream_errors()` turns them into the JSON-RPC errors the README lists under "Errors the
gateway makes", naming the backend (`data.backend`):

| lower layer                                   | gateway error                          |
| --------------------------------------------- | -------------------------------------- |
| `ConnectError`, `UpstreamConnectionError`     | -31001 backend unavailable (HTTP 502)  |
| `ConnectTimeout`, any other `TimeoutError`    | -31002 backend timeout (HTTP 504)      |
| `ResponseTooLarge`                            | -31003 invalid backend answer (502)    |

Every backend kind wraps both the call and the iteration of its stream in it, the way httpx
wraps each transport call in `map_httpcore_exceptions` (`httpx/_transports/default.py`). An
`McpError` raised inside passes through untouched; anything else is a bug and propagates.
"""

from __future__ import annotations

from types import TracebackType

from gateway.protocol import jsonrpc as rpc


class UpstreamError(Exception):
    """A failure below the protocol: connecting, reading, or the size of what was read."""


class ConnectError(UpstreamError):
    """No connection could be made (refused, unreachable, TLS handshake failed)."""


class ConnectTimeout(UpstreamError, TimeoutError):
    """No connection within the connect timeout. Told apart from a read timeout because the
    era probe treats them differently: no connection is no verdict, silence is one (§h.1)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no connection within {seconds:g}s")
        self.seconds = seconds


class UpstreamConnectionError(UpstreamError):
    """The connection failed or closed before the response was complete, or the answer was
    not HTTP."""


class RequestNotRead(UpstreamConnectionError):
    """The connection closed with no answer and the kernel's evidence (a RST for the request's
    bytes) says the backend did not read the request: it may be sent again whatever its method
    (http1.py, `_Connection.eof_received`)."""


class ResponseTooLarge(UpstreamError):
    """The answer (a whole body, or one SSE event) passed the backend's `max_response_bytes`:
    the connection is closed rather than read on, so that a broken or hostile backend cannot
    make the gateway buffer without bound."""

    def __init__(self, limit: int, what: str = "the answer") -> None:
        super().__init__(f"{what} exceeds {limit} bytes (backends[].max_response_bytes)")


def describe(exc: BaseException) -> str:
    """An exception in words, for an error message: its text, or its type when it has none."""
    text = str(exc)
    return text if text else type(exc).__name__


def mark_never_sent(error: rpc.McpError) -> rpc.McpError:
    """Say of a gateway error that its request provably never reached the backend (no
    connection was made; the process was not running), so that it may be retried whatever
    its method (backends/retry.py). An attribute, not `data`: the client does not see it."""
    error.never_sent = True  # type: ignore[attr-defined]
    return error


def never_sent(error: rpc.McpError) -> bool:
    return getattr(error, "never_sent", False)


# Every exception `gateway_error` maps (a read timeout is a plain TimeoutError).
UPSTREAM_FAILURES = (UpstreamError, TimeoutError)


def gateway_error(exc: BaseException, backend: str, *, timeout: float | None,
                  request_id: rpc.RequestId | None = None, what: str = "") -> rpc.McpError | None:
    """The gateway error for the lower-layer failure `exc` (the table above; never None for
    one of UPSTREAM_FAILURES), or None when it is not one. `upstream_errors` applies it; the pass-through path calls it from a bare
    `except UPSTREAM_FAILURES`, which costs nothing until something fails."""
    if isinstance(exc, ConnectTimeout):
        return mark_never_sent(rpc.backend_timeout(backend, exc.seconds, request_id))
    if isinstance(exc, TimeoutError):
        return rpc.backend_timeout(backend, timeout or 0, request_id)
    if isinstance(exc, ResponseTooLarge):
        return rpc.backend_protocol_error(backend, describe(exc), request_id)
    if isinstance(exc, UpstreamError):  # ConnectError, UpstreamConnectionError
        error = rpc.backend_unavailable(backend, f"{what}: {describe(exc)}" if what else describe(exc), request_id)
        return mark_never_sent(error) if isinstance(exc, (ConnectError, RequestNotRead)) else error
    return None


class upstream_errors:  # noqa: N801 - used as `with upstream_errors(...)`, like a function
    """`with upstream_errors(backend, timeout=..., request_id=..., what=...)`: lower-layer
    exceptions raised inside become -31001/-31002/-31003 naming `backend`. `timeout` is the
    read timeout reported for a plain TimeoutError; `what`, when given, says what broke
    ("stream broke", "era probe") before the lower layer's own words in a -31001.

    A class rather than `contextlib.contextmanager`, which costs a generator per use."""

    __slots__ = ("backend", "timeout", "request_id", "what")

    def __init__(self, backend: str, *, timeout: float | None, request_id: rpc.RequestId | None = None,
                 what: str = "") -> None:
        self.backend = backend
        self.timeout = timeout
        self.request_id = request_id
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, rpc.McpError):
            return False
        mapped = self.map(exc)
        if mapped is None:
            return False
        raise mapped from None

    def map(self, exc: BaseException) -> rpc.McpError | None:
        """The gateway error for `exc`, or None when it is not an upstream failure."""
        return gateway_error(exc, self.backend, timeout=self.timeout, request_id=self.request_id, what=self.what)
