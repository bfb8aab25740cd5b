"""Server-Sent Events framing for the answers the gateway writes (digest §c).

Modern streams carry no `id:` fields (they are not resumable) and end with the final JSON-RPC
response. Upstream streams are parsed with httpx-sse in the backend modules.
"""

from __future__ import annotations

from typing import Any

import orjson

# Comment line: clients ignore it; it keeps idle connections and proxies from timing out.
KEEPALIVE = b":\r\n\r\n"

HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    # Tell nginx-like proxies not to buffer the stream (SHTTP §Receiving Messages).
    (b"x-accel-buffering", b"no"),
]


def encode(message: Any) -> bytes:
    """One `message` event carrying a JSON-RPC message."""
    return b"event: message\ndata: " + orjson.dumps(message) + b"\n\n"
