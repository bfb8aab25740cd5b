"""Who the gateway is toward one backend: the headers it adds to every upstream request.

Built once per backend from `backends[].headers` and `backends[].auth` (docs/auth.md
"Credentials for backends"):

- `headers` / `auth: {type: headers}`: static, folded into the backend's base headers once
  (`BackendCredentials.static`), so they cost nothing per request;
- `oauth_client_credentials`: one token for the gateway itself (RFC 6749 §4.4), cached until
  shortly before `expires_in`, refreshed in the background once `refresh_before_seconds`
  remain, one fetch shared by every caller that needs it (`TokenSource`);
- `token_exchange` (RFC 8693): the caller's validated access token exchanged for a token for
  this backend, one `TokenSource` per principal, kept in this process only (never in Redis),
  bounded LRU, keyed by `Principal.key` (never by the token).

The token endpoint is asked with httpx: off the hot path (once per token lifetime), where
its convenience (form bodies, Basic auth, TLS) is worth more than its cost. The hot path is
`authorization(call)`: a dict lookup and a clock read when the token is cached.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import AccessToken, Principal
from gateway.settings import (ActorCredentials, BackendSettings, ClientCredentialsAuth, HeadersAuth,
                              TokenExchangeAuth)

log = logging.getLogger("gateway.backends.credentials")

GRANT_CLIENT_CREDENTIALS = "client_credentials"
GRANT_TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
TOKEN_TYPE_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
# A token is not used in its last seconds: a request signed with it could arrive expired.
EXPIRY_SAFETY_SECONDS = 5.0
# The AS's own words are relayed, bounded (error_description is free text of the AS).
_REASON_CHARS = 300


def _owner_label(principal_key: str) -> str:
    """A legacy session's owner for a principal: a digest, so that pool keys and their logs
    never name the user."""
    return "p:" + hashlib.sha256(principal_key.encode()).hexdigest()[:24]


def static_headers(settings: BackendSettings) -> dict[str, str]:
    """The static headers of a backend (`headers` and `auth: {type: headers}`), revealed: for
    the request builders only."""
    found = {name: value.get_secret_value() for name, value in settings.headers.items()}
    if isinstance(settings.auth, HeadersAuth):
        found.update((name, value.get_secret_value()) for name, value in settings.auth.headers.items())
    return found


class TokenRefused(Exception):
    """The token endpoint answered with an OAuth error (RFC 6749 §5.2)."""

    def __init__(self, status: int, error: str, description: str | None) -> None:
        super().__init__(f"{error}" + (f": {description}" if description else ""))
        self.status = status
        self.error = error
        self.description = description


class TokenEndpointDown(Exception):
    """No usable answer from the token endpoint (unreachable, timeout, 5xx, not a token)."""


class TokenEndpoint:
    """Form POSTs to one token endpoint, authenticated as one client (or none)."""

    def __init__(self, url: str, *, client_id: str | None, client_secret: str | None, client_auth: str,
                 timeout: float, ca_file: str | None = None) -> None:
        self.url = url
        self._verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._client_id = client_id
        self._client_secret = client_secret
        self._client_auth = client_auth
        self._timeout = timeout
        # Made on first use: a backend built and dropped (check-config's preflight) opens nothing.
        self._http: httpx.AsyncClient | None = None

    async def token(self, form: dict[str, str]) -> tuple[str, float | None]:
        """(access_token, expires_in) for this grant request."""
        form = {k: v for k, v in form.items() if v is not None}
        headers = {"accept": "application/json"}
        if self._client_id is not None:
            if self._client_auth == "basic":
                # RFC 6749 §2.3.1: both parts form-urlencoded before Basic.
                pair = f"{quote(self._client_id, safe='')}:{quote(self._client_secret or '', safe='')}"
                headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
            else:
                form["client_id"] = self._client_id
                form["client_secret"] = self._client_secret or ""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False, verify=self._verify)
        try:
            response = await self._http.post(self.url, data=form, headers=headers)
        except httpx.TimeoutException:
            raise TokenEndpointDown(f"no answer from {self.url} in time") from None
        except httpx.HTTPError as exc:
            raise TokenEndpointDown(f"cannot reach {self.url}: {type(exc).__name__}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 500 or (response.status_code >= 400 and not isinstance(body, dict)):
            raise TokenEndpointDown(f"{self.url} answered HTTP {response.status_code}")
        if response.status_code >= 400:
            error = body.get("error")
            description = body.get("error_description")
            raise TokenRefused(response.status_code, str(error)[:64] if error else f"HTTP {response.status_code}",
                               str(description)[:_REASON_CHARS] if description else None)
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise TokenEndpointDown(f"{self.url} answered without an access_token")
        expires_in = body.get("expires_in")
        if isinstance(expires_in, str) and expires_in.isdigit():
            expires_in = int(expires_in)
        return token, float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()


class TokenSource:
    """One token, kept fresh: `current()` while it is good, `fetch()` (single flight) when it
    is not, a background refresh once `refresh_before` seconds of it remain."""

    def __init__(self, fetch: Callable[[], Any], *, refresh_before: float, default_lifetime: float,
                 clock: Callable[[], float], not_after: float | None = None) -> None:
        self._fetch = fetch
        self._refresh_before = refresh_before
        self._default_lifetime = default_lifetime
        self._clock = clock
        # A wall-clock bound no token of this source may outlive (the subject token's exp).
        self.not_after = not_after
        self.header: str | None = None
        self._usable_until = 0.0
        self._refresh_at = 0.0
        self._inflight: asyncio.Future[str] | None = None
        self.fetches = 0

    def current(self) -> str | None:
        """The Authorization value if the token is good now; starts a background refresh
        when it is due."""
        now = self._clock()
        if now >= self._usable_until:
            return None
        if now >= self._refresh_at and self._inflight is None:
            self._start()
        return self.header

    async def get(self) -> str:
        found = self.current()
        if found is not None:
            return found
        return await asyncio.shield(self._inflight or self._start())

    def invalidate(self, header: str) -> None:
        """The backend refused `header` (401): never hand it out again."""
        if self.header == header:
            self.header, self._usable_until = None, 0.0

    def _start(self) -> asyncio.Future[str]:
        self._inflight = future = asyncio.ensure_future(self._refresh())
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: asyncio.Future[str]) -> None:
        if self._inflight is future:
            self._inflight = None
        if not future.cancelled():
            future.exception()  # retrieved: a failed background refresh is logged, not leaked

    async def _refresh(self) -> str:
        started = self._clock()
        self.fetches += 1
        try:
            token, expires_in = await self._fetch()
        except Exception as exc:
            if self.header is not None and self._clock() < self._usable_until:
                log.warning("token refresh failed (%s); the current token serves until it expires", exc)
            raise
        lifetime = expires_in if expires_in is not None else self._default_lifetime
        if self.not_after is not None:
            lifetime = min(lifetime, self.not_after - time.time())
        self.header = f"Bearer {token}"
        self._usable_until = started + lifetime - min(EXPIRY_SAFETY_SECONDS, lifetime / 10)
        self._refresh_at = started + max(lifetime - self._refresh_before, lifetime / 2)
        return self.header


def _refused(backend: str, what: str, exc: TokenRefused, request_id: Any, *, caller: bool) -> rpc.McpError:
    """A refused grant. The caller's token refused (an exchange: invalid_grant, invalid_target,
    invalid_scope, access_denied) is the caller's problem: 403, or 401 when the AS says the
    token is not valid, with the AS's reason. The gateway's own client refused is ours: 502."""
    reason = str(exc)
    data = {"backend": backend, "error": exc.error, "error_description": exc.description}
    if caller and exc.error != "invalid_client":
        status = 401 if exc.error == "invalid_token" else 403
        return rpc.McpError(rpc.INVALID_REQUEST, f"Backend {backend!r}: the authorization server refused {what}: "
                            f"{reason}", status=status, data=data, request_id=request_id)
    return rpc.McpError(rpc.BACKEND_UNAVAILABLE, f"Backend {backend!r} is unavailable: the authorization server "
                        f"refused {what}: {reason}", status=502, data=data, request_id=request_id)


def _down(backend: str, exc: TokenEndpointDown, request_id: Any) -> rpc.McpError:
    return rpc.McpError(rpc.BACKEND_UNAVAILABLE,
                        f"Backend {backend!r} is unavailable: no token from the authorization server ({exc})",
                        status=502, data={"backend": backend, "dependency": "token_url"}, request_id=request_id)


class BackendCredentials:
    """The credentials of one backend: `static` headers, and `authorization(call)` for the
    token kinds (None: the backend gets no Authorization of the gateway's)."""

    dynamic = False
    # Whether each principal gets its own upstream credential (legacy sessions are keyed by it).
    per_principal = False

    def __init__(self, settings: BackendSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = settings.name
        self.static = static_headers(settings)
        self.clock = clock

    def cached(self, principal: Principal) -> str | None:
        return None

    async def authorization(self, principal: Principal, request_id: Any = None) -> str | None:
        return None

    def refused(self, principal: Principal, header: str) -> None:
        """The backend answered 401 to `header`: the next `authorization` fetches afresh."""

    def owner(self, principal: Principal) -> str:
        """Whose credential a legacy session for this principal carries: "" (the gateway's
        own) unless each principal has its own (token exchange)."""
        return ""

    def session_authorization(self, owner: str) -> str | None:
        """The current Authorization value of `owner`'s sessions (fetched beforehand by
        `authorization`)."""
        return None

    def session_headers(self, owner: str) -> SessionHeaders:
        return SessionHeaders(self, owner)

    async def aclose(self) -> None:
        pass


class SessionHeaders(Mapping[str, str]):
    """The credential headers of one legacy session, read at each request: the static ones
    and its owner's current token (which a refresh replaces under a live session)."""

    __slots__ = ("_credentials", "_owner")

    def __init__(self, credentials: BackendCredentials, owner: str) -> None:
        self._credentials = credentials
        self._owner = owner

    def _authorization(self) -> str | None:
        return self._credentials.session_authorization(self._owner) if self._credentials.dynamic else None

    def __getitem__(self, name: str) -> str:
        if name == "authorization":
            found = self._authorization()
            if found is not None:
                return found
        return self._credentials.static[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._credentials.static
        if self._authorization() is not None and "authorization" not in self._credentials.static:
            yield "authorization"

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<SessionHeaders {sorted(self)}>"  # names only


class ClientCredentials(BackendCredentials):
    dynamic = True

    def __init__(self, settings: BackendSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, clock=clock)
        auth = settings.auth
        assert isinstance(auth, ClientCredentialsAuth)
        self._endpoint = TokenEndpoint(auth.token_url, client_id=auth.client_id,
                                       client_secret=auth.client_secret.get_secret_value(),
                                       client_auth=auth.client_auth, timeout=auth.timeout_seconds,
                                       ca_file=auth.ca_file)
        form = {"grant_type": GRANT_CLIENT_CREDENTIALS, "scope": auth.scope, "audience": auth.audience,
                "resource": auth.resource}
        self.source = TokenSource(lambda: self._endpoint.token(dict(form)), refresh_before=auth.refresh_before_seconds,
                                  default_lifetime=auth.default_lifetime_seconds, clock=clock)

    def cached(self, principal: Principal) -> str | None:
        return self.source.current()

    async def authorization(self, principal: Principal, request_id: Any = None) -> str | None:
        try:
            return await self.source.get()
        except TokenRefused as exc:
            raise _refused(self.backend, "the gateway's client credentials", exc, request_id, caller=False) from None
        except TokenEndpointDown as exc:
            raise _down(self.backend, exc, request_id) from None

    def refused(self, principal: Principal, header: str) -> None:
        self.source.invalidate(header)

    def session_authorization(self, owner: str) -> str | None:
        return self.source.header

    async def aclose(self) -> None:
        await self._endpoint.aclose()


class TokenExchange(BackendCredentials):
    dynamic = True
    per_principal = True

    def __init__(self, settings: BackendSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings, clock=clock)
        auth = settings.auth
        assert isinstance(auth, TokenExchangeAuth)
        self._auth = auth
        self._endpoint = TokenEndpoint(
            auth.token_url, client_id=auth.client_id,
            client_secret=auth.client_secret.get_secret_value() if auth.client_secret is not None else None,
            client_auth=auth.client_auth, timeout=auth.timeout_seconds, ca_file=auth.ca_file)
        self._actor_endpoint: TokenEndpoint | None = None
        if auth.actor is not None:
            self._actor_source = self._actor_token_source(auth.actor, auth)
        else:
            self._actor_source = None
        # Principal.key -> its TokenSource; least recently used first.
        self._sources: collections.OrderedDict[str, TokenSource] = collections.OrderedDict()
        # owner label (legacy sessions) -> the same TokenSource.
        self._by_owner: dict[str, TokenSource] = {}
        # Principal.key -> the latest validated token it presented (the next subject_token).
        self._subjects: dict[str, AccessToken] = {}

    def _actor_token_source(self, actor: ActorCredentials, auth: TokenExchangeAuth) -> TokenSource:
        self._actor_endpoint = endpoint = TokenEndpoint(
            actor.token_url or auth.token_url, client_id=actor.client_id,
            client_secret=actor.client_secret.get_secret_value(), client_auth=auth.client_auth,
            timeout=auth.timeout_seconds, ca_file=auth.ca_file)
        form = {"grant_type": GRANT_CLIENT_CREDENTIALS, "scope": actor.scope, "audience": actor.audience,
                "resource": actor.resource}
        return TokenSource(lambda: endpoint.token(dict(form)), refresh_before=auth.refresh_before_seconds,
                           default_lifetime=auth.default_lifetime_seconds, clock=self.clock)

    def _source(self, principal: Principal) -> TokenSource | None:
        source = self._sources.get(principal.key)
        if source is not None:
            self._sources.move_to_end(principal.key)
        return source

    def cached(self, principal: Principal) -> str | None:
        source = self._sources.get(principal.key)
        if source is None:
            return None
        self._sources.move_to_end(principal.key)
        return source.current()

    async def authorization(self, principal: Principal, request_id: Any = None) -> str | None:
        token = principal.access_token
        if not principal.authenticated:
            # The gateway's own requests (discovery, index refreshes, hub listens) act for no
            # user: they carry the actor's token when there is one, else no Authorization.
            # Clients are always authenticated here (settings require auth.mode: jwt).
            return await self._actor_authorization(request_id) if self._actor_source is not None else None
        if token is None:
            raise rpc.McpError(
                rpc.INVALID_REQUEST, f"Backend {self.backend!r} needs the caller's access token for token exchange",
                status=401, data={"backend": self.backend}, request_id=request_id)
        source = self._source(principal)
        if source is None:
            subject = self._subjects[principal.key] = token
            source = TokenSource(lambda: self._exchange(self._subjects[principal.key]),
                                 refresh_before=self._auth.refresh_before_seconds,
                                 default_lifetime=self._auth.default_lifetime_seconds, clock=self.clock,
                                 not_after=subject.expires_at)
            self._sources[principal.key] = source
            self._by_owner[self.owner(principal)] = source
            while len(self._sources) > self._auth.max_cached_tokens:
                key, _ = self._sources.popitem(last=False)
                self._by_owner.pop(_owner_label(key), None)
                self._subjects.pop(key, None)
        elif self._subjects.get(principal.key) is not token:
            # The same principal with a newer token: the next exchange (when the cached one is
            # due) uses it, and is bounded by its expiry.
            self._subjects[principal.key] = token
            source.not_after = token.expires_at
        try:
            return await source.get()
        except TokenRefused as exc:
            self._forget(principal)
            raise _refused(self.backend, "the token exchange", exc, request_id, caller=True) from None
        except TokenEndpointDown as exc:
            self._forget(principal)
            raise _down(self.backend, exc, request_id) from None

    def _forget(self, principal: Principal) -> None:
        self._sources.pop(principal.key, None)
        self._by_owner.pop(self.owner(principal), None)
        self._subjects.pop(principal.key, None)

    def owner(self, principal: Principal) -> str:
        return _owner_label(principal.key) if principal.authenticated else ""

    def session_authorization(self, owner: str) -> str | None:
        if not owner:
            return self._actor_source.header if self._actor_source is not None else None
        source = self._by_owner.get(owner)
        return source.header if source is not None else None

    async def _actor_authorization(self, request_id: Any) -> str:
        assert self._actor_source is not None
        try:
            return await self._actor_source.get()
        except TokenRefused as exc:
            raise _refused(self.backend, "the gateway's actor credentials", exc, request_id, caller=False) from None
        except TokenEndpointDown as exc:
            raise _down(self.backend, exc, request_id) from None

    async def _exchange(self, subject: AccessToken) -> tuple[str, float | None]:
        auth = self._auth
        form = {"grant_type": GRANT_TOKEN_EXCHANGE, "subject_token": subject.reveal(),
                "subject_token_type": TOKEN_TYPE_ACCESS, "requested_token_type": auth.requested_token_type,
                "audience": auth.audience, "resource": auth.resource, "scope": auth.scope}
        if self._actor_source is not None:
            try:
                actor = await self._actor_source.get()
            except TokenRefused as exc:
                raise TokenEndpointDown(f"the gateway's actor credentials were refused ({exc})") from None
            form["actor_token"] = actor.removeprefix("Bearer ")
            form["actor_token_type"] = TOKEN_TYPE_ACCESS
        return await self._endpoint.token(form)

    def refused(self, principal: Principal, header: str) -> None:
        if not principal.authenticated and self._actor_source is not None:
            self._actor_source.invalidate(header)
        source = self._sources.get(principal.key)
        if source is not None:
            source.invalidate(header)

    async def aclose(self) -> None:
        await self._endpoint.aclose()
        if self._actor_endpoint is not None:
            await self._actor_endpoint.aclose()
        self._sources.clear()
        self._by_owner.clear()
        self._subjects.clear()


def credentials_for(settings: BackendSettings, *, clock: Callable[[], float] = time.monotonic) -> BackendCredentials:
    auth = settings.auth
    if isinstance(auth, ClientCredentialsAuth):
        return ClientCredentials(settings, clock=clock)
    if isinstance(auth, TokenExchangeAuth):
        return TokenExchange(settings, clock=clock)
    return BackendCredentials(settings, clock=clock)
