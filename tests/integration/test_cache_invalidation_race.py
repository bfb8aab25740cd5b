"""An invalidation that lands while a fetch is in flight, across two replicas sharing a real
redis-server (gateway/cache/redis.py generation keys). Each replica is a `StoreCache` over
the store the factory builds for `store: redis` (Redis plus a local layer); the loader stands
in for the backend so the test decides exactly when the backend answers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.backends.base import internal_call
from gateway.cache import admin
from gateway.cache.factory import build_store
from gateway.cache.service import StoreCache
from gateway.protocol.principal import Principal
from gateway.routing.table import Target
from gateway.settings import CacheSettings
from tests.support.fake_backend import FakeBackend


def never_called(call):  # pragma: no cover - the cache must call the loader, not the backend
    raise AssertionError("the cache must call the loader, not the backend")


TARGET = Target(FakeBackend(never_called, name="alpha"), "")


def tools_list() -> Any:
    c = internal_call("tools/list", {})
    c.principal = Principal("alice", "https://idp")
    return c


class GatedLoader:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        n = self.calls
        await self.gate.wait()
        result = {"resultType": "complete", "tools": [], "n": n, "ttlMs": 60_000, "cacheScope": "public"}
        return {"jsonrpc": "2.0", "id": 0, "result": result}


@contextlib.asynccontextmanager
async def replicas(redis_url: str, **cache: Any) -> AsyncIterator[tuple[StoreCache, StoreCache]]:
    cache = {"key_prefix": f"race{uuid.uuid4().hex[:8]}", "local_ttl_ms": 60_000, **cache}
    settings = CacheSettings(store="redis", redis_url=redis_url, **cache)
    one, two = StoreCache(build_store(settings), settings), StoreCache(build_store(settings), settings)
    await one.start()
    await two.start()
    try:
        yield one, two
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_fill_racing_another_replicas_invalidation_is_not_stored(redis_server):
    async with replicas(redis_server.url) as (one, two):
        load = GatedLoader()
        racing = asyncio.create_task(one.fetch(TARGET, tools_list(), load))
        while load.calls == 0:
            await asyncio.sleep(0.001)
        await two.invalidate_lists("alpha", ("tools/list",))
        load.gate.set()
        answer, outcome = await racing
        assert outcome == "miss" and answer["result"]["n"] == 1  # its own caller asked before
        # The answer fetched before the invalidation is not in the shared store...
        answer, outcome = await two.fetch(TARGET, tools_list(), load)
        assert outcome == "miss" and answer["result"]["n"] == 2
        # ...nor in the fetching replica's local layer; fills after it are shared as usual.
        answer, outcome = await one.fetch(TARGET, tools_list(), load)
        assert outcome == "hit" and answer["result"]["n"] == 2 and load.calls == 2


async def test_a_fill_racing_a_flush_of_everything_is_not_stored(redis_server):
    # `mcp-gateway cache flush` while a backend answer is on its way: the flush bumps the
    # generation every tag shares, so the answer fetched before it is not stored after it.
    async with replicas(redis_server.url) as (one, two):
        load = GatedLoader()
        racing = asyncio.create_task(one.fetch(TARGET, tools_list(), load))
        while load.calls == 0:
            await asyncio.sleep(0.001)
        await admin.flush(one.settings)
        load.gate.set()
        answer, outcome = await racing
        assert outcome == "miss" and answer["result"]["n"] == 1
        answer, outcome = await two.fetch(TARGET, tools_list(), load)
        assert outcome == "miss" and answer["result"]["n"] == 2
