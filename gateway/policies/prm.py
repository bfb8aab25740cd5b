"""OAuth 2.0 Protected Resource Metadata (RFC 9728), served when `auth.mode: jwt`.

Spec (authorization §Authorization Server Discovery): MCP servers MUST publish it, with at
least one `authorization_servers` entry; clients find it through the `resource_metadata` of a
401 challenge or at the well-known URIs (path-inserted first, then the root). It is public
and static, so it is built once and served without a token; `resource` is the configured
audience, which RFC 9728 §3.3 requires to match the URL the document was derived from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from gateway import asgi
from gateway.protocol import jsonrpc as rpc

if TYPE_CHECKING:
    from gateway.settings import AuthSettings


def metadata_document(auth: AuthSettings) -> dict[str, Any]:
    document: dict[str, Any] = {
        "resource": auth.audience,
        "authorization_servers": list(auth.authorization_servers),
        # RFC 9728 §2: tokens only in the Authorization header (never query or form body).
        "bearer_methods_supported": ["header"],
    }
    # Minimal scopes for basic use (spec: §Scope Selection Strategy); omitted when none.
    scopes = auth.scopes_supported if auth.scopes_supported is not None else auth.required_scopes
    if scopes:
        document["scopes_supported"] = list(dict.fromkeys(scopes))
    return document


class ProtectedResourceMetadata:
    """An ASGI endpoint answering GET/HEAD with the metadata document."""

    def __init__(self, auth: AuthSettings, *, max_age_seconds: int = 300) -> None:
        self.body = orjson.dumps(metadata_document(auth))
        self.headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", f"public, max-age={max_age_seconds}".encode()),
        ]

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await asgi.send_json(send, 405, rpc.error_message(
                None, rpc.INVALID_REQUEST, f"Method Not Allowed: {method} on {scope['path']}; use GET"),
                [(b"allow", b"GET, HEAD")])
            return
        if method == "HEAD":
            headers = [*self.headers, (b"content-length", str(len(self.body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await asgi.send_bytes(send, 200, self.body, self.headers)
