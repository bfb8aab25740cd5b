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


class EventTooLarge(ValueError):
    """One event grew past the reader's bound (`Decoder.max_event_bytes`)."""


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

    __slots__ = ("_data", "_data_bytes", "_event", "_has_data", "_id", "_pending", "_pending_bytes",
                 "last_event_id", "max_event_bytes", "retry_ms")

    def __init__(self, max_event_bytes: int | None = None) -> None:
        # The reader's bound on one event (its data and the line not yet ended): past it `feed`
        # raises EventTooLarge. Nothing else bounds what a peer sends.
        self.max_event_bytes = max_event_bytes
        # Bytes of a line not yet ended, kept as the chunks that brought them: joined only once a
        # line ends, so a long line arriving in many chunks is not copied once per chunk.
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""
        self._has_data = False
        self._id: str | None = None
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None

    @property
    def pending_bytes(self) -> int:
        """The size of the event being received: its data lines so far and the line not yet
        ended. A reader bounds it (`max_response_bytes`): nothing else would."""
        return self._pending_bytes + self._data_bytes

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        pending = self._pending
        if b"\n" not in chunk and b"\r" not in chunk and not (pending and pending[-1].endswith(b"\r")):
            if chunk:  # no line ends here: nothing to parse yet
                pending.append(chunk)
                self._pending_bytes += len(chunk)
                self._check(())
            return []
        events: list[tuple[str, str]] = []
        buffer = b"".join((*pending, chunk)) if pending else chunk
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
        rest = buffer[start:]
        self._pending = [rest] if rest else []
        self._pending_bytes = len(rest)
        self._check(events)
        return events

    def _check(self, events: list[tuple[str, str]] | tuple[()]) -> None:
        limit = self.max_event_bytes
        if limit is not None and (self.pending_bytes > limit or any(len(data) > limit for _, data in events)):
            raise EventTooLarge(limit)

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
            self._data, self._data_bytes, self._event, self._has_data = [], 0, "", False
            return event
        if line.startswith(":"):
            return None  # comment (keep-alive)
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._data_bytes += len(value)
            self._has_data = True
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


async def json_payloads(chunks: AsyncIterator[bytes], source: str, max_event_bytes: int | None = None
                        ) -> AsyncIterator[Any]:
    """The parsed JSON of each `message` event in a byte stream, as it arrives. Priming
    events (empty data), other event types and non-JSON data are skipped (the last logged,
    naming `source`). An event larger than `max_event_bytes` raises EventTooLarge."""
    decoder = Decoder(max_event_bytes)
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
