"""Server-Sent Events framing for the answers the gateway writes (digest §c).

Modern streams carry no `id:` fields (they are not resumable) and end with the final JSON-RPC
response. `Decoder` parses the upstream streams the gateway relays.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

log = logging.getLogger("gateway.protocol.sse")

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


class Decoder:
    """Incremental parser of a `text/event-stream` body (WHATWG HTML §9.2.6, "event stream
    interpretation"), fed raw byte chunks as they arrive, yielding (event type, data) pairs.

    Hand-written on purpose: the SSE client libraries either belong to another HTTP client
    (httpx-sse parses an httpx response) or own the connection and its reconnects
    (aiohttp-sse-client); the gateway needs a parser over the bytes of an upstream response it
    already holds, with no reconnection (modern streams are not resumable). `id:` and `retry:`
    are kept in `last_event_id` and `retry_ms` for the one reader that resumes: the legacy
    backend transport (GET + Last-Event-ID, L-TR §Resumability); modern relaying ignores them.
    """

    __slots__ = ("_buffer", "_data", "_event", "_has_data", "_id", "last_event_id", "retry_ms")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self._has_data = False
        self._id: str | None = None
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        buffer = self._buffer + chunk
        start = 0
        size = len(buffer)
        while start < size:
            # A line ends at CRLF, LF or CR; a CR at the very end may be the first half of a CRLF.
            lf = buffer.find(b"\n", start)
            cr = buffer.find(b"\r", start)
            if cr != -1 and (lf == -1 or cr < lf):
                if cr == size - 1:
                    break
                end, nxt = cr, cr + 2 if buffer[cr + 1 : cr + 2] == b"\n" else cr + 1
            elif lf != -1:
                end, nxt = lf, lf + 1
            else:
                break
            event = self._line(buffer[start:end].decode("utf-8", "replace"))
            if event is not None:
                events.append(event)
            start = nxt
        self._buffer = buffer[start:]
        return events

    def _line(self, line: str) -> tuple[str, str] | None:
        if not line:
            # WHATWG dispatch: the last event id is taken even from an event without data
            # (a legacy priming event is exactly that).
            if self._id is not None:
                self.last_event_id = self._id
            if not self._has_data:
                self._event = ""
                return None
            event = (self._event or "message", "\n".join(self._data))
            self._data, self._event, self._has_data = [], "", False
            return event
        if line.startswith(":"):
            return None  # comment (keep-alive)
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


async def json_payloads(chunks: AsyncIterator[bytes], source: str) -> AsyncIterator[Any]:
    """The parsed JSON of each `message` event in a byte stream, as it arrives. Priming
    events (empty data), other event types and non-JSON data are skipped (the last logged,
    naming `source`)."""
    decoder = Decoder()
    async for chunk in chunks:
        for event, data in decoder.feed(chunk):
            if event != "message" or not data:
                continue
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                log.warning("%s sent an SSE event that is not JSON; dropped", source)
                continue
            yield payload
