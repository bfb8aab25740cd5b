"""Redis with a small in-process layer in front, kept correct across replicas.

A hot key is answered from this process's memory without a network round trip. Copies live
at most `local_ttl_ms` (and never past the entry's own freshness); every invalidation, from
this replica or another, arrives on the Redis channel and drops the local copies; when that
channel is lost and regained the local layer starts empty, because what was published in the
gap is unknown. So a replica serves a dropped entry for at most `local_ttl_ms`, and only while
the invalidation channel itself is down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.cache.entry import Entry
from gateway.cache.memory import MemoryStore
from gateway.cache.redis import RedisStore


class LayeredStore:
    shared = True

    def __init__(self, remote: RedisStore, local: MemoryStore, *, local_ttl_ms: int) -> None:
        self.remote = remote
        self.local = local
        self.local_ttl_ms = local_ttl_ms
        remote.on_remote_drop = self._remote_drop
        remote.on_resync = self.local.clear

    def _remote_drop(self, tags: Sequence[str] | None) -> None:
        if tags is None:
            self.local.clear()
        else:
            self.local.drop_now(tags)

    async def get(self, keys: Sequence[str]) -> list[Entry | None]:
        now = self.local.clock()
        local = [self.local.get_now(k) for k in keys]
        if any(e is not None and e.fresh(now) for e in local):
            return local
        found = await self.remote.get_sized(keys)
        out: list[Entry | None] = []
        for key, item in zip(keys, found, strict=True):
            if item is None:
                out.append(None)
                continue
            entry, size = item
            self._keep_locally(key, entry, size, now)
            out.append(entry)
        return out

    def peek(self, keys: Sequence[str]) -> list[Entry | None] | None:
        # `get` answers from the local layer whenever one of its copies is fresh, and the
        # caller only uses a fresh entry: a peek that finds one is what `get` would return.
        now = self.local.clock()
        local = [self.local.get_now(k) for k in keys]
        return local if any(e is not None and e.fresh(now) for e in local) else None

    def _keep_locally(self, key: str, entry: Entry, size: int, now: int, since: Any = None) -> None:
        keep = min(self.local_ttl_ms, entry.remaining_ms(now))
        if keep > 0:
            self.local.put_now(key, entry, size, entry.tags, keep, since)

    def generation(self, tags: Sequence[str]) -> tuple[int, ...]:
        # Every drop, this replica's or one heard on the channel, and every resync goes through
        # the local layer (drop_now / clear), which bumps its generations.
        return self.local.generation(tags)

    async def mark(self, tags: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return self.local.generation(tags), await self.remote.mark(tags)

    async def put(
        self, key: str, entry: Entry, encoded: bytes, tags: Sequence[str], keep_ms: int, since: Any = None
    ) -> bool:
        local_since, remote_since = since if since is not None else (None, None)
        if not await self.remote.put(key, entry, encoded, tags, keep_ms, remote_since):
            return False
        self._keep_locally(key, entry, len(encoded), self.local.clock(), local_since)
        return True

    async def drop(self, tags: Sequence[str]) -> int:
        self.local.drop_now(tags)
        return await self.remote.drop(tags)

    async def flush(self, backend: str | None = None) -> int:
        await self.local.flush(backend)
        return await self.remote.flush(backend)

    async def lock(self, key: str, ttl_ms: int) -> str | None:
        return await self.remote.lock(key, ttl_ms)

    async def unlock(self, key: str, token: str) -> None:
        await self.remote.unlock(key, token)

    async def locked(self, key: str) -> bool:
        return await self.remote.locked(key)

    async def start(self) -> None:
        await self.remote.start()

    async def aclose(self) -> None:
        self.local.clear()
        await self.remote.aclose()
