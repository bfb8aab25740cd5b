"""JwksKeys against a real JWKS endpoint on 127.0.0.1: caching by kid, refresh on rotation,
the refresh rate limit, coalescing, serving cached keys while the IdP is down, and which keys
of a set may verify which tokens. Time is a test-controlled clock, so nothing here sleeps;
only the fetch deadline is measured, against a server that really trickles its answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.policies.jwt_keys import JwksKeys, KeySetUnreachable, KeyUnavailable
from tests.support.clock import ManualClock
from tests.support.oauth import Issuer, JwksEndpoint, ServedApp, SigningKey, ec_key, rsa_key, serve


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    return {"a": rsa_key("a"), "b": rsa_key("b"), "e": ec_key("e")}


def source(url: str, clock: ManualClock, **kw: Any) -> JwksKeys:
    return JwksKeys(url, cache_seconds=kw.pop("cache_seconds", 300), min_refresh_seconds=kw.pop("min_refresh", 30),
                    clock=clock, **kw)


async def test_keys_are_cached_by_kid(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"], keys["e"]]))
    clock = ManualClock(1000.0)
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", clock)
        rsa_public = await jwks.key_for("a", "RS256")
        assert rsa_public.public_numbers() == keys["a"].private.public_key().public_numbers()
        assert (await jwks.key_for("e", "ES256")).public_numbers() == keys["e"].private.public_key().public_numbers()
        clock.now += 299
        await jwks.key_for("a", "RS256")
    assert endpoint.fetches == 1


async def test_cache_expiry_refetches(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"]]))
    clock = ManualClock(1000.0)
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", clock)
        await jwks.key_for("a", "RS256")
        clock.now += 301
        await jwks.key_for("a", "RS256")
    assert endpoint.fetches == 2


async def test_rotation_unknown_kid_refetches_once_allowed(keys):
    issuer = Issuer(keys=[keys["a"]])
    endpoint = JwksEndpoint(issuer)
    clock = ManualClock(1000.0)
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", clock)
        await jwks.key_for("a", "RS256")
        issuer.keys.append(keys["b"])  # the IdP rotates in a new key
        clock.now += 31
        assert await jwks.key_for("b", "RS256")
        assert endpoint.fetches == 2
        assert await jwks.key_for("a", "RS256")  # the old key still works from the new set
    assert endpoint.fetches == 2


async def test_a_flood_of_unknown_kids_costs_one_fetch_per_interval(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"]]))
    clock = ManualClock(1000.0)
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", clock, min_refresh=30)
        await jwks.key_for("a", "RS256")
        for i in range(50):
            clock.now += 0.5  # 25 s of attack, all within 30 s of the first fetch
            with pytest.raises(KeyUnavailable, match=f"kid 'random-{i}'"):
                await jwks.key_for(f"random-{i}", "RS256")
        assert endpoint.fetches == 1
        clock.now += 5  # 30 s after the first fetch: one more is allowed, then none for 30 s
        for i in range(50):
            with pytest.raises(KeyUnavailable):
                await jwks.key_for(f"again-{i}", "RS256")
            clock.now += 0.5
    assert endpoint.fetches == 2


async def test_concurrent_cold_lookups_share_one_fetch(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"]]))
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", ManualClock(1000.0), min_refresh=0)
        found = await asyncio.gather(*(jwks.key_for("a", "RS256") for _ in range(20)))
    assert len(found) == 20 and endpoint.fetches == 1


async def test_lookups_arriving_during_a_fetch_wait_for_it(keys):
    """A request that arrives while a fetch is in flight gets that fetch's answer: at a cold
    start (else 503, 'never fetched') and during a rotation (else 401, 'no key b'), and the IdP
    still sees one request per refresh."""
    issuer = Issuer(keys=[keys["a"]])
    endpoint = JwksEndpoint(issuer, delay_seconds=0.3)
    clock = ManualClock(1000.0)

    async def lookups_racing_one_fetch(kid: str, fetches_before: int) -> list[Any]:
        first = asyncio.create_task(jwks.key_for(kid, "RS256"))
        while endpoint.fetches == fetches_before:  # the fetch has reached the IdP
            await asyncio.sleep(0.01)
        later = [asyncio.create_task(jwks.key_for(kid, "RS256")) for _ in range(5)]
        return await asyncio.gather(first, *later)

    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", clock)
        assert all(await lookups_racing_one_fetch("a", 0))
        assert endpoint.fetches == 1
        issuer.keys.append(keys["b"])
        clock.now += 31
        assert all(await lookups_racing_one_fetch("b", 1))
        assert endpoint.fetches == 2


async def test_a_caller_that_goes_away_does_not_cancel_the_fetch(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"]]), delay_seconds=0.3)
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", ManualClock(1000.0))
        impatient = asyncio.create_task(jwks.key_for("a", "RS256"))
        while endpoint.fetches == 0:
            await asyncio.sleep(0.01)
        patient = asyncio.create_task(jwks.key_for("a", "RS256"))
        await asyncio.sleep(0)
        impatient.cancel()
        assert await patient
    assert endpoint.fetches == 1


async def test_idp_down_keeps_serving_the_cached_set(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"]]))
    clock = ManualClock(1000.0)
    idp = await _started(endpoint)
    jwks = source(f"{idp.base}/jwks", clock)
    await jwks.key_for("a", "RS256")
    await idp.stop()
    clock.now += 10_000  # far past the cache period: a refetch is due, and fails
    assert await jwks.key_for("a", "RS256")
    assert jwks.fetches == 2  # it did try
    clock.now += 1
    assert await jwks.key_for("a", "RS256")
    assert jwks.fetches == 2  # and the failed attempt is rate-limited like any other


async def test_never_fetched_and_unreachable_is_unreachable_not_invalid(keys):
    idp = await _started(JwksEndpoint(Issuer(keys=[keys["a"]])))
    url = f"{idp.base}/jwks"
    await idp.stop()
    with pytest.raises(KeySetUnreachable, match="has not been fetched"):
        await source(url, ManualClock(1000.0)).key_for("a", "RS256")


async def test_bad_answers_keep_the_old_set(keys):
    issuer = Issuer(keys=[keys["a"]])
    answers: list[tuple[int, bytes]] = []

    async def flaky(scope: dict[str, Any], receive: Any, send: Any) -> None:
        status, body = answers.pop(0) if answers else (200, orjson.dumps(issuer.jwks()))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    clock = ManualClock(1000.0)
    async with serve(flaky) as idp:
        jwks = source(f"{idp.base}/jwks", clock, min_refresh=0)
        await jwks.key_for("a", "RS256")
        for status, body in [(500, b"oops"), (200, b"not json"), (200, b'{"keys": "nope"}'),
                             (200, b'{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "a"}]}')]:
            answers.append((status, body))
            clock.now += 301
            assert await jwks.key_for("a", "RS256"), (status, body)
        assert jwks.fetches == 5


async def test_symmetric_and_encryption_keys_in_a_jwks_are_ignored(keys):
    issuer = Issuer(keys=[keys["a"]])

    async def mixed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        document = {"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
                             {**keys["b"].public_jwk(), "use": "enc"}, *issuer.jwks()["keys"]]}
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": orjson.dumps(document)})

    async with serve(mixed) as idp:
        jwks = source(f"{idp.base}/jwks", ManualClock(1000.0))
        assert await jwks.key_for("a", "RS256")
        for kid, alg in (("hmac", "HS256"), ("b", "RS256")):
            with pytest.raises(KeyUnavailable, match=f"kid {kid!r}"):
                await jwks.key_for(kid, alg)


async def test_algorithm_must_fit_the_key(keys):
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"], keys["e"]]))
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", ManualClock(1000.0))
        with pytest.raises(KeyUnavailable, match="is for RS256"):
            await jwks.key_for("a", "ES256")


async def test_kidless_token_only_with_a_single_key(keys):
    async with serve(JwksEndpoint(Issuer(keys=[keys["a"]]))) as one, \
            serve(JwksEndpoint(Issuer(keys=[keys["a"], keys["b"]]))) as two:
        assert await source(f"{one.base}/jwks", ManualClock(1000.0)).key_for(None, "RS256")
        with pytest.raises(KeyUnavailable, match="names no key"):
            await source(f"{two.base}/jwks", ManualClock(1000.0)).key_for(None, "RS256")


async def test_a_key_without_alg_must_still_fit_the_token(keys):
    """A JWK need not name its `alg`; then its `kty` decides: an EC key never verifies RS256
    (and an RSA key never ES256), whatever the token's header says."""
    bare = [{k: v for k, v in keys[kid].public_jwk().items() if k != "alg"} for kid in ("a", "e")]

    async def no_alg(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": orjson.dumps({"keys": bare})})

    async with serve(no_alg) as idp:
        jwks = source(f"{idp.base}/jwks", ManualClock(1000.0))
        assert await jwks.key_for("a", "RS256") and await jwks.key_for("e", "ES256")
        with pytest.raises(KeyUnavailable, match="Not an RSA key"):
            await jwks.key_for("e", "RS256")
        with pytest.raises(KeyUnavailable, match="Not an Elliptic curve key"):
            await jwks.key_for("a", "ES256")


async def test_keys_whose_key_ops_exclude_verify_are_ignored(keys):
    """RFC 7517 §4.3: `key_ops` says what a key is for; one without "verify" checks no token."""
    document = {"keys": [{**keys["a"].public_jwk(), "key_ops": ["verify"]},
                         {**keys["b"].public_jwk(), "key_ops": ["encrypt", "wrapKey"]}]}

    async def ops(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": orjson.dumps(document)})

    async with serve(ops) as idp:
        jwks = source(f"{idp.base}/jwks", ManualClock(1000.0))
        assert await jwks.key_for("a", "RS256")
        with pytest.raises(KeyUnavailable, match="no key with kid 'b'"):
            await jwks.key_for("b", "RS256")


async def test_an_rsa_key_under_2048_bits_is_refused():
    """RFC 7518 §3.3: RS256 keys MUST be 2048 bits or more; pyjwt would only warn."""
    weak = SigningKey("weak", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=1024))
    async with serve(JwksEndpoint(Issuer(keys=[weak]))) as idp:
        with pytest.raises(KeyUnavailable, match="1024-bit RSA key"):
            await source(f"{idp.base}/jwks", ManualClock(1000.0)).key_for("weak", "RS256")


async def test_an_oversized_answer_is_refused_and_the_old_set_kept(keys):
    """A key set past MAX_JWKS_BYTES is not read to its end, nor believed, even if it is a valid
    JWK Set (here: one that also brings a new key)."""
    issuer = Issuer(keys=[keys["a"]])
    endpoint = JwksEndpoint(issuer)
    clock = ManualClock(1000.0)
    async with serve(endpoint) as idp:
        jwks = source(f"{idp.base}/jwks", clock)
        await jwks.key_for("a", "RS256")
        issuer.keys.append(keys["b"])
        endpoint.answer = "huge"
        clock.now += 31
        with pytest.raises(KeyUnavailable, match="no key with kid 'b'"):
            await jwks.key_for("b", "RS256")
        assert await jwks.key_for("a", "RS256")
    assert endpoint.fetches == 2


async def test_a_trickled_answer_is_cut_at_the_deadline(keys):
    """httpx's timeout bounds each read, and every read here is quick: only a deadline on the
    whole fetch stops a JWKS server that sends one byte at a time. Never fetched: unreachable
    (→ 503) after about `timeout_seconds`; fetched before: the cached key, as quickly."""
    endpoint = JwksEndpoint(Issuer(keys=[keys["a"]]), answer="slow", drip_seconds=0.05)
    clock = ManualClock(1000.0)
    async with serve(endpoint) as idp:
        cold = source(f"{idp.base}/jwks", clock, timeout_seconds=0.5)
        started = time.monotonic()
        with pytest.raises(KeySetUnreachable):
            await asyncio.wait_for(cold.key_for("a", "RS256"), 5)
        assert time.monotonic() - started < 2

        endpoint.answer = "ok"
        warm = source(f"{idp.base}/jwks", clock, timeout_seconds=0.5)
        await warm.key_for("a", "RS256")
        endpoint.answer = "slow"
        clock.now += 301  # stale: a refetch is due, and trickles
        started = time.monotonic()
        assert await asyncio.wait_for(warm.key_for("a", "RS256"), 5)
        assert time.monotonic() - started < 2
    assert endpoint.fetches == 3


async def _started(app: Any) -> ServedApp:
    served = ServedApp(app)
    await served.start()
    return served
