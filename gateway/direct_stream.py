"""The seam between a long-lived response stream and the connection that carries it.

A server that can (the gateway's own HTTP/1.1 protocol, http11.py) puts a `Handover` in the
ASGI scope under `scope["extensions"][EXTENSION]`. An application that has sent
`http.response.start` may take the response body over with `Handover.take_over()`: from then on
it writes body chunks straight to the connection through the `DirectStream` it got, from any
callback, with no request task left waiting, and the request's ASGI call may return. The
subscription hub uses it for listen streams (docs/subscriptions.md "Delivery"): one write per
client per notification, in the loop pass that received the notification, and no coroutine,
task or queue held per idle stream.

Servers without it (`server.http: uvicorn`) leave the extension out, and the stream is written
through the ordinary ASGI `send`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

EXTENSION = "mcp_gateway.direct_stream"


class Spliced(Protocol):
    """An event written to many streams, each with its own bytes between `before` and
    `after` (subscriptions/encoding.py `Outgoing`)."""

    before: bytes | None
    after: bytes
    framed: Any


class DirectStream(Protocol):
    """A response body written straight to its connection."""

    # Set by the owner: called once when the connection is lost before `finish`/`cut`.
    on_lost: Callable[[], None] | None
    # The connection's write buffer is above its high-water mark (the peer is not reading as
    # fast as it is written to). An attribute, not a property: it is read once per write.
    paused: bool

    def write(self, data: bytes) -> None:
        """One body chunk, sent now (behind anything written before it)."""
        ...

    def write_spliced(self, event: Spliced, middle: bytes) -> None:
        """`event.before + middle + event.after` as one chunk: the fan-out's write, once per
        stream with the same `event` (the writer may keep its framing in `event.framed`)."""
        ...

    def finish(self, data: bytes = b"") -> None:
        """The last chunk: the response ends (the connection may serve another request)."""
        ...

    def cut(self) -> None:
        """End the connection without ending the response (what a reader sees as an
        incomplete stream)."""
        ...


class Handover(Protocol):
    def take_over(self) -> DirectStream | None:
        """The response body, after `http.response.start`; None when the client is gone."""
        ...


def handover(scope: Any) -> Handover | None:
    extensions = scope.get("extensions")
    return extensions.get(EXTENSION) if extensions else None
