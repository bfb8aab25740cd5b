"""Where the keys that verify access tokens come from: a fixed key (PEM public key or HMAC
secret), or an authorization server's JWKS fetched over HTTP.

`JwksKeys` never blocks the event loop (httpx, async; pyjwt's PyJWKClient uses blocking
urllib) and is built to survive its IdP:

- keys are cached by `kid` for `cache_seconds`;
- a token naming a `kid` the cache lacks (key rotation) triggers a refetch, but at most one
  per `min_refresh_seconds`, so a flood of tokens with random kids cannot hammer the IdP;
- concurrent refetches are coalesced into one request, and every request that needs the
  refetch waits for the one in flight rather than failing beside it;
- when a refetch fails (IdP down, garbage answer, too slow) the last good set keeps serving,
  however old: refusing every caller because the IdP blinked would turn its outage into ours;
- a fetch has one deadline, `timeout_seconds`, for the whole exchange (httpx's own timeout
  bounds each read, not their sum), so a JWKS server that trickles its answer cannot hold a
  request longer than that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.policies.jwt_config import MIN_RSA_BITS

log = logging.getLogger("gateway.auth.jwks")

# A JWKS document is a few KiB; anything far larger is not one.
MAX_JWKS_BYTES = 512 * 1024


class KeyUnavailable(Exception):
    """No key can verify this token: unknown kid (after a refresh), or a key that does not fit
    its algorithm. The token is invalid → 401."""


class KeySetUnreachable(Exception):
    """The key set could not be obtained at all (never fetched, IdP down): the gateway cannot
    judge the token → 503, not 401 (a client must not be sent to re-authorize for our outage)."""


class KeySource(Protocol):
    async def key_for(self, kid: str | None, alg: str) -> Any: ...


class StaticKey:
    """One configured key: a parsed public key, or the HMAC secret bytes."""

    def __init__(self, key: Any) -> None:
        self.key = key

    async def key_for(self, kid: str | None, alg: str) -> Any:
        return self.key


class JwksKeys:
    def __init__(
        self,
        url: str,
        *,
        cache_seconds: float = 300.0,
        min_refresh_seconds: float = 30.0,
        timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.cache_seconds = cache_seconds
        self.min_refresh_seconds = min_refresh_seconds
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        self._jwks: dict[str, dict[str, Any]] = {}  # kid ("" when absent) -> JWK
        self._parsed: dict[tuple[str, str], Any] = {}  # (kid, alg) -> verification key
        self._fetched_at: float | None = None  # last successful fetch
        self._attempted_at: float | None = None  # last attempt, successful or not
        self._fetching: asyncio.Future[None] | None = None  # the fetch in flight
        self.fetches = 0  # attempts made, for metrics and tests

    async def key_for(self, kid: str | None, alg: str) -> Any:
        now = self.clock()
        stale = self._fetched_at is None or now - self._fetched_at >= self.cache_seconds
        if stale or (kid or "") not in self._jwks:
            await self._refresh(now)
        if self._fetched_at is None:
            raise KeySetUnreachable(f"the key set at {self.url} has not been fetched yet and cannot be reached now")
        return self._key(kid, alg)

    async def _refresh(self, asked_at: float) -> None:
        fetching = self._fetching
        if fetching is None:
            if self._attempted_at is not None and asked_at - self._attempted_at < self.min_refresh_seconds:
                return  # rate limit: at most one fetch per min_refresh_seconds, whatever the kids
            self._attempted_at = self.clock()
            self.fetches += 1
            fetching = self._fetching = asyncio.ensure_future(self._update())
            fetching.add_done_callback(self._fetch_ended)
        # Every caller that needs a refresh waits for the fetch in flight, whoever started it:
        # returning at once (as the rate limit does between fetches) would answer a burst at a
        # cold start with 503 and the requests racing a key rotation with 401, while the
        # answer they need is on its way. Bounded by the fetch's deadline; shielded, so a
        # caller that goes away does not cancel the fetch the others are waiting for.
        await asyncio.shield(fetching)

    def _fetch_ended(self, fetching: asyncio.Future[None]) -> None:
        self._fetching = None

    async def _update(self) -> None:
        try:
            # One deadline for the whole fetch: httpx's timeout applies to each connect and
            # each read, so an answer trickled a byte at a time would never trip it.
            async with asyncio.timeout(self.timeout_seconds):
                keys = await self._fetch()
        except Exception as exc:  # noqa: BLE001 - any failure means "keep the old set"
            held = f"keeping the {len(self._jwks)} cached key(s)" if self._fetched_at is not None else "no keys cached"
            reason = "no complete answer within the deadline" if isinstance(exc, TimeoutError) else exc
            log.warning("JWKS fetch from %s failed (%s); %s", self.url, reason, held)
            return
        if keys != self._jwks:
            self._jwks, self._parsed = keys, {}
        self._fetched_at = self._attempted_at

    async def _fetch(self) -> dict[str, dict[str, Any]]:
        # One short-lived client per fetch: fetches are rare (once per cache period, or a
        # rotation), and the policy then owns no connection to close at shutdown.
        async with (
            httpx.AsyncClient(timeout=self.timeout_seconds, follow_redirects=False) as client,
            client.stream("GET", self.url, headers={"accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"answer larger than {MAX_JWKS_BYTES} bytes")
        document = orjson.loads(body)
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise ValueError("not a JWK Set (no 'keys' list)")  # noqa: TRY004 - one "bad answer" type
        keys: dict[str, dict[str, Any]] = {}
        for jwk in document["keys"]:
            # Signature keys only (RFC 7517 §4.2 `use`, §4.3 `key_ops`: a key whose operations
            # do not include "verify" is not for checking signatures), and never a symmetric
            # one: a key published in a JWKS is public, so an 'oct' key there would let anyone
            # mint tokens.
            if not isinstance(jwk, dict) or jwk.get("kty") in (None, "oct") or jwk.get("use", "sig") != "sig":
                continue
            if "key_ops" in jwk and not (isinstance(jwk["key_ops"], list) and "verify" in jwk["key_ops"]):
                continue
            keys[str(jwk.get("kid", ""))] = jwk
        if not keys:
            raise ValueError("the JWK Set holds no usable signature key")
        return keys

    def _key(self, kid: str | None, alg: str) -> Any:
        if kid is None:
            # RFC 7515 allows a token without kid; it is unambiguous only with a single key.
            if len(self._jwks) != 1:
                raise KeyUnavailable(f"the token names no key (kid) and the key set holds {len(self._jwks)}")
            kid = next(iter(self._jwks))
        jwk = self._jwks.get(kid)
        if jwk is None:
            raise KeyUnavailable(f"no key with kid {kid!r} in the key set")
        cached = self._parsed.get((kid, alg))
        if cached is not None:
            return cached
        if jwk.get("alg") not in (None, alg):
            raise KeyUnavailable(f"key {kid!r} is for {jwk['alg']}, the token says {alg}")
        try:
            # PyJWK checks that the key type fits the algorithm (an EC key cannot verify RS256).
            key = jwt.PyJWK(jwk, algorithm=alg).key
        except jwt.PyJWTError as exc:
            raise KeyUnavailable(f"key {kid!r} cannot verify {alg}: {exc}") from None
        if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
            # RFC 7518 §3.3/§3.5 MUST; pyjwt only warns unless told otherwise (and only from 2.13).
            raise KeyUnavailable(f"key {kid!r} is a {key.key_size}-bit RSA key; at least {MIN_RSA_BITS} bits "
                                 "are required (RFC 7518 §3.3)")
        self._parsed[(kid, alg)] = key
        return key
