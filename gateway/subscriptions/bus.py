"""The bus between upstream listens and client streams, and the election of who holds each
upstream listen.

Every upstream event (a backend's ack, a notification, a gap after a reconnect) is published
on the bus, and every replica's hub receives it: it invalidates its cache and fans the event
out to its own clients of that stream. Exactly one replica holds each upstream listen: the
one holding that stream's lease.

- `LocalBus`: one replica, no Redis. Publishing is a direct call; this replica always holds.
- `RedisBus`: one pub/sub channel for all listen events of the fleet, and per stream a lease
  (`SET NX PX`, renewed by its holder with a compare-and-set script), the holder's latest
  upstream ack (so replicas that join later can acknowledge their clients), and a sorted set
  of the replicas that still want the stream (so a holder whose own clients left keeps the
  upstream open for the others instead of forcing a handover). A stream's three keys share a
  Redis Cluster hash tag, so the lease scripts stay in one slot; on Cluster the channel is
  sharded (SPUBLISH/SSUBSCRIBE). Any shape of Redis works (gateway/redis_client).

Redis trouble never stops notifications: a replica that cannot reach Redis holds its own
upstream listens and delivers locally (each replica works alone until Redis is back), and
when its subscription to the channel is restored it tells its clients they may have missed
changes (`on_resync`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway.redis_client.pubsub import close_subscription, subscribe_forever

if TYPE_CHECKING:
    from gateway.redis_client.plan import RedisPlan

log = logging.getLogger("gateway.subscriptions.bus")

Event = dict[str, Any]
Handler = Callable[[Event], Awaitable[None]]
Resync = Callable[[], Awaitable[None]]


class Bus(Protocol):
    # How often holders renew and followers look for a free lease.
    tick_seconds: float

    async def start(self, handler: Handler, on_resync: Resync) -> None: ...

    async def publish(self, event: Event) -> None: ...

    async def acquire(self, stream: str) -> bool: ...

    async def renew(self, stream: str, ack: Event | None) -> bool: ...

    async def release(self, stream: str) -> None: ...

    async def read_ack(self, stream: str) -> Event | None: ...

    async def want(self, stream: str) -> None: ...

    async def unwant(self, stream: str) -> None: ...

    async def others_want(self, stream: str) -> bool: ...

    async def aclose(self) -> None: ...


class LocalBus:
    """A single replica: every stream is held here and events go straight to the hub."""

    def __init__(self, tick_seconds: float = 0.25) -> None:
        self.tick_seconds = tick_seconds
        self._handler: Handler | None = None

    async def start(self, handler: Handler, on_resync: Resync) -> None:
        self._handler = handler

    async def publish(self, event: Event) -> None:
        assert self._handler is not None, "bus not started"
        await self._handler(event)

    async def acquire(self, stream: str) -> bool:
        return True

    async def renew(self, stream: str, ack: Event | None) -> bool:
        return True

    async def release(self, stream: str) -> None:
        return None

    async def read_ack(self, stream: str) -> Event | None:
        return None

    async def want(self, stream: str) -> None:
        return None

    async def unwant(self, stream: str) -> None:
        return None

    async def others_want(self, stream: str) -> bool:
        return False

    async def aclose(self) -> None:
        return None


# Take or keep the lease: ours already, or free. Stores the holder's ack beside it.
_RENEW = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] or not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2]) end
  return 1
end
return 0
"""
# Give the lease up only if it is still ours (a late release must not free a successor's).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
end
return 0
"""


class RedisBus:
    def __init__(self, plan: RedisPlan, *, prefix: str, lease_seconds: float, timeout_seconds: float = 1.0,
                 replica_id: str | None = None) -> None:
        # Imported here: a gateway without Redis never needs redis-py.
        from gateway.redis_client.clients import FAILURES, brief, client_for, publish, slot_tag, warm_up

        self._redis_errors = FAILURES
        self._publish, self._slot_tag, self._brief, self._warm_up = publish, slot_tag, brief, warm_up
        self.plan = plan
        # For logs: the plan without its credentials.
        self._shown_url = plan.describe()
        self.prefix = f"{prefix}:listen"
        self.channel = f"{self.prefix}:events"
        self.lease_ms = max(1, int(lease_seconds * 1000))
        # Renew three times per lease: one lost renewal does not lose the lease.
        self.tick_seconds = lease_seconds / 3
        self.replica_id = replica_id or f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"
        # A retry or two within the timeout: a failover's first refused connection is followed
        # by the promoted master (Sentinel) or a fresh slot map (Cluster).
        self._client = client_for(plan, timeout=timeout_seconds, connect_timeout=timeout_seconds, retries=2)
        # The subscriber connection idles for as long as nothing changes: no read timeout.
        self._sub_client = client_for(plan, timeout=None, connect_timeout=timeout_seconds, keepalive=True)
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        self._handler: Handler | None = None
        self._on_resync: Resync | None = None
        self._listener: asyncio.Task[None] | None = None
        self._warming: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._warned = False
        # Streams held here only because their lease could not be read or written. On Cluster
        # the lease's slot may be on a lost master while the channel's is not: every replica
        # then holds the stream, and if each published to the bus every client would hear each
        # event once per replica. Their events are delivered locally instead, as in an outage.
        self._held_alone: set[str] = set()

    def _keys(self, stream: str) -> tuple[str, str, str]:
        base = self._slot_tag(f"{self.prefix}:{stream}")
        return f"{base}:holder", f"{base}:ack", f"{base}:want"

    def _trouble(self, what: str, exc: BaseException) -> None:
        # One warning per outage, not one per stream per tick.
        if not self._warned:
            log.warning("redis %s: %s failed (%s); listen streams work per replica until it is back",
                        self._shown_url, what, self._brief(exc))
            self._warned = True

    def _ok(self) -> None:
        if self._warned:
            log.info("redis %s reachable again", self._shown_url)
            self._warned = False

    async def start(self, handler: Handler, on_resync: Resync) -> None:
        self._handler, self._on_resync = handler, on_resync
        self._warming = asyncio.create_task(self._warm_up(self._client), name="listen-bus-warm-up")
        self._listener = asyncio.create_task(self._listen(), name="listen-bus-subscriber")
        # Give the subscription a moment so that events published right after start-up are
        # heard; a Redis that is down does not hold start-up back.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), 2.0)

    async def _listen(self) -> None:
        assert self._handler is not None and self._on_resync is not None
        handler, on_resync = self._handler, self._on_resync

        async def on_message(data: Any) -> None:
            try:
                event = orjson.loads(data)
            except (orjson.JSONDecodeError, TypeError):
                log.warning("malformed event on %s dropped", self.channel)
                return
            if not isinstance(event, dict):
                log.warning("event on %s is not an object; dropped", self.channel)
                return
            await handler(event)

        async def on_subscribed(after_loss: bool) -> None:
            self._subscribed.set()
            if after_loss:
                # Events published while we were away are gone (pub/sub keeps nothing).
                await on_resync()

        def on_error(exc: BaseException) -> None:
            self._subscribed.clear()
            self._trouble("subscribe", exc)

        await subscribe_forever(self._sub_client, self.channel, on_message=on_message, on_subscribed=on_subscribed,
                                on_error=on_error)

    async def publish(self, event: Event) -> None:
        assert self._handler is not None, "bus not started"
        if self._subscribed.is_set() and event.get("k") not in self._held_alone:
            try:
                await self._publish(self._client, self.channel, orjson.dumps(event))
                self._ok()
                return
            except self._redis_errors as exc:
                self._trouble("publish", exc)
        # Not connected: this replica's clients still hear it.
        await self._handler(event)

    async def acquire(self, stream: str) -> bool:
        holder, _, _ = self._keys(stream)
        try:
            taken = await self._client.set(holder, self.replica_id, nx=True, px=self.lease_ms)
        except self._redis_errors as exc:
            self._trouble("lease", exc)
            self._held_alone.add(stream)
            return True  # nobody can coordinate: hold it here
        self._ok()
        self._held_alone.discard(stream)
        return bool(taken)

    async def renew(self, stream: str, ack: Event | None) -> bool:
        holder, ack_key, _ = self._keys(stream)
        try:
            kept = await self._renew(keys=[holder, ack_key],
                                     args=[self.replica_id, self.lease_ms, orjson.dumps(ack) if ack else b""])
        except self._redis_errors as exc:
            self._trouble("lease renewal", exc)
            self._held_alone.add(stream)
            return True
        self._ok()
        self._held_alone.discard(stream)
        return bool(kept)

    async def release(self, stream: str) -> None:
        self._held_alone.discard(stream)
        holder, ack_key, _ = self._keys(stream)
        with contextlib.suppress(*self._redis_errors):
            await self._release(keys=[holder, ack_key], args=[self.replica_id])

    async def read_ack(self, stream: str) -> Event | None:
        _, ack_key, _ = self._keys(stream)
        try:
            raw = await self._client.get(ack_key)
        except self._redis_errors as exc:
            self._trouble("read", exc)
            return None
        # Another version's or a damaged value reads as "no ack yet": raising here would end the
        # follower's stream task for good (upstream.py `_run`), its clients left attached to it.
        try:
            ack = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return None
        return ack if isinstance(ack, dict) else None

    async def want(self, stream: str) -> None:
        _, _, want = self._keys(stream)
        now = time.time()
        with contextlib.suppress(*self._redis_errors):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zadd(want, {self.replica_id: now + self.lease_ms / 1000})
                pipe.zremrangebyscore(want, "-inf", now)
                pipe.pexpire(want, self.lease_ms * 2)
                await pipe.execute()

    async def unwant(self, stream: str) -> None:
        _, _, want = self._keys(stream)
        with contextlib.suppress(*self._redis_errors):
            await self._client.zrem(want, self.replica_id)

    async def others_want(self, stream: str) -> bool:
        _, _, want = self._keys(stream)
        try:
            members = await self._client.zrangebyscore(want, time.time(), "+inf")
        except self._redis_errors:
            return False
        return any(m.decode() != self.replica_id for m in members)

    async def aclose(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warming
        await close_subscription(self._listener, self._client, self._sub_client)
