"""The Redis bus against a real redis-server: events reach every replica, one replica holds a
stream's lease, the lease passes on when its holder stops renewing, and a Redis outage
leaves each replica working alone."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.subscriptions.bus import LocalBus, RedisBus
from tests.support.redis_shapes import plan_for


async def _never() -> None:
    return None


class Replica:
    def __init__(self, url: str, name: str, lease: float = 0.6) -> None:
        self.bus = RedisBus(plan_for(url), prefix="test", lease_seconds=lease, replica_id=name)
        self.events: list[dict] = []
        self.resyncs = 0

    async def start(self) -> Replica:
        async def handler(event: dict) -> None:
            self.events.append(event)

        async def resync() -> None:
            self.resyncs += 1

        await self.bus.start(handler, resync)
        return self


async def eventually(predicate, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(wait(), timeout)


async def test_events_reach_every_replica(redis_server):
    a, b = await Replica(redis_server.url, "a").start(), await Replica(redis_server.url, "b").start()
    try:
        await a.bus.publish({"t": "event", "k": "s1", "m": {"method": "x"}})
        await eventually(lambda: a.events and b.events)
        assert a.events == b.events == [{"t": "event", "k": "s1", "m": {"method": "x"}}]
    finally:
        await a.bus.aclose()
        await b.bus.aclose()


async def test_one_holder_per_stream_and_takeover_after_the_lease(redis_server):
    a, b = await Replica(redis_server.url, "a").start(), await Replica(redis_server.url, "b").start()
    try:
        assert await a.bus.acquire("s1") is True
        assert await b.bus.acquire("s1") is False
        # Renewal keeps it and stores the ack for followers.
        assert await a.bus.renew("s1", {"f": {"toolsListChanged": True}}) is True
        assert await b.bus.renew("s1", None) is False
        assert await b.bus.read_ack("s1") == {"f": {"toolsListChanged": True}}
        # A release by a non-holder frees nothing.
        await b.bus.release("s1")
        assert await b.bus.acquire("s1") is False
        # The holder stops renewing (it died): the lease expires and b takes over.
        deadline = asyncio.get_running_loop().time() + 10
        while not await b.bus.acquire("s1"):
            assert asyncio.get_running_loop().time() < deadline, "lease never expired"
            await asyncio.sleep(0.05)
        assert await a.bus.renew("s1", None) is False  # a learns it lost the stream
        # A voluntary release frees the lease at once.
        await b.bus.release("s1")
        assert await a.bus.acquire("s1") is True
    finally:
        await a.bus.aclose()
        await b.bus.aclose()


async def test_interest_of_other_replicas(redis_server):
    a, b = await Replica(redis_server.url, "a").start(), await Replica(redis_server.url, "b").start()
    try:
        assert await a.bus.others_want("s1") is False
        await b.bus.want("s1")
        assert await a.bus.others_want("s1") is True
        assert await b.bus.others_want("s1") is False  # its own interest does not count
        await b.bus.unwant("s1")
        assert await a.bus.others_want("s1") is False
    finally:
        await a.bus.aclose()
        await b.bus.aclose()


async def test_redis_outage_leaves_each_replica_working_alone(redis_server):
    a = await Replica(redis_server.url, "a").start()
    try:
        redis_server.kill()
        # Holding and renewing succeed locally; events still reach this replica's clients.
        assert await a.bus.acquire("s1") is True
        assert await a.bus.renew("s1", None) is True
        # A follower's questions have the answers that keep it going: no stored ack, nobody
        # else waiting on the stream; its own interest is simply not recorded.
        assert await a.bus.read_ack("s1") is None
        assert await a.bus.others_want("s1") is False
        await a.bus.want("s1")
        await a.bus.unwant("s1")
        await eventually(lambda: not a.bus._subscribed.is_set())
        await a.bus.publish({"t": "event", "k": "s1"})
        assert a.events == [{"t": "event", "k": "s1"}]
        # Redis comes back: the subscription is restored and the hub is told to resync.
        redis_server.start()
        await eventually(lambda: a.resyncs == 1, timeout=20)
        await a.bus.publish({"t": "event", "k": "s2"})
        await eventually(lambda: len(a.events) == 2)
    finally:
        await a.bus.aclose()


async def test_a_stream_held_only_because_its_lease_failed_is_delivered_locally(redis_server):
    # On Cluster a stream's lease can be on a lost master while the channel is not: every
    # replica then holds the stream itself. Publishing its events to the bus as well would
    # give every client each event once per replica; they are delivered locally instead.
    # Here an ACL stands in for the lost slot: this user may use pub/sub but not the lease.
    import redis.asyncio as aioredis

    admin = aioredis.from_url(redis_server.url)
    await admin.acl_setuser("gw", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                            commands=["+@all", "-set", "-evalsha", "-eval"])
    url = f"redis://gw:pw@127.0.0.1:{redis_server.port}/0"
    a, b = await Replica(url, "a").start(), await Replica(url, "b").start()
    try:
        assert await a.bus.acquire("s1") is True and await b.bus.acquire("s1") is True
        await a.bus.publish({"t": "event", "k": "s1", "n": 1})
        await b.bus.publish({"t": "event", "k": "s1", "n": 1})
        # Another stream whose lease works as usual still goes over the bus.
        await admin.acl_setuser("gw", commands=["+set", "+evalsha"])
        assert await a.bus.acquire("s2") is True and await b.bus.acquire("s2") is False
        await a.bus.publish({"t": "event", "k": "s2"})
        await eventually(lambda: len(b.events) == 2)
        assert a.events == [{"t": "event", "k": "s1", "n": 1}, {"t": "event", "k": "s2"}]
        assert b.events == a.events
        # The lease works again: s1 is coordinated once more, one holder, events on the bus.
        assert await a.bus.renew("s1", None) is True and await b.bus.renew("s1", None) is False
        await b.bus.release("s1")
        await a.bus.publish({"t": "event", "k": "s1", "n": 2})
        await eventually(lambda: len(b.events) == 3)
        assert a.events[-1] == b.events[-1] == {"t": "event", "k": "s1", "n": 2}
    finally:
        await a.bus.aclose()
        await b.bus.aclose()
        await admin.aclose()


async def test_local_bus_is_a_direct_call():
    bus = LocalBus()
    seen: list[dict] = []

    async def handler(event: dict) -> None:
        seen.append(event)

    await bus.start(handler, _never)
    await bus.publish({"t": "ack"})
    assert seen == [{"t": "ack"}]
    assert await bus.acquire("any") and not await bus.others_want("any")


async def test_a_handler_failure_does_not_end_the_subscription(redis_server):
    # One bad event (or a bug in a handler) must not silence the replica for good.
    import redis.asyncio as aioredis

    from gateway.redis_client.pubsub import subscribe_forever

    client = aioredis.from_url(redis_server.url)
    seen: list[bytes] = []
    subscribed = asyncio.Event()

    def on_message(data):
        if data == b"boom":
            raise ValueError("handler bug")
        seen.append(data)

    task = asyncio.create_task(subscribe_forever(client, "t", on_message=on_message,
                                                 on_subscribed=lambda lost: subscribed.set(),
                                                 on_error=lambda exc: None))
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        for payload in (b"boom", b"after"):
            await client.publish("t", payload)
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == [b"after"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


async def test_events_that_are_not_json_objects_are_dropped_and_the_bus_goes_on(redis_server, caplog):
    import redis.asyncio as aioredis

    a = await Replica(redis_server.url, "a").start()
    publisher = aioredis.from_url(redis_server.url)
    try:
        for junk in (b"not json", b"[1, 2]", b'"event"', b"42"):
            await publisher.publish("test:listen:events", junk)
        await a.bus.publish({"t": "event", "k": "s1"})
        await eventually(lambda: a.events)
        assert a.events == [{"t": "event", "k": "s1"}]
        dropped = [r for r in caplog.records if r.name == "gateway.subscriptions.bus"]
        assert [r.levelname for r in dropped] == ["WARNING"] * 4  # said, not an error
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
    finally:
        await a.bus.aclose()
        await publisher.aclose()


async def test_an_event_redis_will_not_take_still_reaches_this_replica(redis_server):
    # Redis accepts connections but refuses writes for a while (`CLIENT PAUSE … WRITE`: a
    # failover, a stuck primary). The subscription is still up, the publish times out: this
    # replica's own clients must hear the event all the same.
    import redis.asyncio as aioredis

    a = await Replica(redis_server.url, "a").start()
    admin = aioredis.from_url(redis_server.url)
    try:
        await admin.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
        assert a.bus._subscribed.is_set()
        await a.bus.publish({"t": "event", "k": "s1"})
        assert a.events == [{"t": "event", "k": "s1"}]
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
        await a.bus.aclose()


async def test_a_damaged_or_foreign_ack_in_redis_reads_as_no_ack(redis_server):
    # The holder's ack is read by every follower; what another version or a damaged write
    # left there must not break the follower's stream (it would stop following for good).
    import redis.asyncio as aioredis

    a, b = await Replica(redis_server.url, "a").start(), await Replica(redis_server.url, "b").start()
    admin = aioredis.from_url(redis_server.url)
    try:
        assert await a.bus.acquire("s1") and await a.bus.renew("s1", {"f": {"toolsListChanged": True}})
        ack_key = "{test:listen:s1}:ack"
        for foreign in (b"not json", b"[1, 2]", b'"ack"', b"null"):
            await admin.set(ack_key, foreign)
            assert await b.bus.read_ack("s1") is None
        await a.bus.renew("s1", {"f": {"toolsListChanged": True}})
        assert await b.bus.read_ack("s1") == {"f": {"toolsListChanged": True}}
    finally:
        await admin.aclose()
        await a.bus.aclose()
        await b.bus.aclose()
