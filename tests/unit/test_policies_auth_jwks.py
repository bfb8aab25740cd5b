"""JwksKeys against a real JWKS endpoint on 127.0.0.1: caching by kid, refresh on rotation,
the refresh rate limit, coalescing, and serving cached keys while the IdP is down. Time is a
test-controlled clock, so nothing here sleeps or times anything."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.policies.jwt_keys import JwksKeys, KeySetUnreachable, KeyUnavailable
from tests.support.oauth import Issuer, JwksEndpoint, ServedApp, ec_key, rsa_key, serve
from tests.support.clock import ManualClock


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



async def _started(app: Any) -> ServedApp:
    served = ServedApp(app)
    await served.start()
    return served
