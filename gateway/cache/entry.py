"""What a store holds, and the interface every store implements.

An entry keeps the answer's `result` (or a remembered `error`), the wall-clock time it was
stored and the TTL the gateway applied. Wall-clock time, because an entry written by one
replica is read by another: the remaining freshness must mean the same thing on both.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.cache.policy import Scope


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Entry:
    body: dict[str, Any]  # {"result": {...}} or {"error": {...}}
    stored_at_ms: int
    ttl_ms: int
    scope: Scope
    # Invalidation tags (gateway/cache/keys.py); kept with the entry so that a replica's local
    # layer can index what it copied from Redis.
    tags: tuple[str, ...] = ()

    def remaining_ms(self, now: int) -> int:
        return self.stored_at_ms + self.ttl_ms - now

    def fresh(self, now: int) -> bool:
        # spec: fresh while now < t_received + ttlMs
        return self.remaining_ms(now) > 0

    def encode(self) -> bytes:
        return orjson.dumps(
            {"b": self.body, "t": self.stored_at_ms, "l": self.ttl_ms, "s": self.scope, "g": self.tags}
        )

    @staticmethod
    def decode(raw: bytes) -> Entry:
        data = orjson.loads(raw)
        body, tags = data["b"], data.get("g") or []
        # A value that parses but is not an entry (another writer's, another version's, damaged)
        # must read as a miss (ValueError), not be served as a null error or a 500, nor break
        # the local layer's tag index with unhashable tags.
        answer = body.get("result", body.get("error")) if isinstance(body, dict) else None
        if not (isinstance(answer, dict) and isinstance(tags, list)
                and all(isinstance(t, str) for t in tags)):
            raise ValueError("not a cache entry")
        return Entry(
            body,
            int(data["t"]),
            int(data["l"]),
            "public" if data["s"] == "public" else "private",
            tuple(tags),
        )


class StoreUnavailable(Exception):
    """The store could not answer (Redis down, slow, restarting): bypass the cache."""


class Store(Protocol):
    # True when other replicas see the same entries (cross-replica fetch locks make sense).
    shared: bool

    async def get(self, keys: Sequence[str]) -> list[Entry | None]:
        """The entries under `keys`, in order, in one round trip."""

    def peek(self, keys: Sequence[str]) -> list[Entry | None] | None:
        """What `get(keys)` would return, answered without waiting, or None when this store
        cannot tell without a round trip (cache/assembled.py reuses answers only on a peek)."""

    def generation(self, tags: Sequence[str]) -> Hashable:
        """This process's view of invalidations of `tags`: changes whenever one of them (or
        everything) is dropped here or heard of from another replica. In-process fetch
        coalescing keys on it, so a request made after an invalidation never joins a fetch
        that started before it."""

    async def mark(self, tags: Sequence[str]) -> Any:
        """The store's generations of `tags`, read when a fill starts and handed to `put`."""

    async def put(
        self, key: str, entry: Entry, encoded: bytes, tags: Sequence[str], keep_ms: int, since: Any = None
    ) -> bool:
        """Store `entry` (already `encoded`) for `keep_ms`, indexed under `tags` — unless `since`
        (a `mark`) is given and one of `tags` was invalidated after it. True when stored."""

    async def drop(self, tags: Sequence[str]) -> int:
        """Remove every entry indexed under any of `tags`; returns how many were removed."""

    async def flush(self, backend: str | None = None) -> int:
        """Remove every entry (of one backend); returns how many were removed."""

    async def lock(self, key: str, ttl_ms: int) -> str | None:
        """Take a fetch lock shared with other replicas: a token, or None when held elsewhere."""

    async def unlock(self, key: str, token: str) -> None: ...

    async def locked(self, key: str) -> bool: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...
