"""Helpers for the small ASGI backends tests run in-process."""

from __future__ import annotations

from typing import Any


async def read_body(receive: Any) -> bytes:
    """The whole request body, however many messages it came in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
