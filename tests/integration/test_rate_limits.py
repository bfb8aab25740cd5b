"""Rate limits end to end: two gateway replicas sharing a real redis-server, real RS256
tokens, a real backend; the limit holds across both, another principal is unaffected, and
with redis-server killed mid-run the limits keep applying per replica and no request within
them fails. Also: legacy clients are limited like modern ones."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
import redis.asyncio as redis
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from gateway.policies.ratelimit import RATE_LIMIT_FALLBACKS
from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.governance import jwt_auth
from tests.support.scripted import Scripted

LIMIT = {"id": "per-principal", "rate": "10/s", "burst": 10, "key": ["principal"], "methods": ["tools/call"]}


@pytest.fixture(scope="module")
def backend(ledger: Scripted) -> Scripted:
    return ledger  # the shared scripted backend (tests/integration/conftest.py)


def settings(backend: Scripted, jwks_url: str, redis_url: str | None, redis_timeout_ms: int = 200) -> dict[str, Any]:
    config: dict[str, Any] = {
        "backends": [{"name": "ledger", "url": backend.url, "era": "modern"}],
        "auth": jwt_auth(jwks_url, claims=()),
        "rate_limits": [LIMIT],
    }
    if redis_url is not None:
        config["cache"] = {"store": "redis", "redis_url": redis_url, "redis_timeout_ms": redis_timeout_ms,
                           "redis_retry_seconds": 0.5}
    return config


@contextlib.asynccontextmanager
async def two_replicas(config: dict[str, Any]) -> AsyncIterator[tuple[Any, Any]]:
    async with running_gateway(config) as one, running_gateway(config) as two:
        yield one, two


async def call(http: httpx.AsyncClient, url: str, token: str, n: int) -> httpx.Response:
    return await mcp_http.post(http, url, "tools/call", {"name": "echo", "arguments": {"text": str(n)}}, id=n,
                               extra_headers={"authorization": f"Bearer {token}"})


async def burst_of(http: httpx.AsyncClient, urls: list[str], token: str, n: int) -> tuple[list[httpx.Response], float]:
    started = time.monotonic()
    answers = await asyncio.gather(*(call(http, urls[i % len(urls)], token, i) for i in range(n)))
    return list(answers), time.monotonic() - started


def allowed_at_most(elapsed: float) -> int:
    # burst 10, then one per 100 ms of the run; +1 for a refill landing at the edge.
    return 10 + math.floor(elapsed * 10) + 1


async def test_the_limit_holds_across_two_replicas_sharing_redis(backend, jwks_url, issuer, redis_server):
    alice, bob = issuer.token("alice"), issuer.token("bob")
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    # A generous Redis timeout: on a loaded machine a 100-request burst can delay the loop past
    # 200 ms, and the local fallback (tested below) would then decide instead of Redis.
    config = settings(backend, jwks_url, redis_server.url, redis_timeout_ms=3000)
    async with two_replicas(config) as (one, two), httpx.AsyncClient(limits=limits, timeout=30) as http:
        fallbacks = RATE_LIMIT_FALLBACKS._value.get()
        await call(http, one.url, issuer.token("warm-up"), 0)  # keys fetched, connections open
        await call(http, two.url, issuer.token("warm-up"), 0)
        answers, elapsed = await burst_of(http, [one.url, two.url], alice, 100)
        bob_answers = [await call(http, url, bob, 1) for url in (one.url, two.url, one.url)]
        assert RATE_LIMIT_FALLBACKS._value.get() == fallbacks  # every decision was Redis's
        shared = redis.Redis.from_url(redis_server.url)
        try:
            keys = await shared.keys("mcpgw:rl:*")
        finally:
            await shared.aclose()
    # The buckets live in Redis (alice's, bob's, the warm-ups'), hash-tagged, nothing in clear.
    assert len(keys) >= 2 and all(b"{" in k and b"alice" not in k for k in keys)
    ok = [a for a in answers if a.status_code == 200]
    limited = [a for a in answers if a.status_code == 429]
    assert len(ok) + len(limited) == 100, [a.status_code for a in answers]
    # 100 calls split across both replicas: the shared bucket lets 10 through at once, plus
    # what the rate refilled while they ran (the "10-12" for a run within ~0.2 s).
    assert 10 <= len(ok) <= allowed_at_most(elapsed), (len(ok), elapsed)
    for answer in limited:
        assert int(answer.headers["retry-after"]) >= 1
        error = answer.json()["error"]
        assert error["data"]["limit"] == "per-principal" and 0 < error["data"]["retryAfterMs"] <= 1000
    assert [a.status_code for a in bob_answers] == [200, 200, 200]


async def test_redis_killed_mid_run_limits_keep_applying_locally(backend, jwks_url, issuer, redis_server):
    carol = issuer.token("carol")
    async with two_replicas(settings(backend, jwks_url, redis_server.url)) as (one, two), \
            httpx.AsyncClient(timeout=30) as http:
        first, _ = await burst_of(http, [one.url, two.url], carol, 20)
        assert sum(a.status_code == 200 for a in first) >= 10
        redis_server.kill()
        before = RATE_LIMIT_FALLBACKS._value.get()
        await asyncio.sleep(1.1)  # the bucket refills: the next 10 are within the limit
        # Within the limit on each replica (burst 10 each, locally): every one succeeds.
        within = [await call(http, url, issuer.token(f"dave-{i}"), i) for i, url in enumerate([one.url, two.url] * 5)]
        assert [a.status_code for a in within] == [200] * 10, [a.text for a in within if a.status_code != 200]
        # Over the limit on one replica: never unlimited, never a failure.
        over, elapsed = await burst_of(http, [one.url], carol, 30)
        statuses = [a.status_code for a in over]
        assert set(statuses) <= {200, 429}, statuses
        assert 10 <= statuses.count(200) <= allowed_at_most(elapsed), (statuses, elapsed)
        assert statuses.count(429) >= 30 - allowed_at_most(elapsed)
        assert RATE_LIMIT_FALLBACKS._value.get() > before


async def test_legacy_clients_are_limited_too(backend, jwks_url, issuer):
    token = issuer.token("erin")
    async with running_gateway(settings(backend, jwks_url, None)) as gw, \
            httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http, \
            Client(streamable_http_client(gw.url, http_client=http), mode="legacy", cache=None) as client:
        async def one(i: int) -> str:
            try:
                await client.call_tool("echo", {"text": str(i)})
                return "ok"
            except MCPError as exc:
                assert "rate limit per-principal" in str(exc)
                return "limited"

        started = time.monotonic()
        results = await asyncio.gather(*(one(i) for i in range(30)))
        elapsed = time.monotonic() - started
    assert 10 <= results.count("ok") <= allowed_at_most(elapsed), (results, elapsed)
    assert results.count("limited") >= 30 - allowed_at_most(elapsed)
