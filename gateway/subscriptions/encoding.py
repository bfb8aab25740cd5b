"""A notification encoded once for every client stream of a fan-out, each stream's own
subscription id spliced into the bytes (docs/subscriptions.md "Delivery").

Every client of an upstream stream gets the same notification, differing only in
`_meta["io.modelcontextprotocol/subscriptionId"]`, which must be that client's own listen id
with its JSON type (spec §Receiving Notifications: an integer id stays an integer, a string a
string). So the tagged notification is encoded once, as an SSE event, with a placeholder in
place of the id; the bytes around the placeholder are kept, and a client's event is
`before + its id as JSON + after`. Encoding per client (a dict copy, `orjson.dumps`, the SSE
framing) was most of what a delivery cost at 10,000 streams (bench/README.md "Listen
fan-out").

The placeholder is a random string drawn once per process: a backend cannot know it, and the
splice is used only when it occurs exactly once in the encoding (else the event is encoded
per client, as before).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from gateway.backends.base import Message
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
    """A listen id as it appears in JSON: `7` for an integer, `"a"` for a string."""
    return orjson.dumps(listen_id)


class Outgoing:
    """One notification on its way to the clients of one upstream stream (per replica):
    encoded at the first client that takes it, spliced for each one after."""

    __slots__ = ("message", "_before", "_after")

    def __init__(self, message: Message) -> None:
        self.message = message
        self._before: bytes | None = None
        self._after = b""

    def parts(self) -> tuple[bytes, bytes] | None:
        """(before, after) the id in the SSE event, or None when the event cannot be spliced
        (the placeholder occurs more than once: encode per client with `event_for`)."""
        before = self._before
        if before is None:
            raw = sse.encode(tag(self.message, _PLACEHOLDER))
            at = raw.find(_PLACEHOLDER_JSON)
            if at < 0 or raw.find(_PLACEHOLDER_JSON, at + 1) >= 0:
                self._before = b""
                return None
            before = self._before = raw[:at]
            self._after = raw[at + len(_PLACEHOLDER_JSON):]
        elif not before:
            return None
        return before, self._after

    def event_for(self, listen_id: Any, id_json: bytes) -> bytes:
        """The whole SSE event for one client."""
        parts = self.parts()
        if parts is None:
            return sse.encode(tag(self.message, listen_id))
        return parts[0] + id_json + parts[1]
