"""Authentication: who is calling. Sets `scope["auth"]` to a `Principal` (the ASGI convention
Starlette's AuthenticationMiddleware uses), which keys private cache entries and, later,
binds MRTR state and legacy sessions.

`mode: none` authenticates nobody. It still tells callers apart by a hash of the credentials
they present, which binds MRTR state and legacy sessions to whoever presented them; but an
unverified header is no identity to share `private` answers by, so the cache stores none for
an unauthenticated caller (docs/cache.md "Without authentication"). The raw credential is
never stored.

`mode: jwt` is `jwt_auth.JwtAuth` (an OAuth 2.1 resource server; docs/auth.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gateway import asgi
from gateway.policies.head import HeadPolicy, Refusal


@dataclass(frozen=True, slots=True)
class Principal:
    subject: str
    issuer: str = ""
    authenticated: bool = False
    # Granted scopes, hierarchy expanded (mode: jwt); empty otherwise.
    scopes: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        """A stable identity for cache keys and state binding; never the raw token."""
        return f"{self.issuer}|{self.subject}"


ANONYMOUS = Principal("anonymous")


def credential_principal(authorization: bytes | None) -> Principal:
    if not authorization:
        return ANONYMOUS
    digest = hashlib.sha256(authorization).hexdigest()[:32]
    return Principal(f"credential:{digest}")


class NoAuth(HeadPolicy):
    def admit(self, scope: asgi.Scope) -> Refusal | None:
        authorization = asgi.request_headers(scope).get("authorization")
        scope["auth"] = credential_principal(authorization.encode("latin-1") if authorization else None)
        return None
