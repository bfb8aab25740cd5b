"""Request size limits decided from headers, before any body byte is read (SEP-2243 §Security:
reject oversized input early). The endpoint still counts the bytes of chunked bodies."""

from __future__ import annotations

from gateway import asgi
from gateway.protocol import jsonrpc as rpc


class RequestLimits:
    def __init__(self, app: asgi.ASGIApp, *, max_body_bytes: int, max_header_bytes: int = 64 * 1024) -> None:
        if max_body_bytes <= 0 or max_header_bytes <= 0:
            raise ValueError("limits must be positive")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "http":
            size = sum([len(name) + len(value) for name, value in scope["headers"]])
            length = asgi.request_headers(scope).get("content-length")
            if size > self.max_header_bytes:
                await asgi.send_json(send, 431, rpc.error_message(
                    None, rpc.INVALID_REQUEST, f"Request headers exceed {self.max_header_bytes} bytes"))
                return
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                await asgi.send_json(send, 413, rpc.error_message(
                    None, rpc.INVALID_REQUEST, f"Request body exceeds {self.max_body_bytes} bytes"))
                return
        await self.app(scope, receive, send)
