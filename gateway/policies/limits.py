"""Request size limits decided from headers, before any body byte is read (SEP-2243 §Security:
reject oversized input early). The endpoint still counts the bytes of chunked bodies."""

from __future__ import annotations

from itertools import chain

from gateway import asgi
from gateway.policies.head import HeadPolicy
from gateway.protocol import jsonrpc as rpc

_flatten = chain.from_iterable  # bound once: a class method looked up per call makes a method object


class RequestLimits(HeadPolicy):
    def __init__(self, app: asgi.ASGIApp, *, max_body_bytes: int, max_header_bytes: int = 64 * 1024) -> None:
        if max_body_bytes <= 0 or max_header_bytes <= 0:
            raise ValueError("limits must be positive")
        super().__init__(app)
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes

    def admit(self, scope: asgi.Scope) -> rpc.McpError | None:
        # Every name's and value's length, summed in C (no Python step per header).
        size = sum(map(len, _flatten(scope["headers"])))
        if size > self.max_header_bytes:
            return rpc.request_refused(431, f"Request headers exceed {self.max_header_bytes} bytes")
        length = asgi.request_headers(scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return rpc.request_refused(413, f"Request body exceeds {self.max_body_bytes} bytes")
        return None
