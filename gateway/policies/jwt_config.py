"""The `auth` settings of `mode: jwt`, checked once and compiled into what the policy needs.

`check_auth_settings` runs inside the settings model, so `mcp-gateway check-config` and
`serve` refuse an inconsistent configuration before any request arrives: jwt without an
audience, without a key source or with two of them, an HMAC algorithm beside a public key
(the algorithm-confusion attack), `none`, a JWKS fetched over plain HTTP from a remote host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from gateway.protocol.methods import METHODS

if TYPE_CHECKING:
    from gateway.settings import AuthSettings

WELL_KNOWN = "/.well-known/oauth-protected-resource"  # RFC 9728 §3

DEFAULT_ASYMMETRIC = ("RS256", "ES256")
HMAC_ALGORITHMS = frozenset({"HS256"})
_FAMILIES: dict[str, tuple[type, ...]] = {
    **{f"RS{n}": (rsa.RSAPublicKey,) for n in (256, 384, 512)},
    **{f"PS{n}": (rsa.RSAPublicKey,) for n in (256, 384, 512)},
    **{f"ES{n}": (ec.EllipticCurvePublicKey,) for n in (256, 384, 512)},
    "EdDSA": (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey),
}
ASYMMETRIC_ALGORITHMS = frozenset(_FAMILIES)
# RFC 7518 §3.2: an HMAC key at least as long as the hash output.
MIN_HMAC_SECRET_BYTES = 32
# RFC 7518 §3.3 and §3.5: RSA keys of 2048 bits or more.
MIN_RSA_BITS = 2048
# RFC 6749 §3.3 scope-token: printable ASCII without space, '"' or '\'. It also keeps the
# scopes safe inside a quoted WWW-Authenticate parameter.
_SCOPE_TOKEN = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+$")
# Spec (authorization §Refresh Tokens): servers SHOULD NOT ask for it in challenges or PRM.
OFFLINE_ACCESS = "offline_access"

_KEY_SOURCES = ("jwks_url", "public_key", "public_key_file", "hs256_secret")


def check_auth_settings(auth: AuthSettings) -> None:
    """Raise ValueError naming every inconsistent `auth` field (all of them at once)."""
    problems = _problems(auth)
    if problems:
        raise ValueError("; ".join(problems))


def _problems(auth: AuthSettings) -> list[str]:
    if auth.mode == "none":
        stray = sorted(auth.model_fields_set - {"mode"})
        if stray:
            # A jwt section left under mode: none would look protected and not be.
            return [f"{', '.join(stray)} set but mode is 'none': nothing would be enforced; set mode: jwt"]
        return []

    problems: list[str] = []
    if not auth.issuer:
        problems.append("issuer is required with mode: jwt (the `iss` your authorization server puts in tokens)")
    problems += _audience_problems(auth.audience)

    sources = [name for name in _KEY_SOURCES if getattr(auth, name) is not None]
    if not sources:
        problems.append("mode: jwt needs one key source: jwks_url, public_key, public_key_file or hs256_secret")
    elif len(sources) > 1:
        problems.append(f"set exactly one key source, not {' and '.join(sources)}")

    try:
        algorithms = resolved_algorithms(auth)
    except ValueError as exc:
        problems.append(str(exc))
        algorithms = ()
    if len(sources) == 1 and algorithms:
        problems += _key_problems(auth, sources[0], algorithms)

    if not auth.authorization_servers:
        problems.append("authorization_servers needs at least one entry (RFC 9728 metadata MUST list one)")
    for i, server in enumerate(auth.authorization_servers):
        if not _is_http_url(server):
            problems.append(f"authorization_servers.{i}: {server!r} is not an http(s) URL")
    if auth.resource_metadata_url is not None and not _is_http_url(auth.resource_metadata_url):
        problems.append(f"resource_metadata_url: {auth.resource_metadata_url!r} is not an http(s) URL")

    problems += _scope_problems(auth)
    return problems


def _audience_problems(audience: str | None) -> list[str]:
    if not audience:
        return [("audience is required with mode: jwt: the gateway's canonical resource URI, e.g. "
                 "https://mcp.example.com/mcp (RFC 8707; tokens for any other audience are refused)")]
    parts = urlsplit(audience)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return [f"audience: {audience!r} is not an absolute http(s) URI (RFC 8707 §2)"]
    if parts.fragment or "#" in audience:
        return [f"audience: {audience!r} must not contain a fragment (RFC 8707 §2)"]
    if parts.query:
        return [(f"audience: {audience!r} should not contain a query (RFC 8707 §2); the metadata URL "
                 "could not be derived from it")]
    return []


def resolved_algorithms(auth: AuthSettings) -> tuple[str, ...]:
    """The accepted `alg` values, defaulted from the key source."""
    if auth.algorithms is None:
        if auth.hs256_secret is not None:
            return ("HS256",)
        if auth.public_key is not None or auth.public_key_file is not None:
            try:
                return (_default_algorithm(load_public_key(auth)),)
            except ValueError:
                pass  # reported as the key's own problem
        return DEFAULT_ASYMMETRIC
    if not auth.algorithms:
        raise ValueError("algorithms must not be empty")
    for alg in auth.algorithms:
        if alg.lower() == "none":
            raise ValueError("algorithms: 'none' is never accepted (unsigned tokens)")
        if alg not in ASYMMETRIC_ALGORITHMS and alg not in HMAC_ALGORITHMS:
            known = ", ".join(sorted(ASYMMETRIC_ALGORITHMS | HMAC_ALGORITHMS))
            raise ValueError(f"algorithms: {alg!r} is not supported; use one of {known}")
    return tuple(dict.fromkeys(auth.algorithms))


def _default_algorithm(key: Any) -> str:
    """The one algorithm a fixed public key is used with, unless `algorithms` says otherwise."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        return {"secp384r1": "ES384", "secp521r1": "ES512"}.get(key.curve.name, "ES256")
    if isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return "EdDSA"
    return "RS256"


def _key_problems(auth: AuthSettings, source: str, algorithms: tuple[str, ...]) -> list[str]:
    hmac = [a for a in algorithms if a in HMAC_ALGORITHMS]
    asymmetric = [a for a in algorithms if a in ASYMMETRIC_ALGORITHMS]
    if source == "hs256_secret":
        problems = []
        if asymmetric:
            problems.append(f"algorithms {asymmetric} need a public key, but the key source is hs256_secret")
        assert auth.hs256_secret is not None
        if len(auth.hs256_secret.get_secret_value().encode()) < MIN_HMAC_SECRET_BYTES:
            problems.append(f"hs256_secret must be at least {MIN_HMAC_SECRET_BYTES} bytes (RFC 7518 §3.2)")
        return problems
    if hmac:
        # Algorithm confusion: a verifier that accepts HS256 beside a public key can be fed a
        # token MACed with the (public!) key bytes.
        return [(f"algorithms {hmac} are HMAC algorithms; they are only accepted with hs256_secret, "
                 f"never beside {source}")]
    if source == "jwks_url":
        return _jwks_url_problems(auth.jwks_url or "")
    try:
        key = load_public_key(auth)
    except ValueError as exc:
        return [str(exc)]
    wrong = [a for a in algorithms if not isinstance(key, _FAMILIES[a])]
    if wrong:
        return [f"algorithms {wrong} do not fit the configured {type(key).__name__.removeprefix('_')} public key"]
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        # RFC 7518 §3.3/§3.5: RS*/PS* keys MUST be at least 2048 bits (JWKS keys: jwt_keys).
        return [(f"the public key is a {key.key_size}-bit RSA key; at least {MIN_RSA_BITS} bits are required "
                 "(RFC 7518 §3.3)")]
    return []


def _jwks_url_problems(url: str) -> list[str]:
    from gateway.redis_client.plan import redacted  # any password masked: errors reach logs

    shown = redacted(url)
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:
        return [f"jwks_url: {shown!r} is not an http(s) URL"]
    if parts.scheme not in ("http", "https") or not hostname:
        return [f"jwks_url: {shown!r} is not an http(s) URL"]
    if parts.username is not None or parts.password is not None:
        # A key set is a public document (RFC 8414 §2 `jwks_uri`, RFC 7517); credentials in its
        # URL would be one more place a secret is written down, and the URL is logged when a
        # fetch fails.
        return [f"jwks_url: {shown!r} carries credentials; a JWKS is public: give its URL without them"]
    if parts.scheme == "http" and not _is_loopback(hostname):
        # Whoever can alter the key set in transit can mint tokens the gateway accepts.
        return [f"jwks_url: {shown!r} must use https (plain http is accepted only for loopback hosts)"]
    return []


def load_public_key(auth: AuthSettings) -> Any:
    """The PEM public key of `public_key` or `public_key_file`, parsed."""
    if auth.public_key is not None:
        pem, where = auth.public_key.encode(), "public_key"
    else:
        path = Path(auth.public_key_file or "")
        try:
            pem = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"public_key_file: cannot read {str(path)!r}: {exc.strerror or exc}") from None
        where = f"public_key_file ({path})"
    try:
        return serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: not a PEM public key (-----BEGIN PUBLIC KEY-----): {exc}") from None


def _scope_problems(auth: AuthSettings) -> list[str]:
    problems: list[str] = []
    named: list[tuple[str, str]] = [("required_scopes", s) for s in auth.required_scopes]
    for method, scopes in auth.method_scopes.items():
        if method not in METHODS:
            problems.append(f"method_scopes: {method!r} is not an MCP method the gateway serves "
                            f"({', '.join(sorted(METHODS))})")
        named += [(f"method_scopes.{method}", s) for s in scopes]
    for broad, narrower in auth.scope_implies.items():
        named += [("scope_implies", broad)] + [(f"scope_implies.{broad}", s) for s in narrower]
    named += [("scopes_supported", s) for s in auth.scopes_supported or ()]
    for where, scope in named:
        if not _SCOPE_TOKEN.match(scope):
            problems.append(f"{where}: {scope!r} is not a valid scope token (RFC 6749 §3.3)")
    for where, scope in named:
        if scope == OFFLINE_ACCESS and where != "scope_implies" and not where.startswith("scope_implies."):
            problems.append(f"{where}: servers should not require or advertise {OFFLINE_ACCESS!r} "
                            "(refresh tokens are not a resource requirement; spec: authorization §Refresh Tokens)")
    return problems


def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- compiled form ----------------------------------------------------------------------------


def metadata_url(auth: AuthSettings) -> str:
    """Where clients find the protected resource metadata: the override, or the well-known
    URL of the audience with the path inserted (RFC 9728 §3.1: the terminating slash of the
    resource path is removed before insertion)."""
    if auth.resource_metadata_url:
        return auth.resource_metadata_url
    parts = urlsplit(auth.audience or "")
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{parts.path.rstrip('/')}"


def metadata_paths(auth: AuthSettings, mcp_path: str) -> tuple[str, ...]:
    """The local paths serving the metadata: the root form, and the path-inserted forms for
    the MCP endpoint and for the audience's path (they differ behind a path-rewriting proxy).
    Clients try the path-inserted form first, then the root (authorization-server-discovery)."""
    paths = [WELL_KNOWN]
    for resource_path in (mcp_path, urlsplit(auth.audience or "").path):
        resource_path = resource_path.rstrip("/")
        if resource_path:
            paths.append(WELL_KNOWN + resource_path)
    return tuple(dict.fromkeys(paths))


def expand_scopes(granted: frozenset[str], implies: dict[str, tuple[str, ...]]) -> frozenset[str]:
    """The granted scopes plus everything they imply, transitively (spec: authorization
    §Scope Challenge Handling — a broader scope implies narrower ones)."""
    if not implies:
        return granted
    out = set(granted)
    todo = [s for s in granted if s in implies]
    while todo:
        for narrower in implies[todo.pop()]:
            if narrower not in out:
                out.add(narrower)
                if narrower in implies:
                    todo.append(narrower)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class ScopeRules:
    """Which scopes a request needs: the global ones, plus those of its method."""

    required: tuple[str, ...]
    per_method: dict[str, tuple[str, ...]]
    implies: dict[str, tuple[str, ...]]

    @classmethod
    def from_settings(cls, auth: AuthSettings) -> ScopeRules:
        return cls(tuple(dict.fromkeys(auth.required_scopes)), dict(auth.method_scopes), dict(auth.scope_implies))

    def for_method(self, method: str | None) -> tuple[str, ...]:
        if method is None:
            # No Mcp-Method header: the method cannot be known before the body, and a request
            # without it may still be served (initialize-era clients send none). Fail closed:
            # require every method's scopes.
            extra = [s for scopes in self.per_method.values() for s in scopes]
        else:
            extra = list(self.per_method.get(method, ()))
        return tuple(dict.fromkeys([*self.required, *extra]))
