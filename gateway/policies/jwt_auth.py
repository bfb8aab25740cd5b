"""`auth.mode: jwt`: the gateway as an OAuth 2.1 resource server (digest §i; spec:
basic/authorization §Access Token Usage, §Error Handling, §Scope Challenge Handling).

Every request to a protected path must carry `Authorization: Bearer <JWT>` (never the query
string). The token is verified here — signature (key from `jwt_keys`), `iss`, `aud` = the
gateway's canonical URI (RFC 8707), `exp`/`nbf` with leeway, `sub` present — and the
caller's scopes are checked against what the request needs. Outcomes (RFC 6750 §3):

    no credentials / not Bearer       401  WWW-Authenticate: Bearer resource_metadata=…, scope=…
    invalid, expired, wrong aud/iss   401  … error="invalid_token", error_description=…
    malformed header, token in query  400  … error="invalid_request"
    Authorization over 64 KiB         431  (the gateway's header limit; nothing is decoded)
    scopes missing                    403  … error="insufficient_scope", scope=<all required>
    key set unreachable, never held   503  (our outage: the client must not re-authorize)

Each answer is an `McpError` (the one refusal shape of head policies, policies/head.py): an
id-less JSON-RPC error body saying what failed, with its status and headers. A valid token
sets `scope["auth"]` to its `Principal` (protocol/principal.py). The token itself goes no further: the backends never see
the client's Authorization header (spec: "MUST NOT pass through the token"; the backend
transport builds its own headers and never copies the client's).

Paths in `open_paths` (health, readiness, metrics, the protected resource metadata) pass
without a token: probes and discovery carry none. Every other path is protected, so a route
added later is closed until someone opens it on purpose.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import jwt

from gateway import asgi
from gateway.observability import metrics
from gateway.policies.head import HeadPolicy
from gateway.policies.jwt_config import (
    ScopeRules,
    expand_scopes,
    load_public_key,
    metadata_url,
    resolved_algorithms,
)
from gateway.policies.jwt_keys import JwksKeys, KeySetUnreachable, KeySource, KeyUnavailable, StaticKey
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import AccessToken, Principal
from gateway.protocol.versions import is_modern

if TYPE_CHECKING:
    from gateway.settings import AuthSettings

log = logging.getLogger("gateway.auth")

# RFC 6750 §2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
_B64TOKEN = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
# error_description may hold only %x20-21 / %x23-5B / %x5D-7E (RFC 6750 §3).
_UNSAFE_DESCRIPTION = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")
# `exp` is required: a token without one never expires (RFC 9068 §2.2 makes exp REQUIRED in
# JWT access tokens; spec §Token Handling: expired tokens MUST get 401, §Token Theft).
_REQUIRED_CLAIMS = ["exp", "iss", "aud", "sub"]
# The gateway's limit on a request head (http11.MAX_HEADER_BYTES, RequestLimits), applied to
# the Authorization header before any decoding: this policy runs before RequestLimits, and
# under `server.http: uvicorn` nothing else bounds a header, so a megabyte "token" would be
# base64-decoded, parsed and hashed before the 431.
MAX_AUTHORIZATION_BYTES = 64 * 1024
# error_description echoes what the token claimed (kid, alg, crit names): bounded, so a client
# cannot make the challenge header (or the log line) as large as its own request.
_MAX_DESCRIPTION = 200
_REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 431: "Request Header Fields Too Large"}


class AuthFailure(Exception):
    """One refusal: HTTP status, the RFC 6750 error code (None: no credentials were offered),
    and a description for the client."""

    def __init__(self, status: int, error: str | None, description: str, scopes: tuple[str, ...] = ()) -> None:
        if len(description) > _MAX_DESCRIPTION:
            description = description[:_MAX_DESCRIPTION - 3] + "..."
        super().__init__(description)
        self.status = status
        self.error = error
        self.description = description
        self.scopes = scopes


def bearer_token(scope: asgi.Scope) -> str | None:
    """The Bearer token of the request; None when no Bearer credentials were offered.
    Raises AuthFailure(400) for a malformed request (RFC 6750 §3.1 invalid_request)."""
    if _has_query_token(scope.get("query_string", b"")):
        # Spec (authorization §Token Requirements): access tokens MUST NOT be in the query.
        raise AuthFailure(400, "invalid_request", "access tokens are not accepted in the query string; "
                                                  "send Authorization: Bearer <token>")
    values = [v for k, v in scope["headers"] if k == b"authorization"]
    if not values:
        return None
    if len(values) > 1:
        raise AuthFailure(400, "invalid_request", "more than one Authorization header")
    if len(values[0]) > MAX_AUTHORIZATION_BYTES:
        raise AuthFailure(431, None, f"the Authorization header is larger than {MAX_AUTHORIZATION_BYTES} bytes")
    scheme, _, rest = values[0].decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer":
        # Another scheme (Basic, ...) is "no credentials we understand": a plain challenge.
        return None
    token = rest.strip(" ")
    if not token or not _B64TOKEN.match(token):
        raise AuthFailure(400, "invalid_request", "the Authorization header is not 'Bearer <token>'")
    return token


def _has_query_token(query: bytes) -> bool:
    return any(part.split(b"=", 1)[0] == b"access_token" for part in query.split(b"&")) if query else False


def _redact_query_token(scope: asgi.Scope) -> None:
    """Blank the value of `access_token` in the request's query string. The request is refused
    anyway, but the server's access log writes the path and query of this very scope after the
    answer: a token sent there by mistake would be written to the log in clear (RFC 6750 §5.3:
    URLs end up in server logs; spec: authorization §Token Theft, "tokens ... logged on the
    server")."""
    scope["query_string"] = b"&".join(
        b"access_token=REDACTED" if part.split(b"=", 1)[0] == b"access_token" else part
        for part in scope["query_string"].split(b"&"))


def token_scopes(claims: dict[str, Any]) -> frozenset[str]:
    """Granted scopes: `scope` (space-separated, RFC 8693 §4.2 / RFC 9068) or `scp` (a list or
    a string, as Azure AD and Okta issue it)."""
    granted: set[str] = set()
    for claim in ("scope", "scp"):
        value = claims.get(claim)
        if isinstance(value, str):
            granted.update(value.split())
        elif isinstance(value, list):
            granted.update(v for v in value if isinstance(v, str))
    return frozenset(granted)


class JwtVerifier:
    """Token → claims, or AuthFailure(401). Holds no per-request state."""

    def __init__(self, auth: AuthSettings, keys: KeySource) -> None:
        self.issuer = auth.issuer
        self.audience = auth.audience
        self.algorithms = resolved_algorithms(auth)
        self.leeway = auth.leeway_seconds
        self.keys = keys

    async def verify(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise _invalid(f"not a JWT: {exc}") from None
        alg = header.get("alg")
        if alg not in self.algorithms:
            # Checked before any key lookup: `none` and HMAC-with-a-public-key die here.
            raise _invalid(f"token algorithm {alg!r} is not accepted (accepted: {', '.join(self.algorithms)})")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise _invalid("token kid is not a string")
        try:
            key = await self.keys.key_for(kid, alg)
        except KeyUnavailable as exc:
            raise _invalid(str(exc)) from None
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": _REQUIRED_CLAIMS, "verify_signature": True},
            )
        except jwt.ExpiredSignatureError:
            raise _invalid("token expired") from None
        except jwt.ImmatureSignatureError as exc:
            # pyjwt raises this for an `nbf` not reached and for an `iat` in the future.
            raise _invalid(f"token not valid yet ({'iat in the future' if '(iat)' in str(exc) else 'nbf'})") from None
        except jwt.InvalidAudienceError:
            raise _invalid(f"token audience is not this resource ({self.audience})") from None
        except jwt.InvalidIssuerError:
            raise _invalid(f"token issuer is not {self.issuer}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _invalid(f"token has no {exc.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise _invalid("token signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise _invalid(f"token rejected: {exc}") from None


def _invalid(description: str) -> AuthFailure:
    return AuthFailure(401, "invalid_token", description)


def key_source(auth: AuthSettings) -> KeySource:
    if auth.jwks_url is not None:
        return JwksKeys(auth.jwks_url, cache_seconds=auth.jwks_cache_seconds,
                        min_refresh_seconds=auth.jwks_min_refresh_seconds, timeout_seconds=auth.jwks_timeout_seconds)
    if auth.hs256_secret is not None:
        return StaticKey(auth.hs256_secret.get_secret_value().encode())
    return StaticKey(load_public_key(auth))


class JwtAuth(HeadPolicy):
    # Every path but the open ones needs a token; the gateway serves no WebSocket endpoint,
    # and closing the handshake here means none can ever appear unauthenticated.
    closes_websockets = True

    def __init__(self, app: asgi.ASGIApp, *, auth: AuthSettings, open_paths: Iterable[str] = (),
                 keys: KeySource | None = None, mcp_path: str = "/mcp",
                 view_paths: Iterable[str] = ()) -> None:
        if auth.mode != "jwt":
            raise ValueError("JwtAuth needs auth.mode: jwt")
        super().__init__(app)
        # The places whose body phase holds Mcp-Method to the body (`_declared_method`): the
        # MCP endpoint and the views' (the same endpoint code).
        self.mcp_path = mcp_path.rstrip("/") or "/"
        self.mcp_paths = frozenset({self.mcp_path, *(p.rstrip("/") or "/" for p in view_paths)})
        self.verifier = JwtVerifier(auth, keys if keys is not None else key_source(auth))
        self.scopes = ScopeRules.from_settings(auth)
        self.metadata_url = metadata_url(auth)
        self.open_paths = frozenset(p.rstrip("/") or "/" for p in open_paths)
        # The token claims a principal carries (`Principal.claims`), for authorization rules
        # and rate limit keys (`auth.claims`; docs/governance.md).
        self.claim_names: tuple[str, ...] = tuple(auth.claims)

    async def admit(self, scope: asgi.Scope) -> rpc.McpError | None:
        if scope.get("query_string") and _has_query_token(scope["query_string"]):
            _redact_query_token(scope)  # refused below (400), or an open path: logged either way
        if (scope["path"].rstrip("/") or "/") in self.open_paths:
            return None
        needed = self.scopes.for_method(self._declared_method(scope))
        try:
            scope["auth"] = await self.authenticate(scope, needed)
        except AuthFailure as failure:
            return self._refusal(failure, needed)
        except KeySetUnreachable as exc:
            log.error("cannot verify tokens: %s", exc)
            # Our outage, not the client's credentials: 503 and no challenge, so that the
            # client retries rather than re-authorizes.
            return rpc.McpError(
                rpc.BACKEND_UNAVAILABLE, f"Service Unavailable: cannot verify the access token: {exc}", status=503,
                data={"dependency": "jwks", "url": getattr(self.verifier.keys, "url", None)},
                headers={"Retry-After": "5"})
        return None

    async def authenticate(self, scope: asgi.Scope, needed: tuple[str, ...]) -> Principal:
        token = bearer_token(scope)
        if token is None:
            raise AuthFailure(401, None, "this endpoint needs an access token: Authorization: Bearer <token>")
        claims = await self.verifier.verify(token)
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise _invalid("token sub is not a non-empty string")
        granted = expand_scopes(token_scopes(claims), self.scopes.implies)
        missing = [s for s in needed if s not in granted]
        if missing:
            raise AuthFailure(403, "insufficient_scope", f"the token lacks scope {' '.join(missing)}")
        expires = claims.get("exp")
        return Principal(subject=subject, issuer=claims["iss"], authenticated=True, scopes=granted,
                         claims={name: claims[name] for name in self.claim_names if name in claims},
                         access_token=AccessToken(token, float(expires) if isinstance(expires, (int, float)) else None))

    def _refusal(self, failure: AuthFailure, needed: tuple[str, ...]) -> rpc.McpError:
        # The scope parameter names everything this operation needs, in one challenge (spec:
        # authorization §Runtime Insufficient Scope Errors), on 401 as well (§Scope Selection).
        challenge = www_authenticate(self.metadata_url, error=failure.error, scopes=needed,
                                     description=failure.description if failure.error else None)
        # Debug, not info: a 401 is the normal first step of every OAuth client.
        log.debug("auth refused (%d %s): %s", failure.status, failure.error or "no token", failure.description)
        metrics.count_auth_failure(failure.status, failure.error, failure.description)
        reason = _REASONS[failure.status]
        # 431 (RFC 6585 §5) is about the size of the request, not its credentials: no challenge.
        headers = None if failure.status == 431 else {"WWW-Authenticate": challenge}
        return rpc.request_refused(failure.status, f"{reason}: {failure.description}", headers=headers)

    def _declared_method(self, scope: asgi.Scope) -> str | None:
        """The method the request says it carries, from `Mcp-Method` (header first: decided
        before the body is read). Trusting the header is safe only where the body phase then
        rejects any header/body mismatch with 400 -32020 before routing (SHTTP §Server
        Validation), so a request cannot claim a cheap method here and run another: a POST to
        the MCP endpoint that declares a modern protocol version. Nothing checks the header
        anywhere else (the HTTP+SSE transport's /sse and /sse/messages run whatever their
        bodies say; the legacy GET stream and DELETE), and an initialize-era client sends no
        Mcp-Method: there the method is unknown and the scope rules fail closed."""
        if scope["method"] != "POST" or (scope["path"].rstrip("/") or "/") not in self.mcp_paths:
            return None
        version = asgi.get_header(scope, b"mcp-protocol-version")
        if version is None or not is_modern(version.decode("latin-1").strip()):
            return None
        method = asgi.get_header(scope, b"mcp-method")
        return method.decode("latin-1").strip() if method is not None else None


def www_authenticate(metadata: str, *, error: str | None = None, scopes: Iterable[str] = (),
                     description: str | None = None) -> str:
    """A Bearer challenge (RFC 6750 §3; RFC 9728 §5.1 resource_metadata)."""
    params: list[str] = []
    if error:
        params.append(f'error="{error}"')
    scope = " ".join(scopes)
    if scope:
        params.append(f'scope="{scope}"')
    params.append(f'resource_metadata="{metadata}"')
    if description:
        params.append(f'error_description="{_UNSAFE_DESCRIPTION.sub("?", description)}"')
    return "Bearer " + ", ".join(params)
