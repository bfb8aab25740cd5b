"""What legacy client sessions share between replicas, in Redis: the state that changes
after `initialize`, the session's liveness, the per-principal shares, and an event channel.

The immutable part of a session is sealed into its id (sealed.py). What a client changes
later cannot live in an immutable id (re-issuing one is no option: a legacy client keeps the
`Mcp-Session-Id` of its InitializeResult for the life of the session, L-TR §Session
Management 2), so it lives here, keyed by a random key sealed inside the id:

    <prefix>:legacy:s:{<key>}        hash: p (principal binding), lvl (log level),
                                     g (the replica holding the session's GET stream)
    <prefix>:legacy:s:{<key>}:subs   set: the URIs of `resources/subscribe`
    <prefix>:legacy:p:<binding>      sorted set: an authenticated principal's sessions by last use
    <prefix>:legacy:all              sorted set: every session by last use (the fleet's bound)
    <prefix>:legacy:events           channel: a session's level, subscriptions, GET stream or end
                                     changed on some replica

Both session keys expire after `legacy_session_idle_seconds` without a request (the replica
holding a stream of the session renews them): existence is liveness, so DELETE, expiry and
eviction reach every replica at once. A session's two keys share a hash tag, so they stay in
one Cluster slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.redis_pubsub import close_subscription, subscribe_forever

log = logging.getLogger("gateway.legacy_clients.shared")

Event = dict[str, Any]

# Compare-and-delete of the GET stream holder: a replica whose stream ended must not clear a
# successor's claim. One key: fine on Cluster.
_RELEASE_STREAM = """
if redis.call('HGET', KEYS[1], 'g') == ARGV[1] then redis.call('HDEL', KEYS[1], 'g') end
return 0
"""


class SharedUnavailable(Exception):
    """Redis could not be asked; the caller decides how to go on without it."""


@dataclass
class LiveState:
    """A session's shared state as one request finds it."""

    log_level: str | None
    subscriptions: set[str] = field(default_factory=set)
    stream_holder: str | None = None


# A request's read of its session: the state, the idle clock of both keys restarted, in one
# command (both keys share a hash tag: one Cluster slot). An ended session reads as nil.
_TOUCH = """
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {fields, redis.call('SMEMBERS', KEYS[2])}
"""


class SharedSessions:
    def __init__(self, url: str, *, prefix: str, idle_seconds: float, replica_id: str,
                 timeout_seconds: float = 0.5) -> None:
        import redis.asyncio as redis  # a gateway without Redis never imports it

        from gateway.cache.redis import redacted

        self._errors = (redis.RedisError, OSError, TimeoutError)
        self._shown_url = redacted(url)
        self.prefix = f"{prefix}:legacy"
        self.channel = f"{self.prefix}:events"
        self.idle_ms = max(1, int(idle_seconds * 1000))
        self.replica_id = replica_id
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_seconds,
                                            socket_connect_timeout=timeout_seconds)
        # The subscriber idles as long as nothing changes: no read timeout.
        self._sub_client = redis.Redis.from_url(url, socket_connect_timeout=timeout_seconds)
        self._release_stream = self._client.register_script(_RELEASE_STREAM)
        self._touch = self._client.register_script(_TOUCH)
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._warned = False

    # -- keys ---------------------------------------------------------------------------------

    def _session_keys(self, key: str) -> tuple[str, str]:
        base = f"{self.prefix}:s:{{{key}}}"
        return base, f"{base}:subs"

    def _principal_set(self, binding: str) -> str:
        return f"{self.prefix}:p:{binding}"

    @property
    def _all(self) -> str:
        return f"{self.prefix}:all"

    # -- health ---------------------------------------------------------------------------------

    def _trouble(self, what: str, exc: BaseException) -> SharedUnavailable:
        if not self._warned:
            log.warning("redis %s: %s failed (%s); legacy client sessions are served from each replica's own "
                        "knowledge until it is back", self._shown_url, what, exc)
            self._warned = True
        return SharedUnavailable(str(exc))

    def _ok(self) -> None:
        if self._warned:
            log.info("redis %s reachable again for legacy client sessions", self._shown_url)
            self._warned = False

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, on_event: Callable[[Event], Awaitable[None]],
                    on_resync: Callable[[], Awaitable[None]]) -> None:
        async def on_message(data: Any) -> None:
            try:
                event = orjson.loads(data)
            except (orjson.JSONDecodeError, TypeError):
                event = None
            if isinstance(event, dict) and isinstance(event.get("k"), str):
                await on_event(event)
            else:
                log.warning("malformed event on %s dropped", self.channel)

        async def on_subscribed(after_loss: bool) -> None:
            self._subscribed.set()
            if after_loss:
                await on_resync()  # pub/sub kept nothing while we were away

        def on_error(exc: BaseException) -> None:
            self._subscribed.clear()
            self._trouble("subscribe", exc)

        self._listener = asyncio.create_task(
            subscribe_forever(self._sub_client, self.channel, on_message=on_message,
                              on_subscribed=on_subscribed, on_error=on_error),
            name="legacy-sessions-subscriber")
        # Events published right after start-up are heard; a Redis that is down does not hold
        # the start back.
        try:
            await asyncio.wait_for(self._subscribed.wait(), 2.0)
        except TimeoutError:
            pass

    async def aclose(self) -> None:
        await close_subscription(self._listener, self._client, self._sub_client)

    async def _publish(self, event: Event) -> None:
        try:
            await self._client.publish(self.channel, orjson.dumps(event))
        except self._errors as exc:
            self._trouble("publish", exc)

    # -- sessions ---------------------------------------------------------------------------------

    async def create(self, key: str, binding: str, *, counted: bool, per_principal: int, total: int) -> None:
        """Record a new session, then end the least recently used ones past the principal's
        share (only its own) and past the fleet's bound."""
        base, _ = self._session_keys(key)
        now = time.time()
        horizon = now - self.idle_ms / 1000
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(base, mapping={"p": binding})
                pipe.pexpire(base, self.idle_ms)
                pipe.zadd(self._all, {key: now})
                pipe.zremrangebyscore(self._all, "-inf", horizon)
                pipe.zcard(self._all)
                if counted:
                    own = self._principal_set(binding)
                    pipe.zadd(own, {key: now})
                    pipe.zremrangebyscore(own, "-inf", horizon)
                    pipe.pexpire(own, self.idle_ms)
                    pipe.zcard(own)
                results = await pipe.execute()
        except self._errors as exc:
            raise self._trouble("recording a session", exc) from None
        self._ok()
        if counted and results[-1] > per_principal:
            oldest = await self._oldest(self._principal_set(binding), results[-1] - per_principal, key)
            if oldest:
                log.warning("legacy sessions per principal (%d) reached: ending that principal's least recently "
                            "used session", per_principal)
            for victim in oldest:
                await self.end(victim)
        if results[4] > total:
            oldest = await self._oldest(self._all, results[4] - total, key)
            if oldest:
                log.warning("legacy session limit (%d) reached: ending least recently used session", total)
            for victim in oldest:
                await self.end(victim)

    async def _oldest(self, zset: str, count: int, spare: str) -> list[str]:
        try:
            members = await self._client.zrange(zset, 0, count)
        except self._errors as exc:
            self._trouble("eviction", exc)
            return []
        return [m.decode() for m in members if m.decode() != spare][:count]

    async def touch(self, key: str, binding: str) -> LiveState | None:
        """The session's state, its idle clock restarted and its place in the
        least-recently-used orders moved up; None when it has ended (deleted, expired,
        evicted) anywhere in the fleet. One round trip. Raises SharedUnavailable."""
        base, subs = self._session_keys(key)
        now = time.time()
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                await self._touch(keys=[base, subs], args=[self.idle_ms], client=pipe)
                pipe.zadd(self._all, {key: now}, xx=True)
                pipe.zadd(self._principal_set(binding), {key: now}, xx=True)
                found, *_ = await pipe.execute()
        except self._errors as exc:
            raise self._trouble("reading a session", exc) from None
        self._ok()
        if not found:
            await self._forget(key, binding)
            return None
        flat, members = found
        fields = dict(zip(flat[::2], flat[1::2]))
        level = fields.get(b"lvl", b"").decode() or None
        holder = fields.get(b"g", b"").decode() or None
        return LiveState(level, {m.decode() for m in members}, holder)

    async def _forget(self, key: str, binding: str | None) -> None:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zrem(self._all, key)
                if binding:
                    pipe.zrem(self._principal_set(binding), key)
                await pipe.execute()
        except self._errors as exc:
            self._trouble("forgetting a session", exc)

    async def end(self, key: str) -> None:
        """End the session fleet-wide: every replica hears it and closes what it holds."""
        base, subs = self._session_keys(key)
        try:
            binding = await self._client.hget(base, "p")
            await self._client.delete(base, subs)
        except self._errors as exc:
            self._trouble("ending a session", exc)
            binding = None
        await self._forget(key, binding.decode() if binding else None)
        await self._publish({"e": "end", "k": key})

    async def set_log_level(self, key: str, level: str) -> None:
        base, _ = self._session_keys(key)
        try:
            await self._client.hset(base, "lvl", level)
        except self._errors as exc:
            self._trouble("storing a log level", exc)
            return
        await self._publish({"e": "level", "k": key, "lvl": level})

    async def update_subscription(self, key: str, uri: str, *, subscribe: bool) -> None:
        _, subs = self._session_keys(key)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                (pipe.sadd if subscribe else pipe.srem)(subs, uri)
                pipe.pexpire(subs, self.idle_ms)
                changed, _ = await pipe.execute()
        except self._errors as exc:
            self._trouble("storing a subscription", exc)
            return
        if changed:
            await self._publish({"e": "subs", "k": key})

    async def subscriptions(self, key: str) -> set[str] | None:
        _, subs = self._session_keys(key)
        try:
            return {m.decode() for m in await self._client.smembers(subs)}
        except self._errors as exc:
            self._trouble("reading subscriptions", exc)
            return None

    async def claim_stream(self, key: str) -> None:
        """This replica now holds the session's GET stream: any other stops its own."""
        base, _ = self._session_keys(key)
        try:
            await self._client.hset(base, "g", self.replica_id)
        except self._errors as exc:
            self._trouble("claiming a stream", exc)
        await self._publish({"e": "stream", "k": key, "r": self.replica_id})

    async def release_stream(self, key: str) -> None:
        base, _ = self._session_keys(key)
        try:
            await self._release_stream(keys=[base], args=[self.replica_id])
        except self._errors as exc:
            self._trouble("releasing a stream", exc)
