"""The response cache with Redis shared by two gateway replicas (two gateway apps, each on
its own loopback port, one real redis-server), in front of a backend that counts what it is
asked (tests/fixtures/servers/counting_modern.py). A request the cache answers never reaches
the backend, so the counts prove what was cached and for whom."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from gateway.cache.keys import list_tag, read_tag
from gateway.cache.memory import MemoryStore
from gateway.cache.redis import decode_value
from tests.support import mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.per_caller import identity_provider
from tests.support.procs import ROOT, Proc

ALICE = {"authorization": "Bearer alice-token"}


def settings(backend: Proc, redis_url: str, **cache: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "counted", "url": backend.url}],
        "cache": {"store": "redis", "redis_url": redis_url, "redis_retry_seconds": 0.1, **cache},
    }


@contextlib.asynccontextmanager
async def two_replicas(config: dict[str, Any]) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    async with running_gateway(config) as one, running_gateway(config) as two:
        yield one, two


async def counts(client: httpx.AsyncClient, backend: Proc) -> dict[str, int]:
    return (await client.get(f"http://127.0.0.1:{backend.port}/counts")).json()


async def read(
    client: httpx.AsyncClient, gw: RunningGateway, uri: str, who: dict[str, str] = ALICE, **params: Any
) -> tuple[dict[str, Any], str | None]:
    response = await mcp_http.post(
        client, gw.url, "resources/read", {"uri": uri, **params}, extra_headers=who
    )
    assert response.status_code == 200, response.text
    return response.json()["result"], response.headers.get("x-cache")


def text(result: dict[str, Any]) -> str:
    return result["contents"][0]["text"]


async def until_dropped(store: MemoryStore, tag: str) -> None:
    """Wait for a published invalidation to reach a replica's local layer."""
    deadline = time.monotonic() + 10
    while store.tagged(tag) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert store.tagged(tag) == 0, f"the local layer still holds {tag} after 10s"


def fresh_uri(kind: str) -> str:
    return f"count://{kind}/{uuid.uuid4().hex[:10]}"


async def test_a_list_fetched_through_one_replica_is_served_by_the_other(counting_backend, redis_server):
    async with (
        two_replicas(settings(counting_backend, redis_server.url)) as (one, two),
        httpx.AsyncClient() as c,
    ):
        before = await counts(c, counting_backend)
        first = await mcp_http.post(c, one.url, "tools/list")
        assert first.headers["x-cache"] == "miss"
        page_one = first.json()["result"]
        assert [t["name"] for t in page_one["tools"]] == ["counted_a", "counted_b"]
        second = await mcp_http.post(c, two.url, "tools/list")
        assert second.headers["x-cache"] == "hit"
        assert second.json()["result"]["tools"] == page_one["tools"]
        assert 0 < second.json()["result"]["ttlMs"] <= 60_000
        assert second.json()["result"]["cacheScope"] == "public"
        # The next page, by the gateway's cursor, is its own entry and is shared the same way.
        cursor = page_one["nextCursor"]
        assert (await mcp_http.post(c, two.url, "tools/list", {"cursor": cursor})).headers[
            "x-cache"
        ] == "miss"
        page_two = await mcp_http.post(c, one.url, "tools/list", {"cursor": cursor})
        assert page_two.headers["x-cache"] == "hit"
        assert [t["name"] for t in page_two.json()["result"]["tools"]] == ["counted_c"]
        after = await counts(c, counting_backend)
    assert after.get("tools/list", 0) - before.get("tools/list", 0) == 1
    assert after.get("tools/list page-2", 0) - before.get("tools/list page-2", 0) == 1


async def test_a_private_read_is_never_served_to_another_principal(counting_backend, redis_server):
    # Principals come from real tokens (auth.mode jwt): without authentication nothing private
    # is stored at all (tests/integration/test_cache_scope_security.py).
    uri = fresh_uri("private")
    async with identity_provider() as idp:
        config = {**settings(counting_backend, redis_server.url), "auth": idp.auth_settings()}
        alice, bob = idp.bearer("alice"), idp.bearer("bob")
        async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
            alice_first, outcome = await read(c, one, uri, alice)
            assert outcome == "miss" and text(alice_first).endswith("#1")
            assert alice_first["cacheScope"] == "private"
            alice_again, outcome = await read(c, two, uri, alice)
            assert outcome == "hit" and text(alice_again).endswith("#1")
            bob_first, outcome = await read(c, two, uri, bob)
            assert outcome == "miss" and text(bob_first).endswith("#2")
            bob_again, outcome = await read(c, one, uri, bob)
            assert outcome == "hit" and text(bob_again).endswith("#2")
            carol, outcome = await read(c, one, uri, idp.bearer("carol"))
            assert outcome == "miss" and text(carol).endswith("#3")
            assert text((await read(c, one, uri, alice))[0]).endswith("#1")
            assert (await counts(c, counting_backend))[f"resources/read {uri}"] == 3


async def test_entries_expire_with_their_ttl(counting_backend, redis_server):
    uri = fresh_uri("ttl/300")
    async with (
        two_replicas(settings(counting_backend, redis_server.url)) as (one, two),
        httpx.AsyncClient() as c,
    ):
        first, outcome = await read(c, one, uri)
        assert outcome == "miss" and first["ttlMs"] == 300
        await asyncio.sleep(0.4)
        again, outcome = await read(c, two, uri)
        assert outcome == "miss" and text(again).endswith("#2")
        assert (await counts(c, counting_backend))[f"resources/read {uri}"] == 2


async def test_ttl_zero_is_not_cached(counting_backend, redis_server):
    uri = fresh_uri("ttl/0")
    async with (
        two_replicas(settings(counting_backend, redis_server.url)) as (one, two),
        httpx.AsyncClient() as c,
    ):
        for n, gw in enumerate((one, one, two), start=1):
            result, outcome = await read(c, gw, uri)
            assert outcome == "miss" and result["ttlMs"] == 0 and text(result).endswith(f"#{n}")
        assert (await counts(c, counting_backend))[f"resources/read {uri}"] == 3


async def test_input_required_is_never_cached(counting_backend, redis_server):
    uri = fresh_uri("input")
    answer = {"answer": {"action": "accept", "content": {"ok": True}}}
    async with (
        two_replicas(settings(counting_backend, redis_server.url)) as (one, two),
        httpx.AsyncClient() as c,
    ):
        for gw in (one, two):
            result, outcome = await read(c, gw, uri)
            assert result["resultType"] == "input_required" and outcome != "hit"
            assert "ttlMs" not in result and "cacheScope" not in result
        # The retry carrying inputResponses goes to the backend and is not stored either.
        for gw in (one, two):
            result, outcome = await read(c, gw, uri, inputResponses=answer)
            assert result["resultType"] == "complete" and outcome == "bypass"
        result, outcome = await read(c, one, uri)
        assert result["resultType"] == "input_required"
        assert (await counts(c, counting_backend))[f"resources/read {uri}"] == 5


async def test_concurrent_misses_on_two_replicas_reach_the_backend_once(counting_backend, redis_server):
    uri = fresh_uri("public")
    async with (
        two_replicas(settings(counting_backend, redis_server.url)) as (one, two),
        httpx.AsyncClient() as c,
    ):
        answers = await asyncio.gather(*(read(c, gw, uri) for gw in (one, two) * 8))
        assert {text(result) for result, _ in answers} == {f"{uri} read #1"}
        assert sorted(outcome for _, outcome in answers).count("miss") == 1
        assert (await counts(c, counting_backend))[f"resources/read {uri}"] == 1


async def test_invalidation_reaches_the_other_replicas_local_layer(counting_backend, redis_server):
    uri = fresh_uri("public")
    # A long local TTL: only the published invalidation can make replica two forget.
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
        await read(c, one, uri)
        assert (await read(c, two, uri))[1] == "hit"  # now also in two's local layer
        local = two.runtime.cache.store.local
        assert local.tagged(read_tag("counted", uri)) == 1
        await one.runtime.cache.invalidate_resource("counted", uri)
        await until_dropped(local, read_tag("counted", uri))
        result, outcome = await read(c, two, uri)
        assert outcome == "miss" and text(result).endswith("#2")

        before = (await counts(c, counting_backend)).get("tools/list", 0)
        await mcp_http.post(c, two.url, "tools/list")
        assert local.tagged(list_tag("counted", "tools/list")) == 1
        await one.runtime.cache.invalidate_lists("counted", ("tools/list",))
        await until_dropped(local, list_tag("counted", "tools/list"))
        assert (await mcp_http.post(c, two.url, "tools/list")).headers["x-cache"] == "miss"
        assert (await counts(c, counting_backend))["tools/list"] == before + 2


async def test_a_kept_list_answer_ends_with_an_invalidation_from_another_replica(counting_backend, redis_server):
    # Replica two answers a repeated tools/list from its kept, encoded answer (cache/assembled.py)
    # while its local layer holds the entry; an invalidation published by replica one must end
    # that at once, like it ends the local copy.
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
        await one.runtime.cache.invalidate_lists("counted", ("tools/list",))
        statuses = [(await mcp_http.post(c, two.url, "tools/list")).headers["x-cache"] for _ in range(3)]
        assert statuses == ["miss", "hit", "hit"]
        assert two.runtime.cache.assembled.reused == 1
        await one.runtime.cache.invalidate_lists("counted", ("tools/list",))
        await until_dropped(two.runtime.cache.store.local, list_tag("counted", "tools/list"))
        assert (await mcp_http.post(c, two.url, "tools/list")).headers["x-cache"] == "miss"
        assert two.runtime.cache.assembled.reused == 1


async def test_without_the_local_layer_list_answers_are_assembled_every_time(counting_backend, redis_server):
    config = settings(counting_backend, redis_server.url, local_max_entries=0)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        await gw.runtime.cache.invalidate_lists("counted", ("tools/list",))
        statuses = [(await mcp_http.post(c, gw.url, "tools/list")).headers["x-cache"] for _ in range(3)]
        assert statuses == ["miss", "hit", "hit"]  # every hit a round trip to Redis
        assert gw.runtime.cache.assembled.reused == 0


async def test_redis_outage_bypasses_the_cache_and_caching_resumes(counting_backend, redis_server, caplog):
    # No local layer: every answer below is decided by Redis being there or not.
    config = settings(counting_backend, redis_server.url, local_max_entries=0)
    async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
        cached = fresh_uri("public")
        await read(c, one, cached)
        assert (await read(c, two, cached))[1] == "hit"

        redis_server.kill()
        caplog.clear()
        caplog.set_level(logging.INFO, logger="gateway.cache")
        during = fresh_uri("public")
        for n, gw in enumerate((one, two, one, two), start=1):
            result, outcome = await read(c, gw, during)
            assert outcome == "bypass" and text(result).endswith(f"#{n}")
            assert result["ttlMs"] == 60_000  # still told the freshness the gateway applies
            listing = await mcp_http.post(c, gw.url, "tools/list")
            assert listing.status_code == 200 and listing.json()["result"]["tools"]
            assert listing.headers["x-cache"] == "bypass"

        # Eight requests failed over to the backend; each replica warned once, not per request.
        warnings = [
            r for r in caplog.records if r.name.startswith("gateway.cache") and r.levelno >= logging.WARNING
        ]
        assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]

        redis_server.start()
        after = fresh_uri("public")
        deadline = time.monotonic() + 20
        outcome = None
        while time.monotonic() < deadline:
            result, outcome = await read(c, one, after)
            assert text(result).startswith(after)  # every request succeeds meanwhile
            if outcome == "miss":
                break
            await asyncio.sleep(0.05)
        assert outcome == "miss", "caching did not resume after Redis came back"
        # Replica two may still be inside its own `redis_retry_seconds` pause (it bypasses,
        # correctly); once it tries Redis again it must find replica one's entry.
        while time.monotonic() < deadline:
            outcome = (await read(c, two, after))[1]
            if outcome != "bypass":
                break
            await asyncio.sleep(0.05)
        assert outcome == "hit"


async def test_cache_flush_cli_drops_a_backends_entries_everywhere(counting_backend, redis_server, tmp_path):
    uri = fresh_uri("public")
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text(
        "backends:\n"
        f"  - name: counted\n    url: {counting_backend.url}\n"
        f"cache:\n  store: redis\n  redis_url: {redis_server.url}\n"
    )
    async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
        await read(c, one, uri)
        assert (await read(c, two, uri))[1] == "hit"
        done = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "cache",
            "flush",
            "--config",
            str(config_file),
            "--backend",
            "counted",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await done.communicate()
        assert done.returncode == 0, output.decode()
        assert b"key(s) removed" in output
        await until_dropped(two.runtime.cache.store.local, read_tag("counted", uri))
        result, outcome = await read(c, two, uri)
        assert outcome == "miss" and text(result).endswith("#2")


def _entry(body: Any, tags: Any = ("x",)) -> bytes:
    """A stored value in the store's own layout (redis.py: a format byte, then JSON)."""
    entry = {"b": body, "t": int(time.time() * 1000), "l": 60_000, "s": "public", "g": tags}
    return b"j" + orjson.dumps(entry)


# What another writer, another version or a damaged disk could leave under a live key.
FOREIGN_VALUES = {
    "unknown format byte": b"x" + _entry({"result": {"contents": []}})[1:],
    "not zlib": b"z" + b"\x00 not deflate data",
    "compressed non-entry": b"z" + zlib.compress(b"[1, 2]"),
    "truncated json": _entry({"result": {"contents": []}})[:20],
    "json list": b"j[1, 2, 3]",
    "missing fields": b'j{"b": {"result": {}}}',
    "body not an object": _entry("a string"),
    "result not an object": _entry({"result": 5}),
    "neither result nor error": _entry({}),
    "tags not strings": _entry({"result": {"contents": []}}, tags=[["nested"]]),
}


@pytest.mark.parametrize("raw", list(FOREIGN_VALUES.values()), ids=list(FOREIGN_VALUES))
async def test_a_damaged_or_foreign_value_is_read_as_a_miss_and_replaced(counting_backend, redis_server, raw):
    # Never an error, never a malformed answer, never the foreign value: the backend is asked
    # and its answer takes the key over.
    uri = fresh_uri("public")
    config = settings(counting_backend, redis_server.url)
    store = aioredis.from_url(redis_server.url)
    try:
        async with running_gateway(config) as writer, running_gateway(config) as reader, \
                httpx.AsyncClient() as c:
            await read(c, writer, uri)
            [key] = [k async for k in store.scan_iter(match="{mcpgw:cache:counted}:pub:*")]
            await store.set(key, raw, px=60_000)
            result, outcome = await read(c, reader, uri)
            assert outcome == "miss" and text(result) == f"{uri} read #2"
            assert result["ttlMs"] == 60_000 and result["cacheScope"] == "public"
            # The fresh answer took the damaged value's place.
            entry, _ = decode_value(await store.get(key))
            assert text(entry.body["result"]) == f"{uri} read #2"
            result, outcome = await read(c, reader, uri)
            assert outcome == "hit" and text(result) == f"{uri} read #2"
    finally:
        await store.aclose()


async def test_large_answers_are_stored_compressed_and_read_back_by_the_other_replica(counting_backend,
                                                                                     redis_server):
    uri = fresh_uri("public")
    config = settings(counting_backend, redis_server.url, compress_above_bytes=64)
    store = aioredis.from_url(redis_server.url)
    try:
        async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
            first, outcome = await read(c, one, uri)
            assert outcome == "miss"
            [key] = [k async for k in store.scan_iter(match="{mcpgw:cache:counted}:pub:*")]
            raw = await store.get(key)
            assert raw[:1] == b"z" and uri.encode() not in raw  # compressed, not plain JSON
            again, outcome = await read(c, two, uri)
            assert outcome == "hit" and again["contents"] == first["contents"]
            assert (await counts(c, counting_backend))[f"resources/read {uri}"] == 1
    finally:
        await store.aclose()


@pytest.mark.parametrize("user", ["", "default"])
async def test_a_redis_password_never_reaches_the_logs(counting_backend, redis_server, caplog, user):
    admin = aioredis.from_url(redis_server.url)
    try:
        await admin.config_set("requirepass", "the-right-one")
    finally:
        await admin.aclose()
    # A wrong password: every use of Redis fails, and each failure is logged (cache and
    # listen bus both use this URL).
    url = f"redis://{user}:not-the-password@127.0.0.1:{redis_server.port}/0"
    caplog.set_level(logging.INFO)
    async with running_gateway(settings(counting_backend, url)) as gw, httpx.AsyncClient() as c:
        result, outcome = await read(c, gw, fresh_uri("public"))
        assert outcome == "bypass" and text(result).endswith("#1")
    logged = [r.getMessage() for r in caplog.records]
    shown = f"redis://{user}:***@127.0.0.1:{redis_server.port}/0"
    assert any(m.startswith("redis cache at " + shown) for m in logged), logged
    assert any(m.startswith("redis " + shown) for m in logged), logged  # the listen bus
    assert not [m for m in logged if "not-the-password" in m]
