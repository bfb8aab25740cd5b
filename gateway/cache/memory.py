"""The in-process store: an LRU bounded by entry count and by encoded bytes.

It is the embedded default (`cache.store: memory`) and also the local layer in front of Redis.
Entries leave when they are evicted (least recently used first), when their keep time runs
out (checked on access, so a dead entry costs nothing until touched or evicted), or when one
of their tags is dropped.

Every drop bumps a generation counter per tag (and `clear` one for everything), so that a
fill that started before an invalidation can tell it must not store its answer
(`generation` / `put_now(..., since=)`; docs/cache.md "Invalidation during a fetch").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.cache.entry import Entry, now_ms
from gateway.cache.keys import backend_tag


# Tags whose drops are counted before the counts are folded into the epoch (one read tag per
# invalidated URI: without a bound a long-lived process would count every URI ever updated).
_MAX_GENERATIONS = 100_000


@dataclass(slots=True)
class _Slot:
    entry: Entry
    size: int
    keep_until_ms: int
    tags: tuple[str, ...]


class MemoryStore:
    shared = False

    def __init__(self, *, max_entries: int, max_bytes: int, clock: Callable[[], int] = now_ms) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._tags: dict[str, set[str]] = {}
        self.bytes = 0
        # One counter per tag dropped (at most _MAX_GENERATIONS, see _bump).
        self._generations: dict[str, int] = {}
        self._epoch = 0  # bumped by clear(): every tag's generation changes

    def __len__(self) -> int:
        return len(self._slots)

    def tagged(self, tag: str) -> int:
        """How many entries are indexed under `tag` (live or not yet noticed as expired)."""
        return len(self._tags.get(tag, ()))

    # -- synchronous core (the local layer calls these directly) ----------------------------

    def get_now(self, key: str) -> Entry | None:
        slot = self._slots.get(key)
        if slot is None:
            return None
        if slot.keep_until_ms <= self.clock():
            self._remove(key)
            return None
        self._slots.move_to_end(key)
        return slot.entry

    def _bump(self, tag: str) -> None:
        if len(self._generations) >= _MAX_GENERATIONS:
            # Bounded: forget every tag's count and change the epoch instead, which makes every
            # fill in flight skip its store, the safe side.
            self._generations.clear()
            self._epoch += 1
        self._generations[tag] = self._generations.get(tag, 0) + 1

    def generation(self, tags: Sequence[str]) -> tuple[int, ...]:
        """Changes whenever any of `tags` is dropped (or everything is cleared) from now on."""
        return (self._epoch, *(self._generations.get(t, 0) for t in tags))

    def put_now(
        self,
        key: str,
        entry: Entry,
        size: int,
        tags: Sequence[str],
        keep_ms: int,
        since: tuple[int, ...] | None = None,
    ) -> bool:
        """Store `entry`, unless one of its tags was dropped after `since` was read."""
        if keep_ms <= 0 or size > self.max_bytes:
            return False
        if since is not None and since != self.generation(tags):
            return False
        if key in self._slots:
            self._remove(key)
        self._slots[key] = _Slot(entry, size, self.clock() + keep_ms, tuple(tags))
        self.bytes += size
        for tag in tags:
            self._tags.setdefault(tag, set()).add(key)
        while len(self._slots) > self.max_entries or self.bytes > self.max_bytes:
            oldest = next(iter(self._slots))
            self._remove(oldest)
        return True

    def drop_now(self, tags: Sequence[str]) -> int:
        removed = 0
        for tag in tags:
            self._bump(tag)
            for key in list(self._tags.get(tag, ())):
                removed += self._remove(key)
        return removed

    def clear(self) -> int:
        count = len(self._slots)
        self._epoch += 1
        self._slots.clear()
        self._tags.clear()
        self.bytes = 0
        return count

    def _remove(self, key: str) -> int:
        slot = self._slots.pop(key, None)
        if slot is None:
            return 0
        self.bytes -= slot.size
        for tag in slot.tags:
            keys = self._tags.get(tag)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._tags[tag]
        return 1

    # -- the Store interface ---------------------------------------------------------------

    async def get(self, keys: Sequence[str]) -> list[Entry | None]:
        return [self.get_now(k) for k in keys]

    def peek(self, keys: Sequence[str]) -> list[Entry | None]:
        return [self.get_now(k) for k in keys]

    async def mark(self, tags: Sequence[str]) -> tuple[int, ...]:
        return self.generation(tags)

    async def put(
        self, key: str, entry: Entry, encoded: bytes, tags: Sequence[str], keep_ms: int, since: Any = None
    ) -> bool:
        return self.put_now(key, entry, len(encoded), tags, keep_ms, since)

    async def drop(self, tags: Sequence[str]) -> int:
        return self.drop_now(tags)

    async def flush(self, backend: str | None = None) -> int:
        if backend is None:
            return self.clear()
        return self.drop_now([backend_tag(backend)])

    # One process: the in-process coalescing already makes concurrent misses fetch once.
    async def lock(self, key: str, ttl_ms: int) -> str | None:
        return "local"

    async def unlock(self, key: str, token: str) -> None:
        return None

    async def locked(self, key: str) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        self.clear()
