"""The shared store: Redis, seen by every replica.

- A lookup is one round trip (`MGET` of the public and the private key).
- A store is one round trip (a pipeline: `SET … PX`, and `SADD` of the key into each of its
  tag sets, whose own expiry outlives every entry they index).
- Values are JSON (orjson); above `compress_above` bytes they are zlib-compressed. The first
  byte says which.
- Invalidations delete the tagged entries and are published on `<prefix>:invalidate`, so that
  every replica's in-process layer (layered.py) drops its copies too.
- Each invalidation first increments a generation key per tag (`{<prefix>:cache:<backend>}:gen:<tag>`). A fill
  reads its tags' generations before asking the backend (`mark`, one `MGET`, on the miss path
  only) and its store is a script that writes only if they are unchanged: an answer fetched
  before an invalidation, on any replica, is never stored after it. Lookups stay one `MGET`.

Every key of one backend carries the same hash tag (keys.py `backend_slot`): a lookup's
`MGET`, a store's script and an invalidation's pipeline each stay in one slot, which is what
Redis Cluster needs; an invalidation of several backends' tags is split per backend. The
"flush everything" generation is kept per backend for the same reason. On Cluster the
invalidation channel is sharded (SPUBLISH/SSUBSCRIBE).

Failure is never the request's problem: any Redis error or a command slower than `timeout`
raises `StoreUnavailable` (the caller bypasses the cache), counts a metric, logs at most one
warning per `_WARN_EVERY` seconds, and keeps the store out of the way for `retry_seconds`
so that an outage costs requests nothing. redis-py reconnects on the next command after that;
the subscriber loop reconnects on its own with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import orjson

from gateway.cache.entry import Entry, StoreUnavailable
from gateway.cache.keys import backend_of_tag, backend_slot, backend_tag
from gateway.observability import metrics
from gateway.redis_client.clients import FAILURES, brief, client_for, publish, warm_up
from gateway.redis_client.plan import RedisPlan
from gateway.redis_client.pubsub import close_subscription, subscribe_forever

log = logging.getLogger("gateway.cache.redis")

T = TypeVar("T")
_PLAIN, _ZLIB = b"j", b"z"
_WARN_EVERY = 30.0
# Compare-and-delete: only the holder of a lock releases it (a lock that expired and was
# taken by another replica is left alone).
_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
# Store unless a generation changed since the fill read it. KEYS: entry, n generation keys,
# tag sets. ARGV: value, keep ms, n, tag-set ttl ms, the n generations read ('' = none yet).
_PUT_IF_UNCHANGED = """
local n = tonumber(ARGV[3])
for i = 1, n do
  if (redis.call('get', KEYS[1 + i]) or '') ~= ARGV[4 + i] then return 0 end
end
redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
for i = 2 + n, #KEYS do
  redis.call('sadd', KEYS[i], KEYS[1])
  redis.call('pexpire', KEYS[i], ARGV[4])
end
return 1
"""
# The generation every tag shares: bumped by a flush of everything.
_ALL = "*"

RemoteDrop = Callable[[Sequence[str] | None], None]
"""Called with the tags another replica (or this one) invalidated; None means everything."""


def encode_value(encoded: bytes, compress_above: int) -> bytes:
    if len(encoded) > compress_above:
        return _ZLIB + zlib.compress(encoded, 6)
    return _PLAIN + encoded


def decode_value(raw: bytes) -> tuple[Entry, int]:
    """The entry and its uncompressed size."""
    tag, payload = raw[:1], raw[1:]
    if tag == _ZLIB:
        payload = zlib.decompress(payload)
    elif tag != _PLAIN:
        raise ValueError(f"unknown cache value format {tag!r}")
    return Entry.decode(payload), len(payload)


class RedisStore:
    shared = True

    def __init__(
        self,
        plan: RedisPlan,
        *,
        prefix: str,
        timeout_ms: int,
        retry_seconds: float,
        compress_above: int,
        tag_ttl_ms: int,
    ) -> None:
        self.plan = plan
        self.shown = plan.describe()  # for logs: never the password
        self.prefix = prefix
        self.channel = f"{prefix}:invalidate"
        self.timeout = timeout_ms / 1000
        self.retry_seconds = retry_seconds
        self.compress_above = compress_above
        self.tag_ttl_ms = tag_ttl_ms
        # No retries: a retry would only make the request wait longer.
        self.client = client_for(plan, timeout=self.timeout, connect_timeout=self.timeout)
        # The subscriber waits for messages indefinitely: no read timeout, keep-alives on.
        self._sub_client = client_for(plan, timeout=None, connect_timeout=max(self.timeout, 1.0), keepalive=True)
        self._unlock = self.client.register_script(_UNLOCK)
        self._put_if_unchanged = self.client.register_script(_PUT_IF_UNCHANGED)
        # This process's view of invalidations (its own and those heard on the channel), for
        # in-process fetch coalescing (`generation`); the shared truth is the gen keys.
        self._local_generations: dict[str, int] = {}
        self._local_epoch = 0
        self._down_until = 0.0
        self._warned_at = float("-inf")
        self._listener: asyncio.Task[None] | None = None
        self._warming: asyncio.Task[None] | None = None
        self.on_remote_drop: RemoteDrop | None = None
        self.on_resync: Callable[[], None] | None = None

    # -- failure handling -------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    async def _run(self, operation: str, work: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        if not self.available:
            raise StoreUnavailable(
                f"redis at {self.shown}: waiting {self.retry_seconds:g}s after a failure"
            )
        try:
            async with asyncio.timeout(timeout or self.timeout):
                return await work()
        except (*FAILURES, TimeoutError) as exc:
            self._down_until = time.monotonic() + self.retry_seconds
            metrics.CACHE_STORE_ERRORS.labels("redis", operation).inc()
            self._warn(
                f"redis cache at {self.shown} failed ({operation}: "
                f"{type(exc).__name__}: {brief(exc) if str(exc) else 'timeout'}); requests bypass the cache"
            )
            raise StoreUnavailable(str(exc)) from None

    def _warn(self, text: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY:
            self._warned_at = now
            log.warning(text)

    # -- entries ----------------------------------------------------------------------------

    def _slot(self, tag: str) -> str:
        return backend_slot(self.prefix, backend_of_tag(tag))

    def _tag_key(self, tag: str) -> str:
        return f"{self._slot(tag)}:tag:{tag}"

    def _gen_key(self, tag: str) -> str:
        return f"{self._slot(tag)}:gen:{tag}"

    def _all_gen_key(self, backend: str) -> str:
        return f"{backend_slot(self.prefix, backend)}:gen:{_ALL}"

    def _gen_keys(self, tags: Sequence[str]) -> list[str]:
        """The generations a fill of `tags` (all of one backend) depends on: the backend's
        flush-everything one, then one per tag."""
        if not tags:
            return []
        return [self._all_gen_key(backend_of_tag(tags[0])), *(self._gen_key(t) for t in tags)]

    def generation(self, tags: Sequence[str]) -> tuple[int, ...]:
        return (self._local_epoch, *(self._local_generations.get(t, 0) for t in tags))

    def _bump_local(self, tags: Sequence[str] | None) -> None:
        if tags is None:
            self._local_epoch += 1
            return
        if len(self._local_generations) >= 100_000:
            self._local_generations.clear()  # bounded, as in memory.py: the epoch changes instead
            self._local_epoch += 1
        for tag in tags:
            self._local_generations[tag] = self._local_generations.get(tag, 0) + 1

    async def mark(self, tags: Sequence[str]) -> tuple[str, ...]:
        """The shared generations of `tags` now ('' where none was ever bumped)."""
        gen_keys = self._gen_keys(tags)
        if not gen_keys:
            return ()
        found = await self._run("mark", lambda: self.client.mget(gen_keys))
        return tuple(v.decode() if v is not None else "" for v in found)

    async def get_sized(self, keys: Sequence[str]) -> list[tuple[Entry, int] | None]:
        raw = await self._run("get", lambda: self.client.mget(list(keys)))
        out: list[tuple[Entry, int] | None] = []
        for value in raw:
            if value is None:
                out.append(None)
                continue
            try:
                out.append(decode_value(value))
            except (ValueError, KeyError, TypeError, zlib.error):
                # Written by another version, or damaged: a miss, never an error.
                out.append(None)
        return out

    def peek(self, keys: Sequence[str]) -> None:
        return None  # every answer is a round trip

    async def get(self, keys: Sequence[str]) -> list[Entry | None]:
        return [found[0] if found else None for found in await self.get_sized(keys)]

    async def put(
        self, key: str, entry: Entry, encoded: bytes, tags: Sequence[str], keep_ms: int, since: Any = None
    ) -> bool:
        """Store the entry; with `since` (from `mark`), only if no tag was invalidated since."""
        value = encode_value(encoded, self.compress_above)
        if since is not None:
            gen_keys = self._gen_keys(tags)
            keys = [key, *gen_keys, *(self._tag_key(t) for t in tags)]
            args = [value, keep_ms, len(gen_keys), self.tag_ttl_ms, *since]
            return bool(await self._run("put", lambda: self._put_if_unchanged(keys=keys, args=args)))

        async def work() -> Any:
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, value, px=keep_ms)
            for tag in tags:
                tag_key = self._tag_key(tag)
                pipe.sadd(tag_key, key)
                pipe.pexpire(tag_key, self.tag_ttl_ms)
            return await pipe.execute()

        await self._run("put", work)
        return True

    async def drop(self, tags: Sequence[str]) -> int:
        self._bump_local(tags)
        by_backend: dict[str, list[str]] = {}
        for tag in tags:
            by_backend.setdefault(backend_of_tag(tag), []).append(tag)

        async def work() -> int:
            pipe = self.client.pipeline(transaction=False)
            # Generations first: a fill that read them before this point will not store, and
            # anything it stored before is among the members deleted below.
            for tag in tags:
                pipe.incr(self._gen_key(tag))
                pipe.pexpire(self._gen_key(tag), self.tag_ttl_ms)
            for tag in tags:
                pipe.smembers(self._tag_key(tag))
            found = (await pipe.execute())[2 * len(tags):]
            members: dict[str, set[bytes]] = {}
            for tag, keys in zip(tags, found, strict=True):
                members.setdefault(backend_of_tag(tag), set()).update(keys)
            pipe = self.client.pipeline(transaction=False)
            # One UNLINK per backend: each stays in its backend's slot.
            removing = [b for b in by_backend if members.get(b)]
            for backend in removing:
                pipe.unlink(*members[backend])
            for backend, group in by_backend.items():
                pipe.unlink(*(self._tag_key(t) for t in group))
            results = await pipe.execute()
            await publish(self.client, self.channel, orjson.dumps({"tags": list(tags)}))
            return sum(int(r) for r in results[:len(removing)])

        return await self._run("drop", work)

    async def flush(self, backend: str | None = None, known_backends: Sequence[str] = ()) -> int:
        """The operator path: every entry (of one backend), found by key pattern as well as by
        tag, so that nothing survives a lost tag set. Flushing everything bumps the generation
        of every backend found in the keyspace and of every one in `known_backends` (the
        configured fleet), so that no fill in flight stores an answer from before the flush."""
        pattern = f"{backend_slot(self.prefix, backend)}:*" if backend else "{" + f"{self.prefix}:cache:*"

        async def work() -> int:
            removed = 0
            seen: set[str] = set()
            batch: dict[str, list[bytes]] = {}
            async for key in self.client.scan_iter(match=pattern, count=1000):
                slot = key[:key.index(b"}") + 1].decode() if b"}" in key else ""
                seen.add(slot)
                if key.startswith(f"{slot}:gen:".encode()):
                    continue  # generations only ever grow: a fill in flight compares against them
                group = batch.setdefault(slot, [])
                group.append(key)
                if len(group) >= 1000:
                    removed += await self.client.unlink(*group)
                    group.clear()
            for group in batch.values():
                if group:
                    removed += await self.client.unlink(*group)
            if backend:
                await self.client.incr(self._all_gen_key(backend))
                payload: dict[str, Any] = {"tags": [backend_tag(backend)]}
            else:
                slots = seen | {backend_slot(self.prefix, b) for b in known_backends}
                for slot in sorted(s for s in slots if s):
                    await self.client.incr(f"{slot}:gen:{_ALL}")
                payload = {"all": True}
            await publish(self.client, self.channel, orjson.dumps(payload))
            return removed

        # A flush walks the keyspace: it gets more time than a lookup.
        return await self._run("flush", work, timeout=max(self.timeout, 30.0))

    # -- cross-replica fetch locks ------------------------------------------------------------

    async def lock(self, key: str, ttl_ms: int) -> str | None:
        token = secrets.token_hex(8)
        taken = await self._run("lock", lambda: self.client.set(key, token, nx=True, px=ttl_ms))
        return token if taken else None

    async def unlock(self, key: str, token: str) -> None:
        await self._run("unlock", lambda: self._unlock(keys=[key], args=[token]))

    async def locked(self, key: str) -> bool:
        return bool(await self._run("locked", lambda: self.client.exists(key)))

    # -- invalidation subscriber ---------------------------------------------------------------

    async def start(self) -> None:
        self._warming = asyncio.create_task(warm_up(self.client), name="cache-redis-warm-up")
        self._listener = asyncio.create_task(self._listen(), name="cache-invalidations")

    async def _listen(self) -> None:
        def on_subscribed(after_loss: bool) -> None:
            # Invalidations published while we were not listening are lost: whatever the local
            # layer holds may be stale, so it starts empty.
            self._bump_local(None)
            if self.on_resync is not None:
                self.on_resync()

        def on_error(exc: BaseException) -> None:
            metrics.CACHE_STORE_ERRORS.labels("redis", "subscribe").inc()
            self._warn(
                f"redis cache at {self.shown}: invalidation channel lost "
                f"({type(exc).__name__}: {brief(exc)}); reconnecting"
            )

        await subscribe_forever(self._sub_client, self.channel, on_message=self._received,
                                on_subscribed=on_subscribed, on_error=on_error)

    def _received(self, data: Any) -> None:
        try:
            payload = orjson.loads(data)
        except (orjson.JSONDecodeError, TypeError):
            return
        tags: list[str] | None
        if isinstance(payload, dict) and payload.get("all"):
            tags = None
        elif isinstance(payload, dict) and isinstance(payload.get("tags"), list):
            tags = [t for t in payload["tags"] if isinstance(t, str)]
        else:
            return
        self._bump_local(tags)
        if self.on_remote_drop is not None:
            self.on_remote_drop(tags)

    async def aclose(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warming
        await close_subscription(self._listener, self.client, self._sub_client)
