"""Sealed tokens for legacy client sessions that any replica can serve.

A legacy session's durable facts are fixed at `initialize`: the negotiated version, the
client's capabilities and info, what the gateway advertised, and the principal it belongs to.
Sealed into the `Mcp-Session-Id` with authenticated encryption (AES-256-GCM, key derived from
`security.secret`), they travel with every request, so a replica that never saw the session
can serve it, and no replica can be handed a session it did not mint: a forged or altered id
fails to open and is an unknown session (404). The principal binding is inside, checked on
every request (L-SBP §Session Hijacking: the session is never the authentication). Encrypted,
not only signed: the client's capabilities and the principal binding are nobody else's
business, and the id is visible to every proxy on the way.

The same sealer marks the gateway's own server-to-client requests (`elicitation/create`,
`sampling/createMessage`, `roots/list`) with the replica that waits for their answer, so an
answer POSTed to another replica can be forwarded there, and the replica that holds an
HTTP+SSE stream, so its POSTs can be. Each kind of token has its own associated data: one
can never be passed off as another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SESSION = b"mcp-gateway/legacy-session/v1"
INPUT_REQUEST = b"mcp-gateway/legacy-input-request/v1"
SSE_STREAM = b"mcp-gateway/legacy-sse-stream/v1"
_PREFIX = "v1."
_NONCE_BYTES = 12
# Nothing we mint is longer than this (client capabilities and info are bounded by the body
# limit, but a session id is a header every request carries): anything longer is not ours and
# is refused before any decoding.
MAX_TOKEN_CHARS = 16 * 1024


def principal_binding(principal_key: str) -> str:
    """What a sealed session stores of its principal: a digest (the key may be long, and
    nothing needs it back)."""
    return base64.urlsafe_b64encode(hashlib.sha256(principal_key.encode()).digest()[:18]).decode()


class Sealer:
    def __init__(self, secret: bytes) -> None:
        self._aead = AESGCM(hashlib.sha256(b"mcp-gateway/legacy-clients/" + secret).digest())

    def seal(self, purpose: bytes, payload: dict[str, Any]) -> str:
        """Visible ASCII (base64url), as L-TR §Session Management requires of a session id."""
        nonce = os.urandom(_NONCE_BYTES)
        box = self._aead.encrypt(nonce, orjson.dumps(payload), purpose)
        return _PREFIX + base64.urlsafe_b64encode(nonce + box).rstrip(b"=").decode()

    def open(self, purpose: bytes, token: str) -> dict[str, Any] | None:
        """The payload, or None for anything this gateway (with this secret, for this
        purpose) did not seal."""
        if not token.startswith(_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            return None
        body = token[len(_PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) <= _NONCE_BYTES or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != body:
            return None  # one spelling per token: the id is also a dictionary key
        try:
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], purpose)
            payload = orjson.loads(plain)
        except (InvalidTag, orjson.JSONDecodeError):
            return None
        return payload if isinstance(payload, dict) else None
