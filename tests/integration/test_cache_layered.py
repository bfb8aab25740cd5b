"""The local layer in front of Redis (gateway/cache/layered.py) stays honest: gateway replicas
sharing a real redis-server, each with its own local layer, in front of the counting backend
(tests/fixtures/servers/counting_modern.py). The local TTL is long in every test, so only an
invalidation (or a flush) can make a replica forget a copy: what it serves shows what it heard.

- `mcp-gateway cache flush` of everything empties every replica's local layer, and a flush
  of one backend leaves the others' entries alone;
- an invalidation while Redis is down is still applied to this replica's local layer;
- messages on the invalidation channel that are not invalidations change nothing."""

from __future__ import annotations

import logging

import httpx
import orjson
import redis.asyncio as aioredis

from gateway.cache import admin
from gateway.cache.keys import list_tag, read_tag
from tests.integration.test_cache_redis import (
    counts,
    fresh_uri,
    read,
    settings,
    text,
    two_replicas,
    until_dropped,
)
from tests.support import mcp_http
from tests.support.gateway import running_gateway


async def test_a_flush_of_everything_empties_every_replicas_local_layer(counting_backend, redis_server):
    uri = fresh_uri("public")
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
        await read(c, one, uri)
        await mcp_http.post(c, one.url, "tools/list")
        assert (await read(c, two, uri))[1] == "hit"
        assert (await mcp_http.post(c, two.url, "tools/list")).headers["x-cache"] == "hit"
        # What `mcp-gateway cache flush` (no --backend) runs, from outside both replicas.
        assert await admin.flush(one.app.settings.cache) >= 2
        for gw in (one, two):
            await until_dropped(gw.runtime.cache.store.local, read_tag("counted", uri))
            await until_dropped(gw.runtime.cache.store.local, list_tag("counted", "tools/list"))
        result, outcome = await read(c, two, uri)
        assert outcome == "miss" and text(result).endswith("#2")
        assert (await mcp_http.post(c, one.url, "tools/list")).headers["x-cache"] == "miss"


async def test_a_flush_of_one_backend_leaves_the_other_backends_entries(counting_backend, redis_server):
    # Two backends (the same server under two names): `cache flush --backend counted` must
    # not cold-start the rest of the fleet, in Redis or in any local layer.
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    config["backends"].append({"name": "other", "url": counting_backend.url})
    async with two_replicas(config) as (one, two), httpx.AsyncClient() as c:
        listing = await mcp_http.post(c, one.url, "tools/list")
        names = [t["name"] for t in listing.json()["result"]["tools"]]
        assert "counted__counted_a" in names and "other__counted_a" in names
        assert (await mcp_http.post(c, two.url, "tools/list")).headers["x-cache"] == "hit"
        await admin.flush(one.app.settings.cache, "counted")
        shared = aioredis.from_url(redis_server.url)
        try:
            # Only the backend's generations stay (they only ever grow: a fill in flight that
            # read them before the flush must not store after it).
            left = [k async for k in shared.scan_iter(match="{mcpgw:cache:counted}:*")]
            assert left and all(k.startswith(b"{mcpgw:cache:counted}:gen:") for k in left), left
            assert [k async for k in shared.scan_iter(match="{mcpgw:cache:other}:pub:*")]
        finally:
            await shared.aclose()
        for gw in (one, two):
            await until_dropped(gw.runtime.cache.store.local, list_tag("counted", "tools/list"))
            assert gw.runtime.cache.store.local.tagged(list_tag("other", "tools/list")) == 1
        before = await counts(c, counting_backend)
        again = await mcp_http.post(c, two.url, "tools/list")
        assert again.headers["x-cache"] == "miss"
        assert again.json()["result"]["tools"] == listing.json()["result"]["tools"]
        after = await counts(c, counting_backend)
        assert after["tools/list"] - before["tools/list"] == 1  # only the flushed backend was asked


async def test_an_invalidation_while_redis_is_down_still_drops_the_local_copy(counting_backend, redis_server,
                                                                             caplog):
    uri = fresh_uri("public")
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        await read(c, gw, uri)
        assert (await read(c, gw, uri))[1] == "hit"  # from the local layer from now on
        redis_server.kill()
        caplog.set_level(logging.WARNING, logger="gateway.cache")
        # What the hub does on `notifications/resources/updated` for that URI.
        await gw.runtime.cache.invalidate_resource("counted", uri)
        assert "not applied to the shared store" in caplog.text
        result, outcome = await read(c, gw, uri)
        assert outcome == "bypass" and text(result).endswith("#2")


async def test_messages_on_the_invalidation_channel_that_are_not_invalidations_change_nothing(
    counting_backend, redis_server, caplog
):
    uri = fresh_uri("public")
    config = settings(counting_backend, redis_server.url, local_ttl_ms=60_000)
    publisher = aioredis.from_url(redis_server.url)
    caplog.set_level(logging.WARNING)
    try:
        async with running_gateway(config) as gw, httpx.AsyncClient() as c:
            await read(c, gw, uri)
            await mcp_http.post(c, gw.url, "tools/list")
            local = gw.runtime.cache.store.local
            assert local.tagged(read_tag("counted", uri)) == 1
            for foreign in (b"not json", b"[1, 2]", b'"tags"', b'{"tags": "all"}', b'{"all": false}',
                            b'{"other": "shape"}'):
                await publisher.publish("mcpgw:invalidate", foreign)
            # Then a real one, with members that are not tags beside one that is. The channel
            # keeps order: once it is applied, every message before it was handled.
            tools = list_tag("counted", "tools/list")
            await publisher.publish("mcpgw:invalidate", orjson.dumps({"tags": [7, None, {"x": 1}, tools]}))
            await until_dropped(local, tools)
            assert local.tagged(read_tag("counted", uri)) == 1
            result, outcome = await read(c, gw, uri)
            assert outcome == "hit" and text(result).endswith("#1")
        # Ignored, not reported: such a message is nobody's failure.
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert not [r for r in warned if r.name.startswith("gateway")]
    finally:
        await publisher.aclose()
