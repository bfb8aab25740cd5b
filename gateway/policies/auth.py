"""Authentication of `auth.mode: none`: who is calling, without verifying anything. Sets
`scope["auth"]` to the caller's `Principal` (gateway/protocol/principal.py says which keys it
carries and who reads them).

`mode: none` authenticates nobody. It still tells callers apart by a hash of the credentials
they present, which binds MRTR state, listen limits and legacy sessions to whoever presented
them; but an unverified header is no identity to share `private` answers by, so the cache
stores none for an unauthenticated caller (`Principal.cache_key` is None; docs/cache.md
"Without authentication"). The raw credential is never stored.

`mode: jwt` is `jwt_auth.JwtAuth` (an OAuth 2.1 resource server; docs/auth.md).
"""

from __future__ import annotations

from gateway import asgi
from gateway.policies.head import HeadPolicy
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import ANONYMOUS, Principal, credential_principal

__all__ = ["ANONYMOUS", "NoAuth", "Principal", "credential_principal"]


class NoAuth(HeadPolicy):
    def admit(self, scope: asgi.Scope) -> rpc.McpError | None:
        authorization = asgi.request_headers(scope).get("authorization")
        scope["auth"] = credential_principal(authorization.encode("latin-1") if authorization else None)
        return None
