"""StoreCache (gateway/cache/service.py) over the store the factory builds for `store: redis`,
against a real redis-server, when Redis or another replica does not do what the happy path
expects: a replica's fetch lock released without an entry, Redis refusing writes (paused)
or dying in the middle of a fill, Redis down while the backend answers something that is not
cacheable. The loaders stand in for the backend (tests/unit/test_cache_service.py), so each
test knows exactly what reached it; whatever Redis does, every caller gets its answer."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from tests.integration.test_cache_invalidation_race import replicas
from tests.unit.test_cache_service import TARGET, Loader, call


async def until_called(load: Loader, n: int = 1) -> None:
    while load.calls < n:
        await asyncio.sleep(0.001)


async def test_a_replica_waiting_on_anothers_fetch_lock_fetches_itself_when_nothing_was_stored(redis_server):
    # Replica one's fetch holds the cross-replica lock and its answer turns out uncacheable
    # (ttlMs 0). Replica two, waiting on that lock, must notice the lock is gone without an
    # entry and ask the backend itself, not sit out the lock's whole life.
    async with replicas(redis_server.url, lock_timeout_ms=600_000) as (one, two):
        first, second = Loader(ttl=0), Loader(ttl=0)
        first.gate = asyncio.Event()
        holding = asyncio.create_task(one.fetch(TARGET, call(request_id=1), first))
        await until_called(first)
        waiting = asyncio.create_task(two.fetch(TARGET, call(request_id=2), second))
        await asyncio.sleep(0.05)
        assert second.calls == 0 and not waiting.done()  # it waits on replica one's lock
        first.gate.set()
        answer, outcome = await holding
        assert outcome == "miss" and answer["result"]["n"] == 1
        answer, outcome = await asyncio.wait_for(waiting, 20)
        assert outcome == "miss" and answer["id"] == 2 and second.calls == 1


async def test_redis_refusing_writes_costs_the_request_nothing(redis_server):
    # `CLIENT PAUSE … WRITE` (what a failover or a stuck primary looks like): lookups still
    # answer, the fetch lock and the store time out. The caller gets the backend's answer.
    admin = aioredis.from_url(redis_server.url)
    try:
        async with replicas(redis_server.url, redis_timeout_ms=200, redis_retry_seconds=0.1) as (one, _):
            await admin.execute_command("CLIENT", "PAUSE", "30000", "WRITE")
            load = Loader()
            answer, outcome = await one.fetch(TARGET, call(), load)
            assert answer["result"]["n"] == 1 and answer["result"]["ttlMs"] == 60_000 and load.calls == 1
            assert outcome == "miss"  # asked of the backend, not stored
            await admin.execute_command("CLIENT", "UNPAUSE")
            await asyncio.sleep(0.15)  # past redis_retry_seconds: the store is tried again
            answer, outcome = await one.fetch(TARGET, call(), load)
            assert outcome == "miss" and answer["result"]["n"] == 2
            answer, outcome = await one.fetch(TARGET, call(), load)
            assert outcome == "hit" and answer["result"]["n"] == 2 and load.calls == 2
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()


async def test_redis_dying_in_the_middle_of_a_fill_costs_the_request_nothing(redis_server):
    # The lock was taken, then Redis went away: storing and unlocking both fail; the caller
    # still gets the answer (the lock would expire on its own).
    async with replicas(redis_server.url) as (one, _):
        load = Loader()
        load.gate = asyncio.Event()
        fetching = asyncio.create_task(one.fetch(TARGET, call(), load))
        await until_called(load)
        redis_server.kill()
        load.gate.set()
        answer, outcome = await fetching
        assert outcome == "miss" and answer["result"]["n"] == 1 and answer["id"] == 7


async def test_with_redis_down_an_answer_that_is_not_cacheable_passes_untouched(redis_server):
    async def input_required():
        return {"jsonrpc": "2.0", "id": 7, "result": {"resultType": "input_required", "inputRequests": {}}}

    async with replicas(redis_server.url) as (one, _):
        redis_server.kill()
        answer, outcome = await one.fetch(TARGET, call(), input_required)
        assert outcome == "bypass"
        assert answer == await input_required()  # no ttlMs / cacheScope on an interim result
        failing = Loader()
        failing.fail = {"code": -32603, "message": "backend broke"}
        answer, outcome = await one.fetch(TARGET, call(), failing)
        assert outcome == "bypass" and answer["error"] == {"code": -32603, "message": "backend broke"}
