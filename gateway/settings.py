"""Configuration: a YAML file plus `MCP_GATEWAY_*` environment overrides, validated once.

The models are frozen: the running gateway reads them and never mutates them. Errors name the
field path (`backends.1.url: ...`), which is what `mcp-gateway check-config` prints.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from gateway import config_env
from gateway.secret import Secret

ENV_PREFIX = "MCP_GATEWAY_"
CONFIG_ENV = "MCP_GATEWAY_CONFIG"


class FieldError(ValueError):
    """A cross-field rule broken at `field` (a dotted path below the model that checks it), so
    that the error names the field to fix, not just the section."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerTls(_Frozen):
    """TLS on the MCP listener (docs/auth.md "TLS"). The certificate is read again on
    SIGHUP (`gateway/front_tls.py`): a renewed certificate needs no restart."""

    cert_file: str
    key_file: str
    # Passphrase of an encrypted key_file.
    key_password: Secret | None = None
    # Require a client certificate issued by these CAs (mTLS). None: no client certificate asked.
    client_ca_file: str | None = None

    @model_validator(mode="after")
    def _files(self) -> ServerTls:
        for name in ("cert_file", "key_file", "client_ca_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise FieldError(name, f"{path} is not a readable file")
        return self


class ServerSettings(_Frozen):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    path: str = "/mcp"
    # Extra Origins to accept; same-host and loopback Origins are always accepted.
    allowed_origins: tuple[str, ...] = ()
    # Extra Host header values to accept when bound to loopback (DNS-rebinding defence).
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: Annotated[int, Field(gt=0)] = 4 * 1024 * 1024
    # How long a shutdown waits for in-flight requests before closing them.
    graceful_shutdown_seconds: Annotated[float, Field(ge=0)] = 20.0
    # The HTTP/1.1 protocol under uvicorn: "gateway" (gateway/http11.py, the fast one) or
    # "uvicorn" (its own httptools protocol: the fallback should the gateway's misbehave).
    http: Literal["gateway", "uvicorn"] = "gateway"
    # SSE keep-alive comment interval on quiet streams.
    keepalive_seconds: Annotated[float, Field(gt=0)] = 15.0
    # Serve initialize-era clients (2025-11-25/06-18/03-26) with gateway sessions on the same
    # endpoint (docs/legacy-clients.md). Off: they get the modern 400s.
    legacy_clients: bool = True
    # A legacy client session with no request and no open stream for this long ends (404).
    legacy_session_idle_seconds: Annotated[float, Field(gt=0)] = 1800.0
    # Live legacy client sessions per replica; the least recently used one makes room.
    legacy_max_sessions: Annotated[int, Field(gt=0)] = 10_000
    # Resource URIs remembered from backends' resources/list answers, for routing reads (least
    # recently used out; a URI that fell out is found again by re-listing).
    max_resource_uris: Annotated[int, Field(gt=0)] = 100_000
    # How long a legacy client has to answer a request the gateway sent it (elicitation,
    # sampling, roots) on behalf of a backend's InputRequiredResult.
    legacy_input_timeout_seconds: Annotated[float, Field(gt=0)] = 300.0
    # Legacy clients of the HTTP+SSE transport (2024-11-05): GET here opens a session's
    # stream, messages are POSTed to "<this>/messages" (docs/legacy-clients.md). None: off.
    # Needs legacy_clients.
    legacy_sse_path: str | None = "/sse"
    # -- operations and lifecycle (docs/deploy.md) --
    # The operations listener: when set, /healthz, /readyz and /metrics are served on this
    # port only, without the Host, Origin and authentication checks of the MCP listener (the
    # kubelet and Prometheus send `Host: <pod IP>`), and the MCP listener no longer serves them.
    ops_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    # Its address; None: the same as `host`.
    ops_host: str | None = None
    # What /readyz requires of the backends, as last seen by the background checks: "any" (at
    # least one answers: one sick backend never takes a fleet out of its Service), "all" (a
    # sidecar's own server), "none" (the process alone), or a number N (at least N answer).
    readiness: Literal["any", "all", "none"] | int = "any"
    # How often each backend's background check refreshes its discovery (and so its state).
    readiness_interval_seconds: Annotated[float, Field(gt=0)] = 10.0
    # On SIGTERM /readyz turns 503 at once and the listener keeps accepting this long, so that
    # load balancers stop sending first; then the graceful shutdown begins. SIGINT skips it.
    drain_delay_seconds: Annotated[float, Field(ge=0)] = 5.0
    # -- TLS on the MCP listener (the ops listener stays plain HTTP for probes) --
    tls: ServerTls | None = None

    @field_validator("readiness", mode="before")
    @classmethod
    def _readiness(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)  # from the environment
        if v in ("any", "all", "none") or (type(v) is int and v >= 1):
            return v
        raise ValueError(f"{v!r}: must be 'any', 'all', 'none' or a number of backends (>= 1)")

    @field_validator("path", "legacy_sse_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError("must start with '/'")
        return v.rstrip("/") or "/"

    @model_validator(mode="after")
    def _distinct_paths(self) -> ServerSettings:
        sse = self.legacy_sse_path
        if sse is not None and self.path in (sse, f"{sse.rstrip('/')}/messages"):
            raise FieldError("legacy_sse_path",
                             f"legacy_sse_path {sse!r} and its /messages must differ from path {self.path!r}")
        if self.ops_port is not None and self.ops_port == self.port and self.port != 0 and (
                self.ops_host or self.host) == self.host:
            raise FieldError("ops_port", f"ops_port {self.ops_port} is the MCP port: the operations listener "
                                         "needs a port of its own (or leave ops_port unset)")
        return self

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for origin in v:
            if origin != "*" and not urlsplit(origin).scheme:
                raise ValueError(f"{origin!r} is not an origin like 'https://app.example.com'")
        return tuple(o.rstrip("/").lower() for o in v)

    @property
    def bound_to_loopback(self) -> bool:
        if self.host in ("localhost", "ip6-localhost"):
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _shown_url(url: str) -> str:
    """A URL for an error message: any password in it masked."""
    from gateway.redis_client.plan import redacted

    return redacted(url)


def _header_name(name: str) -> str:
    name = name.strip().lower()
    if not name or any(c in name for c in " :\r\n\t"):
        raise ValueError(f"{name!r} is not an HTTP header name")
    return name


class HeadersAuth(_Frozen):
    """Static headers, each a secret (an API key, a fixed bearer token)."""

    type: Literal["headers"]
    headers: Annotated[dict[str, Secret], Field(min_length=1)]

    @field_validator("headers")
    @classmethod
    def _names(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        return {_header_name(name): value for name, value in v.items()}


class _TokenEndpoint(_Frozen):
    # The authorization server's token endpoint (RFC 6749 §3.2).
    token_url: str
    # RFC 8707 resource indicator(s) and audience of the token asked for; the scope asked for.
    resource: str | None = None
    audience: str | None = None
    scope: str | None = None
    # How the client authenticates at the token endpoint: HTTP Basic (RFC 6749 §2.3.1, the
    # default every server supports) or the two form fields.
    client_auth: Literal["basic", "post"] = "basic"
    # PEM bundle trusted for an https token_url instead of the system's (a private CA).
    ca_file: str | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    # A token is refreshed this long before its expires_in runs out (in the background while
    # the old one still serves); a token without expires_in is kept this long at most.
    refresh_before_seconds: Annotated[float, Field(ge=0)] = 60.0
    default_lifetime_seconds: Annotated[float, Field(gt=0)] = 300.0

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, v: str | None) -> str | None:
        if v is not None and not os.path.isfile(v):
            raise ValueError(f"{v} is not a readable file")
        return v

    @field_validator("token_url")
    @classmethod
    def _token_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{_shown_url(v)!r} is not an http(s) URL")
        return v


class ClientCredentialsAuth(_TokenEndpoint):
    """OAuth 2.0 client credentials (RFC 6749 §4.4): one token for the gateway itself."""

    type: Literal["oauth_client_credentials"]
    client_id: str
    client_secret: Secret


class ActorCredentials(_Frozen):
    """The gateway's own client credentials, whose token is the RFC 8693 actor_token."""

    token_url: str | None = None  # None: the exchange's token_url
    client_id: str
    client_secret: Secret
    scope: str | None = None
    audience: str | None = None
    resource: str | None = None


class TokenExchangeAuth(_TokenEndpoint):
    """RFC 8693 token exchange: the caller's validated access token becomes a token for this
    backend, per principal (needs auth.mode: jwt)."""

    type: Literal["token_exchange"]
    # The gateway's client at the token endpoint (most servers require one for exchange).
    client_id: str | None = None
    client_secret: Secret | None = None
    requested_token_type: str = "urn:ietf:params:oauth:token-type:access_token"
    actor: ActorCredentials | None = None
    # Exchanged tokens kept per backend (one per principal), least recently used out.
    max_cached_tokens: Annotated[int, Field(gt=0)] = 10_000

    @model_validator(mode="after")
    def _client(self) -> TokenExchangeAuth:
        if (self.client_id is None) != (self.client_secret is None):
            raise FieldError("client_secret", "client_id and client_secret go together")
        return self


_AUTH_TYPES = frozenset({"headers", "oauth_client_credentials", "token_exchange"})
BackendAuth = Annotated[HeadersAuth | ClientCredentialsAuth | TokenExchangeAuth, Field(discriminator="type")]


class BackendTls(_Frozen):
    """TLS toward an https backend, built once into an ssl.SSLContext (backends/tls.py)."""

    # PEM bundle of the CAs to trust instead of the system's (a private CA).
    ca_file: str | None = None
    # Client certificate and key (PEM) for a backend that requires mTLS.
    cert_file: str | None = None
    key_file: str | None = None
    # The name checked in the backend's certificate and sent as SNI, when not the URL's host.
    server_name: str | None = None
    # No certificate check at all; refused unless `allow_insecure_skip_verify` is set too.
    insecure_skip_verify: bool = False
    allow_insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> BackendTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise FieldError("key_file" if self.key_file is None else "cert_file",
                             "cert_file and key_file go together (the client certificate and its key)")
        if self.insecure_skip_verify and not self.allow_insecure_skip_verify:
            raise FieldError("insecure_skip_verify",
                             "turns off every certificate check (anyone on the path can read and change the "
                             "traffic); refused unless allow_insecure_skip_verify: true is set too")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise FieldError(name, f"{path} is not a readable file")
        return self


# Request headers that `forward_headers` can never name, as source or target: credentials
# (no token passthrough; spec: authorization §Token Passthrough), hop-by-hop headers (RFC 9110
# §7.6.1), framing, and the headers the gateway itself sets or relays toward backends.
NEVER_FORWARDED = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie",
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
    "host", "content-length", "content-type", "content-encoding", "accept", "accept-encoding", "expect",
    "mcp-protocol-version", "mcp-method", "mcp-name", "mcp-session-id", "last-event-id",
    "traceparent", "tracestate", "baggage", "x-mcp-gateway-forwarded", "forwarded", "x-forwarded-for",
})
NEVER_FORWARDED_PREFIXES = ("mcp-param-", "x-mcp-gateway-")


def _forwardable(name: str, role: str) -> str:
    name = _header_name(name)
    if name in NEVER_FORWARDED or name.startswith(NEVER_FORWARDED_PREFIXES):
        why = ("a credential (the spec forbids token passthrough)" if name in (
            "authorization", "proxy-authorization", "cookie", "set-cookie") else
               "a hop-by-hop, framing or gateway-managed header")
        raise ValueError(f"{name!r} can never be forwarded ({role}): it is {why}")
    return name


class ForwardedHeader(_Frozen):
    """One client request header passed on to the backend, under `to` (default: its name)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    from_: Annotated[str, Field(alias="from")]
    to: str | None = None

    @field_validator("from_")
    @classmethod
    def _from(cls, v: str) -> str:
        return _forwardable(v, "from")

    @field_validator("to")
    @classmethod
    def _to(cls, v: str | None) -> str | None:
        return None if v is None else _forwardable(v, "to")

    @property
    def target(self) -> str:
        return self.to or self.from_
class CanarySettings(_Frozen):
    """A `tools/call` the active health check makes (backends[].health.canary): it passes when
    the call succeeds and, if `expect` is set, the text of its result contains it."""

    tool: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = Field(default_factory=dict)
    expect: str | None = None


class HealthSettings(_Frozen):
    """Remembered health of one backend (docs/resilience.md): passive outlier detection on
    the calls that pass, active checks in the background, ejection and half-open recovery."""

    # Consecutive failed calls (no connection, reset, timeout, HTTP 5xx) that eject it.
    consecutive_failures: Annotated[int, Field(ge=1)] = 5
    # The first ejection lasts this long; each further one (without a full recovery in
    # between) lasts one more base time, up to the cap.
    base_ejection_seconds: Annotated[float, Field(gt=0)] = 10.0
    max_ejection_seconds: Annotated[float, Field(gt=0)] = 300.0
    # Never more than this share of a backend's endpoints ejected at once (at least one stays
    # in rotation). With one endpoint, it is ejected alone whatever the share.
    max_ejected_percent: Annotated[int, Field(ge=0, le=100)] = 50
    # Active checks: server/discover (an initialize on a legacy session, a round trip through
    # a stdio process), or the canary below, every interval (0: no active checks). A check that
    # passes ends an ejection at once; `failed_checks` failed ones in a row eject.
    check_interval_seconds: Annotated[float, Field(ge=0)] = 10.0
    check_timeout_seconds: Annotated[float, Field(gt=0)] = 2.0
    failed_checks: Annotated[int, Field(ge=1)] = 2
    canary: CanarySettings | None = None


class ResolveSettings(_Frozen):
    """DNS expansion of a backend's URLs (docs/resilience.md "Several endpoints"): each
    hostname is resolved by the system resolver, every address it has becomes an endpoint
    (connected to directly, with the URL's Host header and TLS name), and the answer is asked
    again every interval. Off unless set: see the docs for why."""

    interval_seconds: Annotated[float, Field(gt=0)] = 30.0


class CurationSettings(_Frozen):
    """What a backend shows of its tools, prompts or resources (routing/curation.py), by its
    own names (resources: URIs), before the prefix."""

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    rename: dict[str, str] = Field(default_factory=dict)
    descriptions: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> CurationSettings:
        shown = list(self.rename.values())
        dupes = sorted({n for n in shown if shown.count(n) > 1})
        if dupes:
            raise ValueError(f"rename: two names renamed to {', '.join(dupes)}")
        for own, new in self.rename.items():
            if not new:
                raise ValueError(f"rename.{own}: the new name is empty")
            if new in self.rename and new != own:
                raise ValueError(f"rename.{own}: {new!r} is itself renamed; a name can be renamed once")
        return self


class RootSettings(_Frozen):
    """One root an initialize-era backend is told about when it asks `roots/list` outside a
    client request (legacy schema `Root`: a `file://` URI and an optional display name)."""

    uri: str
    name: str | None = None

    @field_validator("uri")
    @classmethod
    def _file_uri(cls, v: str) -> str:
        # 2025-11-25 schema Root.uri: "This *must* start with file:// for now."
        if not v.startswith("file://"):
            raise ValueError(f"{v!r} is not a file:// URI (a root must be one)")
        return v


class BackendSettings(_Frozen):
    name: Annotated[str, Field(pattern=r"^[a-z0-9-]+$", min_length=1, max_length=63)]
    url: str | None = None
    # Several endpoints of one backend (beside or instead of `url`; Streamable HTTP of either
    # era): modern calls go to the healthy one with fewer requests in flight of two picked at
    # random, and one that cannot be reached sends the call to another; a legacy session is
    # created on one chosen so and stays there until it cannot be reached (docs/resilience.md).
    urls: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    # Extra environment for a stdio backend. It inherits only PATH, HOME, locale, TZ, TMPDIR
    # and user names from the gateway, plus the variables named in `inherit_env`.
    env: dict[str, str] = Field(default_factory=dict)
    inherit_env: tuple[str, ...] = ()
    era: Literal["auto", "modern", "legacy"] = "auto"
    # HTTP backends: "streamable-http" (2025-03-26 on, and every modern server) or "sse", the
    # HTTP+SSE transport of 2024-11-05 (a GET stream that names a POST endpoint; always
    # initialize-era). "auto": Streamable HTTP, unless the era probe (era: auto) gets 404/405
    # for its POST and a GET on the URL opens an SSE stream whose first event is `endpoint`
    # (2025-03-26 transports §Backwards Compatibility). docs/legacy.md "HTTP+SSE backends".
    transport: Literal["auto", "streamable-http", "sse"] = "auto"
    # Prepended to this backend's tool and prompt names. None: "" with one backend,
    # "<name>__" with several (DESIGN.md, the user-facing contract).
    prefix: str | None = None
    # URI prefixes (or "scheme:") routed to this backend for resources/read, in addition to
    # the URIs it lists.
    resource_prefixes: tuple[str, ...] = ()
    # Static headers sent upstream, each a secret (an API key, say): the compatible form of
    # `auth: {type: headers}`, sent with whatever `auth` adds. The client's own credentials
    # are never forwarded (spec: no token passthrough).
    headers: dict[str, Secret] = Field(default_factory=dict)
    # -- who the gateway is toward this backend (docs/auth.md "Credentials for backends") --
    auth: BackendAuth | None = None
    # TLS toward an https backend: private CA, client certificate (mTLS), SNI override.
    tls: BackendTls | None = None
    # Client request headers passed on by choice (an allowlist; a tenant id, say). Credentials,
    # hop-by-hop and the gateway's own headers are refused here (NEVER_FORWARDED).
    forward_headers: tuple[ForwardedHeader, ...] = ()
    # A header naming the principal to the backend, signed with an HMAC of security.secret
    # (format: docs/auth.md "Chosen client headers and the identity header"). None: not sent.
    identity_header: str | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 60.0
    connect_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Deadline for this backend's share of an aggregated list; a late backend is left out.
    list_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Retries (every backend kind, docs/resilience.md "Retries"): of idempotent reads (lists,
    # resources/read, server/discover) after a failure, and of any call that provably never
    # reached the backend; never after a byte reached the client. Within the retry budget.
    retries: Annotated[int, Field(ge=0, le=5)] = 1
    max_connections: Annotated[int, Field(gt=0)] = 256
    # The largest answer read from this backend: a JSON body, or one event of a stream. A
    # larger one fails the call (-31003) and its connection is closed, so that a broken or
    # hostile backend cannot make the gateway buffer without bound.
    max_response_bytes: Annotated[int, Field(gt=0)] = 32 * 1024 * 1024
    # Initialize-era backends (docs/legacy.md). They send no caching hints, so the gateway
    # adds these to their cacheable results (digest §e: the hints are required).
    default_ttl_ms: Annotated[int, Field(ge=0)] = 0
    default_cache_scope: Literal["private", "public"] = "private"
    # Live initialized sessions per backend (one per client-capability set in use), busy ones
    # included; the least recently used idle one is closed (DELETE) to make room, and a call
    # that finds none free within connect_timeout_seconds fails with -31004.
    session_pool_size: Annotated[int, Field(gt=0, le=1024)] = 16
    # An idle legacy session is closed after this long.
    session_idle_seconds: Annotated[float, Field(gt=0)] = 300.0
    # How long a legacy backend call stays parked waiting for the client's MRTR retry.
    input_wait_seconds: Annotated[float, Field(gt=0)] = 300.0
    # Parked legacy calls (each holds a backend request and session) per replica, in total and
    # per principal; past the cap a call that would park fails with -31004.
    max_parked_calls: Annotated[int, Field(gt=0)] = 1000
    max_parked_calls_per_principal: Annotated[int, Field(gt=0)] = 100
    # Overall deadline of one backend call (all of its stream, however often the backend sends
    # progress or keep-alives; SHTTP: senders SHOULD enforce a maximum). Not for listens.
    max_call_seconds: Annotated[float, Field(gt=0)] = 600.0
    # stdio backends: first delay before restarting a process that died (doubles, capped).
    restart_backoff_seconds: Annotated[float, Field(gt=0)] = 0.5
    # stdio backends: processes of `command` behind this one name, each with its own health
    # (and, initialize-era, its own session); a call goes to a running, healthy one with fewer
    # requests in flight of two picked at random (docs/resilience.md "stdio instances").
    instances: Annotated[int, Field(ge=1, le=64)] = 1
    # -- resilience (docs/resilience.md) --
    health: HealthSettings = HealthSettings()
    # A hostname in `url`/`urls` resolved into one endpoint per address and re-resolved
    # (a Kubernetes headless Service); IP literals are left as they are.
    resolve: ResolveSettings | None = None
    # Calls in flight to this backend at once (None: no limit). Past it a call waits up to
    # `queue_wait_seconds` in a queue of `max_queued_calls`, then fails with -31004 (HTTP 503).
    max_concurrent_calls: Annotated[int, Field(gt=0)] | None = None
    max_queued_calls: Annotated[int, Field(ge=0)] = 100
    queue_wait_seconds: Annotated[float, Field(ge=0)] = 0.1
    # Retries stay within this share of the calls made (plus `retry_budget_min_per_second`),
    # so a brown-out is not amplified; each waits a jittered backoff, doubling from
    # `retry_backoff_seconds` up to `retry_backoff_max_seconds`.
    retry_budget_percent: Annotated[float, Field(ge=0, le=100)] = 20.0
    retry_budget_min_per_second: Annotated[float, Field(ge=0)] = 5.0
    retry_backoff_seconds: Annotated[float, Field(ge=0)] = 0.025
    retry_backoff_max_seconds: Annotated[float, Field(ge=0)] = 0.5
    # Curation (routing/curation.py; docs/governance.md): what this backend shows.
    tools: CurationSettings | None = None
    prompts: CurationSettings | None = None
    resources: CurationSettings | None = None
    # Pinned tool definitions (routing/pins.py): a tool whose definition changes after it was
    # first seen is logged and counted (warn) or withheld until `pins accept` (block).
    pin: Literal["off", "warn", "block"] = "off"
    # Initialize-era backends that ask `roots/list` outside any client request (at start-up,
    # say) get these; empty: an empty list. Asked during a client's call, the question goes
    # to that client (MRTR) as before. docs/legacy.md "Roots".
    roots: tuple[RootSettings, ...] = ()

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{_shown_url(v)!r} is not an http(s) URL")
        if parts.username is not None or parts.password is not None:
            # Never sent (the upstream client reads host and port only), and the URL's origin
            # names the endpoint in logs and in /metrics labels.
            raise ValueError(f"{_shown_url(v)!r} carries credentials, which are never sent from a URL: set them "
                             "in headers or auth")
        return v

    @field_validator("pin", mode="before")
    @classmethod
    def _pin_off(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `pin: off` as false: that is the "off" the operator wrote.
        return "off" if v is False else v

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            cls._url(url)
        return v

    @model_validator(mode="before")
    @classmethod
    def _first_of_urls(cls, data: Any) -> Any:
        # `urls` alone: its first is `url` (what the era probe and single-URL code read).
        if isinstance(data, dict) and data.get("url") is None and data.get("urls"):
            data = {**data, "url": list(data["urls"])[0]}
        return data

    @property
    def endpoint_urls(self) -> tuple[str, ...]:
        """`url` and `urls`, each once, in order."""
        return tuple(dict.fromkeys(((self.url,) if self.url is not None else ()) + self.urls))

    @field_validator("command")
    @classmethod
    def _command(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and (not v or not v[0]):
            raise ValueError("must be a non-empty list: [program, arg, ...]")
        return v

    @field_validator("headers")
    @classmethod
    def _header_names(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        return {_header_name(name): value for name, value in v.items()}

    @field_validator("identity_header")
    @classmethod
    def _identity_header(cls, v: str | None) -> str | None:
        return None if v is None else _forwardable(v, "identity_header")

    @model_validator(mode="after")
    def _one_transport(self) -> BackendSettings:
        if isinstance(self.auth, HeadersAuth):
            both = sorted(set(self.headers) & set(self.auth.headers))
            if both:
                raise FieldError("auth.headers", f"{', '.join(both)} also set in backends[].headers: set each "
                                                 "header in one place")
        if self.auth is not None and self.auth.type != "headers" and "authorization" in self.headers:
            raise FieldError("headers", f"authorization is set by auth ({self.auth.type}): remove it from headers")
        targets = [f.target for f in self.forward_headers] + ([self.identity_header] if self.identity_header else [])
        taken = sorted({t for t in targets if targets.count(t) > 1} | (set(targets) & set(self.headers)))
        if taken:
            raise FieldError("forward_headers", f"{', '.join(taken)}: each upstream header comes from one place "
                                                "(headers, forward_headers or identity_header)")
        if (self.forward_headers or self.identity_header) and self.url is None:
            raise FieldError("forward_headers" if self.forward_headers else "identity_header",
                             "applies to 'url' backends only")
        if (self.tls is not None or self.auth is not None) and self.url is None:
            raise FieldError("tls" if self.tls is not None else "auth",
                             "applies to 'url' backends only (a 'command' backend gets `env`)")
        if (self.url is None) == (self.command is None):
            raise FieldError("url", "set exactly one of 'url' (Streamable HTTP) or 'command' (stdio)")
        if self.instances > 1 and self.command is None:
            raise FieldError("instances", "applies to 'command' (stdio) backends only: an HTTP backend names its "
                                          "endpoints in 'urls'")
        if self.transport != "auto" and self.url is None:
            raise FieldError("transport", "'transport' applies to 'url' backends only (a 'command' backend speaks stdio)")
        if self.transport == "sse" and self.era == "modern":
            raise FieldError("era", "transport 'sse' (HTTP+SSE, 2024-11-05) is initialize-era: "
                                    "era must be 'legacy' or 'auto'")
        if self.resources is not None and (self.resources.rename or self.resources.descriptions):
            raise FieldError("resources", "only include and exclude apply (URIs are not renamed)")
        if self.resolve is not None and self.url is None:
            raise FieldError("resolve", "applies to 'url' backends only")
        if (len(self.endpoint_urls) > 1 or self.resolve is not None) and self.transport == "sse":
            raise FieldError("resolve" if self.resolve is not None and len(self.endpoint_urls) == 1 else "urls",
                             "several endpoints need Streamable HTTP (modern or legacy) in this build: "
                             "an HTTP+SSE session is one GET stream to one URL")
        return self


CacheableMethod = Literal[
    "server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"
]
_Millis = Annotated[int, Field(ge=0)]


class CacheRule(_Frozen):
    """Freshness bounds for one backend and/or method (docs/cache.md). A field left unset
    falls through to a less specific rule, then to the `cache` section itself."""

    backend: str | None = None  # None: every backend
    method: CacheableMethod | None = None  # None: every cacheable method
    enabled: bool | None = None
    default_ttl_ms: _Millis | None = None
    min_ttl_ms: _Millis | None = None
    max_ttl_ms: _Millis | None = None
    # Treat every result as private, whatever the backend says.
    force_private: bool | None = None


# -- Redis ---------------------------------------------------------------------------------


def _shown_redis_url(url: str | None) -> str | None:
    from gateway.redis_client.plan import redacted

    return None if url is None else redacted(url)


# A Redis URL may carry a password: JSON dumps of the settings show it without one (and
# `_RedisUrlsHidden` does the same for repr/str); the client gets the URL as written.
RedisUrl = Annotated[str, PlainSerializer(_shown_redis_url, when_used="json")]


class _RedisUrlsHidden(_Frozen):
    """A section with Redis URL fields (`url`, the `redis_url` short forms): its repr and str
    show them without their password."""

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (_shown_redis_url(value) if name in ("url", "redis_url") and isinstance(value, str) else value)


class RedisSettings(_RedisUrlsHidden):
    """One Redis deployment, in any shape (docs/scale.md): a URL, or explicit `sentinels` +
    `service_name`, or `cluster: true` + seed `nodes`. The rules live in
    gateway/redis_client/plan.py, so check-config and serve apply the same ones."""

    # A URL may carry a password: validation errors never echo the input.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    # redis:// rediss:// unix:// | redis+sentinel://h1:26379,h2:26379/service/db |
    # redis+cluster://h1:6379,h2:6379. Unset: redis://127.0.0.1:6379/0 unless the explicit
    # forms below are used.
    url: RedisUrl | None = None
    sentinels: tuple[str, ...] = ()  # host:port of each Sentinel
    service_name: str | None = None  # the master's name in Sentinel
    cluster: bool = False
    nodes: tuple[str, ...] = ()  # Cluster seed nodes (host:port); the rest are discovered
    db: Annotated[int, Field(ge=0)] | None = None
    username: str | None = None
    # A secret (gateway/secret.py): a value, {env: VAR} or {file: path}.
    password: Secret | None = None
    # Sentinel's own credentials, when the Sentinels require them (often not the data nodes').
    sentinel_username: str | None = None
    sentinel_password: Secret | None = None
    # TLS: on with rediss:// (or tls: true); ca_file verifies the server, cert/key for mTLS.
    tls: bool | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @model_validator(mode="after")
    def _plan(self) -> RedisSettings:
        from gateway.redis_client.plan import plan_of

        plan_of(self)  # raises ValueError naming what is wrong
        return self


class CacheSettings(_RedisUrlsHidden):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)  # redis_url

    store: Literal["memory", "redis", "none"] = "memory"
    # The cache's own Redis; unset: the top-level `redis:` block. `redis_url` is the short
    # form of `redis: {url: ...}`, kept for existing configs.
    redis: RedisSettings | None = None
    redis_url: RedisUrl | None = None
    # Prefix of every Redis key and the invalidation channel; replicas sharing a cache share it.
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = "mcpgw"
    # The in-memory store (store: memory): LRU bounded by entry count and by encoded bytes.
    # Encoded bytes, not process memory: an entry costs ~6-9x its encoded size in RSS
    # (docs/cache.md "Memory"), so 64 MiB of max_bytes is roughly 400-600 MiB of memory.
    max_entries: Annotated[int, Field(gt=0)] = 10_000
    max_bytes: Annotated[int, Field(gt=0)] = 64 * 1024 * 1024
    # A larger result is served but not stored.
    max_entry_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024
    # Freshness: the backend's ttlMs, clamped to [min, max]; `default_ttl_ms` when it sends
    # none (spec: absent means 0, so the default is 0). `rules` refine per backend/method.
    default_ttl_ms: _Millis = 0
    min_ttl_ms: _Millis = 0
    max_ttl_ms: _Millis = 3_600_000
    rules: tuple[CacheRule, ...] = ()
    # Remember a backend's "method not found" for this long (0: never).
    negative_ttl_ms: _Millis = 0
    # Serve an expired entry for this long past its expiry when the backend fails (0: never).
    stale_if_error_ms: _Millis = 0
    # Redis values larger than this are zlib-compressed.
    compress_above_bytes: _Millis = 1024
    # With Redis: a small in-process layer in front (0 entries: none). Entries live there at
    # most `local_ttl_ms`; invalidations published by any replica drop them everywhere.
    local_max_entries: _Millis = 1000
    local_ttl_ms: _Millis = 1000
    # Cross-replica fetch lock: how long one replica may hold it while it asks the backend.
    lock_timeout_ms: Annotated[int, Field(gt=0)] = 2000
    # Redis commands slower than this count as a failure (the request then bypasses the cache).
    redis_timeout_ms: Annotated[int, Field(gt=0)] = 250
    # After a Redis failure, skip Redis for this long before trying again.
    redis_retry_seconds: Annotated[float, Field(ge=0)] = 1.0

    @model_validator(mode="after")
    def _bounds(self) -> CacheSettings:
        _one_redis(self.redis, self.redis_url)
        if self.min_ttl_ms > self.max_ttl_ms:
            raise FieldError("min_ttl_ms", f"min_ttl_ms ({self.min_ttl_ms}) is above max_ttl_ms ({self.max_ttl_ms})")
        for i, rule in enumerate(self.rules):
            low = rule.min_ttl_ms if rule.min_ttl_ms is not None else self.min_ttl_ms
            high = rule.max_ttl_ms if rule.max_ttl_ms is not None else self.max_ttl_ms
            if low > high:
                raise FieldError(f"rules.{i}.min_ttl_ms", f"min_ttl_ms ({low}) is above max_ttl_ms ({high})")
        return self


class AuthSettings(_Frozen):
    """How callers authenticate (docs/auth.md). `jwt`: the gateway is an OAuth 2.1 resource
    server (digest §i) that validates JWT access tokens itself and serves RFC 9728 metadata."""

    mode: Literal["none", "jwt"] = "none"
    # The `iss` every token must carry.
    issuer: str | None = None
    # The gateway's canonical resource URI (RFC 8707 §2), e.g. https://mcp.example.com/mcp:
    # the `aud` every token must carry, and the `resource` of the protected resource metadata.
    audience: str | None = None
    # Exactly one key source: a JWKS URL, a PEM public key (inline or a file), or a shared
    # HMAC secret (docs/auth.md explains the trade-off).
    jwks_url: str | None = None
    public_key: str | None = None
    public_key_file: str | None = None
    hs256_secret: Secret | None = None
    # Accepted `alg` values. Default: RS256 and ES256 with jwks_url, the key's own algorithm
    # with a public key, HS256 with hs256_secret. Never "none".
    algorithms: tuple[str, ...] | None = None
    leeway_seconds: Annotated[float, Field(ge=0, le=300)] = 30.0
    # Scopes every request needs, and scopes per MCP method on top of them.
    required_scopes: tuple[str, ...] = ()
    method_scopes: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # Scope hierarchy (spec: a broader scope implies narrower ones): scope -> scopes it implies.
    scope_implies: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # RFC 9728: the authorization servers clients should use (at least one), and the scopes
    # published in the metadata (default: `required_scopes`).
    authorization_servers: tuple[str, ...] = ()
    scopes_supported: tuple[str, ...] | None = None
    # Where the metadata is published, when not the path-inserted well-known URL of `audience`.
    resource_metadata_url: str | None = None
    # JWKS: keys are kept this long; an unknown `kid` triggers a refetch at most once per
    # `jwks_min_refresh_seconds`; when the IdP is down the last good key set keeps serving.
    jwks_cache_seconds: Annotated[float, Field(gt=0)] = 300.0
    jwks_min_refresh_seconds: Annotated[float, Field(ge=0)] = 30.0
    jwks_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Token claims kept on the Principal (e.g. groups, tenant), for the `authorization` rules
    # and `rate_limits` keys (docs/governance.md). Others are dropped after verification.
    claims: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> AuthSettings:
        # Kept beside the policy, so every rule about a key source lives in one module.
        from gateway.policies.jwt_config import check_auth_settings

        check_auth_settings(self)
        return self


class SecuritySettings(_Frozen):
    # Key for the HMAC that seals gateway-minted MRTR `requestState` (docs/legacy.md). Unset:
    # a random per-process key, which only works with a single replica.
    secret: Secret | None = None
    # This replica's own MCP endpoint as the other replicas reach it; an MRTR retry that lands
    # on another replica is forwarded here. Default: http://<server.host>:<server.port><path>.
    advertise_url: str | None = None


class ObservabilitySettings(_Frozen):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # json: one JSON object per line for the gateway's and uvicorn's logs and the access log
    # (the image and the manifests set it); text: the classic one-line format.
    log_format: Literal["json", "text"] = "text"
    # One access line per MCP request (method, name, backend, status, JSON-RPC code, duration,
    # cache outcome, subject, request id, trace id): docs/observability.md "Access log".
    access_log: bool = False
    # The share of successful requests that get an access line (errors always do).
    access_log_sample: float = Field(1.0, ge=0.0, le=1.0)
    # OpenTelemetry spans per request, continued from the client's traceparent.
    tracing: bool = False
    # console, or otlp: OTLP/HTTP, from the `otlp` extra (`pip install "mcp-gateway[otlp]"`,
    # in the Docker image), configured by the standard OTEL_EXPORTER_OTLP_* variables.
    tracing_exporter: Literal["console", "otlp"] = "console"
    # mcp.server/client.operation.duration over OTLP too (OTEL_EXPORTER_OTLP_*; the `otlp`
    # extra); /metrics has them either way.
    otlp_metrics: bool = False


class SubscriptionSettings(_RedisUrlsHidden):
    """The subscriptions/listen hub (docs/subscriptions.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)  # redis_url

    # Client listen streams one replica accepts, in total and per principal.
    max_listens: Annotated[int, Field(gt=0)] = 10_000
    max_listens_per_principal: Annotated[int, Field(gt=0)] = 1_000
    # Notifications a client may fall behind before its stream is closed (it re-listens).
    queue_size: Annotated[int, Field(gt=0)] = 256
    # An upstream listen stays open this long after its last client left.
    linger_seconds: Annotated[float, Field(ge=0)] = 2.0
    # How long a client's ack waits for a backend's upstream ack; a backend that is later is
    # left out of that client's ack.
    ack_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Upstream reconnects: exponential backoff with jitter between these bounds.
    reconnect_initial_seconds: Annotated[float, Field(gt=0)] = 0.2
    reconnect_max_seconds: Annotated[float, Field(gt=0)] = 15.0
    # Redis for fan-out across replicas and the election of one holder per upstream stream.
    # Unset: the top-level `redis:` block when it is set or cache.store is redis (the cache's
    # own Redis then); otherwise each replica works alone. `redis_url`: short form.
    redis: RedisSettings | None = None
    redis_url: RedisUrl | None = None
    redis_key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = "mcpgw"
    # A holder that stops renewing loses its streams to another replica after this long.
    lease_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Backends that cannot listen (listen refused, or an ack that honours less than asked):
    # the stream's holder polls their lists and subscribed resources instead, each every
    # ttlMs of its last answer, bounded by these, and notifies on a change
    # (docs/subscriptions.md "Backends without listen"). false: such backends stay silent.
    poll_fallback: bool = True
    poll_min_seconds: Annotated[float, Field(gt=0)] = 5.0
    poll_max_seconds: Annotated[float, Field(gt=0)] = 300.0

    @model_validator(mode="after")
    def _poll_bounds(self) -> SubscriptionSettings:
        if self.poll_max_seconds < self.poll_min_seconds:
            raise ValueError(f"poll_max_seconds ({self.poll_max_seconds:g}) must be at least poll_min_seconds "
                             f"({self.poll_min_seconds:g})")
        return self

    @model_validator(mode="after")
    def _redis(self) -> SubscriptionSettings:
        _one_redis(self.redis, self.redis_url)
        return self


def _one_redis(block: RedisSettings | None, url: str | None) -> None:
    if block is not None and url is not None:
        raise ValueError("set 'redis' or its short form 'redis_url', not both")
    if url is not None:
        RedisSettings(url=url)  # the same rules as the block


def section_redis(block: RedisSettings | None, url: str | None) -> RedisSettings | None:
    """A section's own Redis: its `redis` block, or its `redis_url` short form; None: neither."""
    if block is not None:
        return block
    return RedisSettings(url=url) if url is not None else None


# -- governance: authorization rules and rate limits (docs/governance.md) -------------------

_Globs = tuple[Annotated[str, Field(min_length=1)], ...]


class RuleCondition(_Frozen):
    """What the caller must hold for a rule to apply: every scope, and every claim (a claim
    holds when it equals one of the values, or is a list that contains one)."""

    scopes: tuple[str, ...] = ()
    claims: dict[str, str | tuple[str, ...]] = Field(default_factory=dict)


class AuthorizationRule(_Frozen):
    effect: Literal["allow", "deny"]
    # Unset: any. Globs for names (as the client sees them) and URIs.
    methods: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    names: _Globs | None = None
    uris: _Globs | None = None
    when: RuleCondition = RuleCondition()
    # A label for errors and logs; default "rules.<index>".
    id: str | None = None


class AuthorizationSettings(_Frozen):
    """Who may call what (policies/authorization.py): first matching rule wins."""

    default: Literal["allow", "deny"] = "allow"
    rules: tuple[AuthorizationRule, ...] = ()


class RateLimit(_Frozen):
    """One limit (policies/ratelimit.py): `rate` requests per second/minute/hour with `burst`
    at once, counted per value of `key`, for the calls its globs match."""

    rate: Annotated[str, Field(pattern=r"^\s*\d+(\.\d+)?\s*/\s*(s|m|h)\s*$")]
    burst: Annotated[int, Field(gt=0)] | None = None
    # What a bucket is per: principal, name, backend, method, claim:<name>; combined.
    key: tuple[str, ...] = ("principal",)
    methods: tuple[str, ...] | None = None
    names: _Globs | None = None
    backends: tuple[str, ...] | None = None
    id: str | None = None

    @field_validator("key")
    @classmethod
    def _key(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for part in v:
            if part not in ("principal", "name", "backend", "method") and not (
                    part.startswith("claim:") and len(part) > len("claim:")):
                raise ValueError(f"{part!r} is not principal, name, backend, method or claim:<name>")
        if not v:
            raise ValueError("must name at least one of principal, name, backend, method, claim:<name>")
        return v


class ViewSettings(_Frozen):
    """A curated MCP endpoint over the same fleet (routing/views.py, docs/governance.md
    "Views"): the backends it shows (unset: all), the tool and prompt names it shows (globs on
    names as clients see them; unset: every name of those backends), and its own rules,
    evaluated on top of the global `authorization` (both must allow)."""

    path: str
    backends: tuple[str, ...] | None = None
    names: _Globs | None = None
    authorization: AuthorizationSettings = AuthorizationSettings()

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must start with '/'")
        return v.rstrip("/") or "/"


class PinSettings(_Frozen):
    # Where pins are kept without Redis (with cache.store: redis they are in Redis).
    file: str = "mcp-gateway-pins.json"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True,
        # Inputs may hold secrets (a Redis URL's password, an HMAC key): errors never echo them.
        hide_input_in_errors=True,
    )

    server: ServerSettings = ServerSettings()
    backends: tuple[BackendSettings, ...] = ()
    cache: CacheSettings = CacheSettings()
    auth: AuthSettings = AuthSettings()
    security: SecuritySettings = SecuritySettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    subscriptions: SubscriptionSettings = SubscriptionSettings()
    authorization: AuthorizationSettings = AuthorizationSettings()
    rate_limits: tuple[RateLimit, ...] = ()
    pins: PinSettings = PinSettings()
    views: tuple[ViewSettings, ...] = ()
    # The Redis every section shares unless it names its own (docs/scale.md).
    redis: RedisSettings = RedisSettings()
    # Start the bundled demo backend in-process and route to it (the embedded defaults).
    demo: bool = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment overrides it, key by key.
        # Per-backend keys (MCP_GATEWAY_BACKENDS__0__...) are applied to the file's list by
        # load_settings (config_env), not read as a section of their own here.
        return (_EnvWithoutBackendKeys(settings_cls), init_settings)

    @model_validator(mode="before")
    @classmethod
    def _explicit_backends(cls, data: Any) -> Any:
        # Only an absent section means "the demo backend": an explicit empty list is a
        # mistake (a templated list that rendered empty), not a request for demo tools.
        if isinstance(data, dict) and "backends" in data and data["backends"] in ([], ()):
            raise FieldError("backends", "is empty: declare at least one backend, or remove the section "
                                         "(or set demo: true) to serve the bundled demo backend")
        return data

    @model_validator(mode="after")
    def _fleet(self) -> GatewaySettings:
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            at = next(i for i, n in enumerate(names) if n in dupes and names.index(n) != i)
            raise FieldError(f"backends.{at}.name", f"backend names must be unique; repeated: {', '.join(dupes)}")
        for i, backend in enumerate(self.backends):
            if backend.identity_header and self.security.secret is None:
                raise FieldError(f"backends.{i}.identity_header", "is signed with security.secret, which is not set")
            if isinstance(backend.auth, TokenExchangeAuth) and self.auth.mode != "jwt":
                raise FieldError(f"backends.{i}.auth.type", "token_exchange exchanges the caller's validated access "
                                                            "token: it needs auth.mode: jwt")
        for i, rule in enumerate(self.cache.rules):
            if rule.backend is not None and rule.backend not in names:
                raise FieldError(f"cache.rules.{i}.backend", f"no backend is named {rule.backend!r}")
        prefixes = [self.prefix_of(b) for b in self.backends]
        for i, p in enumerate(prefixes):
            for j, q in enumerate(prefixes):
                if i < j and (p.startswith(q) or q.startswith(p)) and len(self.backends) > 1:
                    raise FieldError(f"backends.{j}.prefix", 
                        f"backends {self.backends[i].name!r} and {self.backends[j].name!r} have overlapping name "
                        f"prefixes {p!r} and {q!r}: a tool name could not be routed unambiguously"
                    )
        # Kept beside the policies, so every rule about rules lives with the code that runs them.
        from gateway.policies.authorization import check_authorization
        from gateway.policies.ratelimit import check_rate_limits
        from gateway.routing.views import check_views

        check_authorization(self)
        check_rate_limits(self)
        check_views(self)
        return self

    def cache_redis(self) -> RedisSettings:
        """The cache's Redis: its own, else the shared block."""
        return section_redis(self.cache.redis, self.cache.redis_url) or self.redis

    def bus_redis(self) -> RedisSettings | None:
        """The listen bus's Redis, or None: each replica alone (docs/subscriptions.md)."""
        own = section_redis(self.subscriptions.redis, self.subscriptions.redis_url)
        if own is not None:
            return own
        if self.cache.store == "redis":
            return self.cache_redis()
        return self.redis if "redis" in self.model_fields_set else None

    def prefix_of(self, backend: BackendSettings) -> str:
        if backend.prefix is not None:
            return backend.prefix
        return "" if len(self.backends) == 1 else f"{backend.name}__"


class _EnvWithoutBackendKeys(EnvSettingsSource):
    def _load_env_vars(self) -> Any:
        loaded = super()._load_env_vars()
        skip = {name.lower() for name in config_env.backend_overrides(os.environ)}
        return {k: v for k, v in loaded.items() if k.lower() not in skip}


class ConfigError(Exception):
    """Configuration that does not validate; `problems` are (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(f"{loc}: {msg}" for loc, msg in problems))


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> GatewaySettings:
    """Read the YAML file (if any) and the environment into validated, frozen settings."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError([("<file>", f"cannot read {path}: {exc.strerror or exc}")]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([("<file>", f"{path} is not valid YAML: {exc}")]) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError([("<file>", f"{path} must hold a mapping at the top level")])
        data = loaded
    data.update(overrides)
    environ = os.environ
    problems = config_env.check(environ, GatewaySettings) or config_env.apply_backend_overrides(
        data, environ, BackendSettings)
    if problems:
        raise ConfigError(problems)
    try:
        return GatewaySettings(**data)
    except ValidationError as exc:
        raise ConfigError([_located(err) for err in exc.errors()]) from None
    except SettingsError as exc:
        # An environment variable that names a whole section (MCP_GATEWAY_CACHE=...) must
        # hold JSON; say which one instead of a traceback.
        raise ConfigError([("<environment>", f"{exc} (variables named {ENV_PREFIX}<SECTION> must hold a "
                                              f"JSON object; set single keys as {ENV_PREFIX}<SECTION>__<KEY>)")]
                          ) from None


def _located(err: Any) -> tuple[str, str]:
    """(field path, message) of one validation error; a FieldError names its own field below
    the model that raised it."""
    loc = [str(p) for p in err["loc"]]
    # A discriminated union (backends[].auth) puts the chosen `type` in the path: not a key
    # the operator wrote.
    loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "auth" and p in _AUTH_TYPES)]
    msg = err["msg"]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        loc += cause.field.split(".")
        msg = str(cause)
    return ".".join(loc) or "<root>", msg
