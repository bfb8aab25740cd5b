"""Who is calling: the one `Principal` every consumer of the caller's identity reads.

The authentication policy (`policies/auth.py` for `auth.mode: none`, `policies/jwt_auth.py`
for `jwt`) sets one on every HTTP request as `scope["auth"]` (the ASGI convention Starlette's
AuthenticationMiddleware uses); `parse_call` puts it on the `Call`, and from there on nothing
derives the caller again. Two keys, because two kinds of consumer need different answers:

- `key` binds state to whoever presented the request: legacy-client sessions, MRTR
  continuations and `requestState`, listen-stream limits. Every caller has one. Without
  authentication it is a hash of the credentials presented (never the credential itself), so
  two clients with different tokens cannot resume each other's state, and a caller without
  any shares `ANONYMOUS.key` with every other such caller.
- `cache_key` keys the `private` answers a shared cache may store and hand back: None unless
  the gateway verified who the caller is. An unverified header is a value any client can send,
  not an identity to share answers by (spec: caching §cacheScope, "private" MUST NOT be
  shared across authorization contexts; digest §e [GW]; docs/cache.md "Without
  authentication"). With None a private answer is neither stored nor handed to a coalesced
  caller, as an HTTP shared cache never stores `Cache-Control: private` (RFC 9111 §5.2.2.7).

`access_token` is the validated token (mode jwt), reachable for one consumer: the RFC 8693
token exchange toward a backend. It never prints and is in no key (see `AccessToken`).

`claims` holds the token claims the configuration names (empty until a policy asks for some;
the governance rules of issue 19 read them), frozen like the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

NO_CLAIMS: Mapping[str, Any] = MappingProxyType({})


class AccessToken:
    """The caller's validated access token, kept for one use only: the `subject_token` of an
    RFC 8693 exchange (backends/credentials.py). It never prints (repr, str, f-strings), is
    no part of a Principal's equality, hash or keys, and so never reaches a log, a cache key
    or Redis; `reveal()` is the one way to the text, called where the exchange request is
    built."""

    __slots__ = ("_value", "expires_at")

    def __init__(self, value: str, expires_at: float | None = None) -> None:
        self._value = value
        # The token's `exp` (seconds since the epoch): an exchanged token never outlives it.
        self.expires_at = expires_at

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "AccessToken('**********')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("an access token is not serializable")


@dataclass(frozen=True, slots=True)
class Principal:
    # `sub` of a verified token; for an unauthenticated caller, a label ("anonymous",
    # "credential:<hash>") that tells callers apart without naming them.
    subject: str
    # `iss` of a verified token; "" without authentication.
    issuer: str = ""
    # Whether the gateway verified the identity (auth.mode jwt).
    authenticated: bool = False
    # Granted scopes, hierarchy expanded (mode jwt); empty otherwise.
    scopes: frozenset[str] = frozenset()
    # The claims the configuration names, read-only; not part of the hash (a mapping has none).
    claims: Mapping[str, Any] = field(default_factory=lambda: NO_CLAIMS, hash=False)
    # The validated token itself (mode jwt), for token exchange toward backends only.
    access_token: AccessToken | None = field(default=None, compare=False, hash=False, repr=False)
    # Derived once: read on every request that binds or caches.
    key: str = field(init=False, compare=False, hash=False, repr=False)
    cache_key: str | None = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        key = f"{self.issuer}|{self.subject}"
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "cache_key", key if self.authenticated else None)
        if type(self.claims) is not MappingProxyType:
            object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))


ANONYMOUS = Principal("anonymous")
"""A caller that presented no credentials (or a request no authentication policy saw)."""


def credential_principal(authorization: bytes | None) -> Principal:
    """The principal of `auth.mode: none`: told apart by a hash of the Authorization header it
    presented, never authenticated. The raw credential is not kept."""
    if not authorization:
        return ANONYMOUS
    digest = hashlib.sha256(authorization).hexdigest()[:32]
    return Principal(f"credential:{digest}")


def principal_of(scope: Mapping[str, Any]) -> Principal:
    """The principal an authentication policy set on this ASGI scope, or `ANONYMOUS`."""
    principal = scope.get("auth")
    return principal if isinstance(principal, Principal) else ANONYMOUS
