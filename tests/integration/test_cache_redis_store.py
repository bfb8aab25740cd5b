"""RedisStore (gateway/cache/redis.py) on its own, against a real redis-server: the bound on
its in-process invalidation table (`generation`, what in-process fetch coalescing keys on
when there is no local layer) never makes it forget an invalidation, and the operator's
flush empties a large cache completely, and nothing under another prefix."""

from __future__ import annotations

import asyncio

import orjson
import redis.asyncio as aioredis

from gateway.cache.redis import RedisStore
from tests.support.redis_shapes import plan_for


async def test_the_bounded_generation_table_never_forgets_an_invalidation(redis_server):
    store = RedisStore(plan_for(redis_server.url), prefix="gen", timeout_ms=2000, retry_seconds=0.1,
                       compress_above=1024, tag_ttl_ms=60_000)
    publisher = aioredis.from_url(redis_server.url)
    await store.start()
    try:
        await store.drop(["doc"])
        before = store.generation(["doc"])  # what a fetch started now coalesces under
        # Another replica invalidates 100,000 other tags: the table reaches its bound...
        flood = [f"other-{i}" for i in range(100_000)]
        await publisher.publish("gen:invalidate", orjson.dumps({"tags": flood}))
        while store.generation([flood[-1]]) == store.generation(["never-dropped"]):
            await asyncio.sleep(0.01)
        # ...and the next invalidation of "doc" finds it full. A request made after it must
        # not join the fetch that started before it: its generation must differ.
        await store.drop(["doc"])
        assert store.generation(["doc"]) != before
    finally:
        await store.aclose()
        await publisher.aclose()


async def test_a_flush_removes_every_entry_however_many_and_only_its_own(redis_server):
    # The operator's flush walks the keyspace in batches (of 1,000): a large cache is emptied
    # completely and counted right; a store under another prefix sharing the Redis is not touched.
    shared = aioredis.from_url(redis_server.url)
    store = RedisStore(plan_for(redis_server.url), prefix="big", timeout_ms=2000, retry_seconds=0.1,
                       compress_above=1024, tag_ttl_ms=60_000)
    try:
        async with shared.pipeline(transaction=False) as pipe:
            for i in range(2_500):
                pipe.set(f"{{big:cache:alpha}}:pub:{i}", b"j{}")
            pipe.set("{bigger:cache:alpha}:pub:0", b"j{}")
            await pipe.execute()
        assert await store.flush() == 2_500
        assert not [k async for k in shared.scan_iter(match="{big:cache:alpha}:pub:*")]
        assert await shared.exists("{bigger:cache:alpha}:pub:0")
    finally:
        await store.aclose()
        await shared.aclose()
