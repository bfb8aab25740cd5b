"""A notification encoded once for every client stream of a fan-out, each stream's own
subscription id spliced into the bytes (docs/subscriptions.md "Delivery").

Every client of an upstream stream gets the same notification, differing only in
`_meta["io.modelcontextprotocol/subscriptionId"]`, which must be that client's own listen id
with its JSON type (spec §Receiving Notifications: an integer id stays an integer, a string a
string). So the tagged notification is encoded once, as an SSE event, with a placeholder in
place of the id; the bytes around the placeholder are kept, and a client's event is
`before + its id as JSON + after`. Encoding per client (a dict copy, `orjson.dumps`, the SSE
framing) was a large part of what a delivery cost at 10,000 streams (bench/README.md "Listen
fan-out at dashboard scale").

The placeholder is a random string drawn once per process: a backend cannot know it, and the
splice is used only when it occurs exactly once in the encoding (else the event is encoded
per client, as before).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from gateway.backends.base import Message
from gateway.subscriptions.filters import SubscriptionFilter
from gateway.protocol import meta
from gateway.protocol import sse

_PLACEHOLDER = "mcpgw-subscription-id-" + secrets.token_hex(16)
_PLACEHOLDER_JSON = orjson.dumps(_PLACEHOLDER)


def tag(message: Message, listen_id: Any) -> Message:
    """The notification as one client must see it: `_meta` carries its own listen id (the
    backend's or another client's is replaced; other `_meta` keys pass)."""
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    m = params.get("_meta")
    m = m if isinstance(m, dict) else {}
    return {"jsonrpc": "2.0", "method": message["method"],
            "params": {**params, "_meta": {**m, meta.SUBSCRIPTION_ID: listen_id}}}


def encode_id(listen_id: Any) -> bytes:
    """A listen id as it appears in JSON: `7` for an integer, `"a"` for a string. Copied to
    its own size: orjson's result keeps its writer's whole buffer (4 KB), and every stream
    holds its id for as long as it listens."""
    return bytes(memoryview(orjson.dumps(listen_id)))


class Outgoing:
    """One notification on its way to the clients of one upstream stream (per replica):
    encoded at the first client that takes it, spliced for each one after. It also remembers
    whether the last filter asked admits it: clients of a stream share their filter objects
    (`UpstreamListen.canonical`), so a fan-out judges each filter once, not each client."""

    __slots__ = ("message", "before", "after", "framed", "_judged", "_admitted")

    def __init__(self, message: Message) -> None:
        self.message = message
        # The event's bytes before and after the id: None until encoded, b"" (before) when the
        # event cannot be spliced (`event_for` encodes it per client).
        self.before: bytes | None = None
        self.after = b""
        # The writer's own framing of `before`/`after` (direct_stream.DirectStream.write_spliced:
        # HTTP/1.1 chunk heads per id length), made at its first client and reused for the rest.
        self.framed: Any = None
        self._judged: Any = None
        self._admitted = False

    def admitted_by(self, granted: SubscriptionFilter) -> bool:
        if granted is not self._judged:
            self._admitted = granted.admits(self.message)
            self._judged = granted
        return self._admitted

    def encode(self) -> bytes:
        """Encode once: sets `before` and `after` (or `before = b""`); returns `before`."""
        raw = sse.encode(tag(self.message, _PLACEHOLDER))
        at = raw.find(_PLACEHOLDER_JSON)
        if at < 0 or raw.find(_PLACEHOLDER_JSON, at + 1) >= 0:
            self.before = b""
        else:
            self.before = raw[:at]
            self.after = raw[at + len(_PLACEHOLDER_JSON):]
        return self.before

    def event_for(self, listen_id: Any, id_json: bytes) -> bytes:
        """The whole SSE event for one client."""
        before = self.before if self.before is not None else self.encode()
        if not before:
            return sse.encode(tag(self.message, listen_id))
        return before + id_json + self.after
