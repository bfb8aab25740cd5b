"""Two gateway replicas and one real redis-server: one upstream listen for both, a change
seen upstream by one reaches the clients of both, and when the holder dies the other takes
the stream over (its clients are told they may have missed changes, then hear new ones).
The first test runs two gateway processes; the others run two in-process gateways (so they
can look at which replica holds the stream): a holder whose own clients left keeps the
upstream for the other replica's clients, a replica without listeners still drops its cached
lists when the other replica hears a change, after a Redis outage (each replica held its
own upstream meanwhile) the replicas go back to one upstream listen, and a holder that lost
only its own subscription tells the other replica's clients about the gap."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import redis.asyncio as aioredis
import yaml

from tests.integration.test_listen import control
from tests.support import mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.procs import gateway_process, python_server

SUB = "io.modelcontextprotocol/subscriptionId"
TOOLS_CHANGED = "notifications/tools/list_changed"


async def _holds(http: httpx.AsyncClient, gateway) -> bool:
    text = (await http.get(f"http://127.0.0.1:{gateway.port}/metrics")).text
    match = re.search(r'^mcp_gateway_listen_upstreams\{backend="m"\} (\S+)$', text, re.M)
    return match is not None and float(match.group(1)) == 1.0


async def test_two_replicas_share_one_upstream_and_take_over_when_the_holder_dies(tmp_path, redis_server):
    backend = python_server("mutable_modern.py", name="mutable-replicas").start()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url}],
        "subscriptions": {"redis_url": redis_server.url, "lease_seconds": 1.5,
                          "reconnect_initial_seconds": 0.05},
        "observability": {"log_level": "warning"},
    }))
    replicas = [gateway_process(config).start(), gateway_process(config).start()]
    control = f"http://127.0.0.1:{backend.port}"
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"on-{i}").open()
                       for i, gw in enumerate(replicas)]
            for r in readers:
                assert r.ack["params"]["notifications"] == {"toolsListChanged": True}
            stats = (await http.get(f"{control}/stats")).json()
            assert stats["open_listens"] == 1 and stats["listens_total"] == 1

            await http.post(f"{control}/change/tools")
            for r in readers:
                await r.wait_count(2)
                assert r.messages[1] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED,
                                         "params": {"_meta": {SUB: r.id}}}

            holder = 0 if await _holds(http, replicas[0]) else 1
            other = 1 - holder
            assert await _holds(http, replicas[holder]) and not await _holds(http, replicas[other])
            replicas[holder].kill()

            # The survivor takes the stream over; its client is told it may have missed changes.
            survivor = readers[other]
            await survivor.wait_count(3)
            assert survivor.messages[2]["method"] == TOOLS_CHANGED
            assert await _holds(http, replicas[other])
            # ... and hears new changes through its own upstream listen.
            await http.post(f"{control}/change/tools")
            await survivor.wait_count(4)
            assert survivor.messages[3] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED,
                                            "params": {"_meta": {SUB: survivor.id}}}
            await eventually(lambda: _open_listens(http, control, 1))
            for r in readers:
                await r.close()
    finally:
        for gw in replicas:
            gw.stop()
        backend.stop()


async def _open_listens(http: httpx.AsyncClient, control: str, expected: int) -> bool:
    return (await http.get(f"{control}/stats")).json()["open_listens"] == expected


def replicas_config(backend, redis_url: str, **extra: Any) -> dict[str, Any]:
    return {"backends": [{"name": "m", "url": backend.url}],
            "subscriptions": {"redis_url": redis_url, "lease_seconds": 0.6, "linger_seconds": 0.1,
                              "reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.5},
            **extra}


def holds(gw: RunningGateway) -> bool:
    return any(s.holding for s in gw.runtime.hub.upstreams.values())


async def _stats(http: httpx.AsyncClient, backend) -> dict[str, int]:
    return (await http.get(f"{control(backend)}/stats")).json()


async def test_a_holder_whose_clients_left_keeps_the_upstream_for_the_other_replicas_clients(
    mutable_backend, redis_server
):
    config = replicas_config(mutable_backend, redis_server.url)
    async with running_gateway(config) as one, running_gateway(config) as two, \
            httpx.AsyncClient(timeout=30) as http:
        readers = {gw: await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"r{i}").open()
                   for i, gw in enumerate((one, two))}
        await eventually(lambda: holds(one) != holds(two))
        holder, follower = (one, two) if holds(one) else (two, one)
        listens_total = (await _stats(http, mutable_backend))["listens_total"]
        await readers[holder].close()
        [stream] = holder.runtime.hub.upstreams.values()
        await eventually(stream.idle)  # no client left on the holder, its linger is over
        await asyncio.sleep(4 * holder.runtime.hub.bus.tick_seconds)  # renewals while idle
        assert holds(holder) and not holds(follower)
        # The follower's client hears the next change through the same upstream listen,
        # without a handover (which would have told it about a gap first).
        await http.post(f"{control(mutable_backend)}/change/tools")
        reader = readers[follower]
        await reader.wait_count(2)
        assert reader.messages[1:] == [{"jsonrpc": "2.0", "method": TOOLS_CHANGED,
                                        "params": {"_meta": {SUB: reader.id}}}]
        assert (await _stats(http, mutable_backend))["listens_total"] == listens_total
        await reader.close()


async def test_a_replica_without_listeners_still_drops_its_cached_lists_on_a_change(mutable_backend,
                                                                                    redis_server):
    # Each replica has its own memory cache; only replica one has a listening client. The
    # change it hears upstream reaches replica two over the bus, which drops its tools/list.
    config = replicas_config(mutable_backend, redis_server.url, cache={"store": "memory"})
    async with running_gateway(config) as one, running_gateway(config) as two, \
            httpx.AsyncClient(timeout=30) as http:
        reader = await ListenReader(http, one.url, {"toolsListChanged": True}, id="only-on-one").open()
        await mcp_http.post(http, two.url, "tools/list")
        assert (await mcp_http.post(http, two.url, "tools/list")).headers["x-cache"] == "hit"
        assert two.runtime.hub.upstreams == {}
        added = (await http.post(f"{control(mutable_backend)}/change/tools")).json()["added"]
        await reader.wait_count(2)

        async def two_lists_it() -> bool:
            listing = (await mcp_http.post(http, two.url, "tools/list")).json()["result"]["tools"]
            return added in [t["name"] for t in listing]

        await eventually(two_lists_it)
        await reader.close()


async def test_after_a_redis_outage_the_replicas_go_back_to_one_upstream_listen(redis_server):
    # During the outage nobody can coordinate: each replica holds its own upstream listen (no
    # notification is lost). Once Redis is back, one of them must step down again, or every
    # change would reach every client twice, and the backend would carry both listens.
    backend = python_server("mutable_modern.py", name="mutable-outage").start()
    try:
        config = replicas_config(backend, redis_server.url)
        async with running_gateway(config) as one, running_gateway(config) as two, \
                httpx.AsyncClient(timeout=30) as http:
            readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"o{i}").open()
                       for i, gw in enumerate((one, two))]
            await eventually(lambda: holds(one) != holds(two))
            redis_server.kill()
            await eventually(lambda: holds(one) and holds(two))
            await eventually(lambda: _open_listens(http, control(backend), 2))
            redis_server.start()
            await eventually(lambda: holds(one) != holds(two))
            await eventually(lambda: _open_listens(http, control(backend), 1))
            # And it still delivers to both replicas' clients.
            seen = [len(r.messages) for r in readers]
            await http.post(f"{control(backend)}/change/tools")
            for r, n in zip(readers, seen, strict=True):
                await r.wait_count(n + 1)
                assert r.messages[-1]["method"] == TOOLS_CHANGED
            for r in readers:
                await r.close()
    finally:
        backend.stop()


async def test_a_holder_that_lost_only_its_own_subscription_tells_every_replica_about_the_gap(
    mutable_backend, redis_server
):
    # Redis drops the holder's subscriber connection (as it drops a subscriber that fell
    # behind, `client-output-buffer-limit pubsub`) and takes no new connection for a while;
    # everything else stays up. What the holder's upstream delivers meanwhile reaches only the
    # holder's own clients; the other replica never lost its subscription, so only the holder
    # can tell it, once it is subscribed again, that its clients may have missed changes.
    config = replicas_config(mutable_backend, redis_server.url)
    admin = aioredis.from_url(redis_server.url)
    try:
        async with running_gateway(config) as one, httpx.AsyncClient(timeout=30) as http:
            [subscriber] = [c["id"] for c in await admin.client_list() if c["sub"] == "1"]  # one's
            async with running_gateway(config) as two:
                first = await ListenReader(http, one.url, {"toolsListChanged": True}, id="on-holder").open()
                await eventually(lambda: holds(one))
                other = await ListenReader(http, two.url, {"toolsListChanged": True}, id="on-follower").open()
                assert not holds(two)
                await admin.config_set("maxclients", 1)
                await admin.client_kill_filter(_id=subscriber)
                await eventually(lambda: not one.runtime.hub.bus._subscribed.is_set())
                await http.post(f"{control(mutable_backend)}/change/tools")
                await first.wait_count(2)  # the holder's own client hears it
                await admin.config_set("maxclients", 10000)
                await eventually(lambda: one.runtime.hub.bus._subscribed.is_set())
                # The follower's client either heard the change or is told it may have missed one.
                await other.wait_count(2)
                assert other.messages[1] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED,
                                             "params": {"_meta": {SUB: "on-follower"}}}
                for r in (first, other):
                    await r.close()
    finally:
        await admin.config_set("maxclients", 10000)
        await admin.aclose()
