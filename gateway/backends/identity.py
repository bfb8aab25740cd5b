"""The principal told to a backend in a header it can trust (`backends[].identity_header`).

The value is `v1.<payload>.<signature>`: `payload` is the base64url (no padding) of a
compact JSON object `{"sub": ..., "iss": ..., "authenticated": true|false, "iat": <unix
seconds>}`, and `signature` the base64url (no padding) HMAC-SHA256, keyed with
`security.secret` (UTF-8), of the ASCII text `v1.<payload>`. A backend recomputes the HMAC
over everything before the last dot, compares it in constant time, and refuses an `iat`
older than it tolerates (a minute, say): the header is then the gateway's word on who calls,
which no client can forge (docs/auth.md "Identity header" has a verifier in Python).

The value changes once a second per principal (`iat`), so it is kept per principal for that
second: one HMAC per principal and second, not per request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable

import orjson

from gateway.protocol.principal import Principal

VERSION = "v1"
_CACHE_LIMIT = 4096


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class IdentitySigner:
    def __init__(self, secret: bytes, *, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._clock = clock
        self._second = -1
        self._cache: dict[str, str] = {}

    def __repr__(self) -> str:
        return "<IdentitySigner>"

    def value(self, principal: Principal) -> str:
        now = int(self._clock())
        if now != self._second or len(self._cache) > _CACHE_LIMIT:
            self._second, self._cache = now, {}
        found = self._cache.get(principal.key)
        if found is None:
            found = self._cache[principal.key] = sign(self._secret, principal, now)
        return found


def sign(secret: bytes, principal: Principal, iat: int) -> str:
    payload = _b64(orjson.dumps({"sub": principal.subject, "iss": principal.issuer,
                                 "authenticated": principal.authenticated, "iat": iat}))
    signed = f"{VERSION}.{payload}"
    return f"{signed}.{_b64(hmac.new(secret, signed.encode('ascii'), hashlib.sha256).digest())}"


def verify(secret: bytes, value: str, *, max_age: float, now: float | None = None) -> dict | None:
    """The payload of a valid, fresh header value, else None (what a backend does; tests)."""
    signed, _, signature = value.rpartition(".")
    if not signed.startswith(f"{VERSION}."):
        return None
    expected = _b64(hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, signature):
        return None
    payload = signed.split(".", 1)[1]
    claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    if (now if now is not None else time.time()) - claims["iat"] > max_age:
        return None
    return claims
