"""The hub when things go wrong: a backend whose stream drops or that ends it gracefully
(listen again, then tell clients and the cache they may have missed changes), a backend that
refuses to listen, is down at listen time or was never discovered (left out of the ack, at
once), a client that stops reading (cut off, the others unaffected), and the hub's Redis
subscription lost and regained (a gap, like a reconnect)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import orjson
from prometheus_client import REGISTRY

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.procs import python_server, refused_url
from tests.support.scripted import Scripted

SUB = "io.modelcontextprotocol/subscriptionId"
# A long URI makes each notification ~2 KB, so the stalled client's socket buffers fill
# after a few hundred notifications rather than many thousands.
HOT = "mutable://hot/" + "x" * 2000


async def test_backend_restart_is_a_gap_clients_and_cache_hear_about():
    backend = python_server("mutable_modern.py", name="mutable-restarting").start()
    try:
        config = {"backends": [{"name": "m", "url": backend.url}],
                  "cache": {"store": "memory", "default_ttl_ms": 60000},
                  "subscriptions": {"reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.5}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            reader = await ListenReader(http, gw.url, {"toolsListChanged": True,
                                                       "resourceSubscriptions": ["mutable://config"]}, id="g").open()
            await mcp_http.post(http, gw.url, "tools/list")
            assert (await mcp_http.post(http, gw.url, "tools/list")).headers["x-cache"] == "hit"

            # The backend dies (its streams drop) and comes back on the same port; nothing
            # changes on purpose: only the gap is reported.
            backend.kill()
            backend.start()
            await reader.wait_count(3)
            assert sorted((n["method"], n["params"].get("uri"), n["params"]["_meta"][SUB])
                          for n in reader.notifications) == [
                ("notifications/resources/updated", "mutable://config", "g"),
                ("notifications/tools/list_changed", None, "g"),
            ]
            assert (await mcp_http.post(http, gw.url, "tools/list")).headers["x-cache"] != "hit"
            # The reconnected upstream delivers again.
            await http.post(f"http://127.0.0.1:{backend.port}/change/tools")
            await reader.wait_count(4)
            assert reader.messages[3]["method"] == "notifications/tools/list_changed"
            await reader.close()
    finally:
        backend.stop()


def _overflows() -> float:
    return REGISTRY.get_sample_value("mcp_gateway_listen_overflows_total") or 0.0


async def test_a_stalled_client_is_cut_off_and_never_delays_the_others():
    backend = python_server("mutable_modern.py", name="mutable-stall").start()
    stalled = socket.socket()
    try:
        config = {"backends": [{"name": "m", "url": backend.url}], "subscriptions": {"queue_size": 64}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            healthy = await ListenReader(http, gw.url, {"resourceSubscriptions": [HOT]}, id="ok").open()
            # A client that sends its listen and then never reads a byte (tiny receive window).
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", gw.port))
            body = orjson.dumps(mcp_http.body("subscriptions/listen",
                                              {"notifications": {"resourceSubscriptions": [HOT]}},
                                              id="stalled"))
            head = "".join(f"{k}: {v}\r\n" for k, v in mcp_http.headers("subscriptions/listen").items())
            stalled.sendall(f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{gw.port}\r\n{head}"
                            f"content-length: {len(body)}\r\n\r\n".encode() + body)
            await eventually(lambda: gw.runtime.hub.client_count == 2)

            before = _overflows()
            sent = 0
            # Publish in rounds; each round is fully delivered to the healthy reader while the
            # stalled one falls behind, until the stalled one is cut off.
            # Rounds smaller than the queue: the healthy reader is never that far behind.
            for _ in range(1000):
                await http.post(f"http://127.0.0.1:{backend.port}/touch",
                                params={"uri": HOT, "times": 50})
                sent += 50
                await healthy.wait_count(1 + sent)
                if _overflows() > before:
                    break
            assert _overflows() == before + 1
            await eventually(lambda: gw.runtime.hub.client_count == 1)
            assert len(healthy.notifications) == sent and not healthy.ended
            assert {n["params"]["_meta"][SUB] for n in healthy.notifications} == {"ok"}
            await healthy.close()
    finally:
        stalled.close()
        backend.stop()


async def test_listen_request_cancelled_while_waiting_for_the_upstream_ack_leaves_nothing_behind():
    """A backend that accepts the connection but never answers: the client gives up
    before the ack; the hub must not keep it counted."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    try:
        # Capabilities are needed before a listen is planned: give the gateway a backend
        # that never answers, so planning itself waits (on discovery) and the client leaves.
        config = {"backends": [{"name": "mute", "url": f"http://127.0.0.1:{port}/mcp", "timeout_seconds": 30}],
                  "subscriptions": {"ack_timeout_seconds": 30}}
        async with running_gateway(config, discover=False) as gw, httpx.AsyncClient(timeout=30) as http:
            reader = ListenReader(http, gw.url, {"toolsListChanged": True})
            await reader.open(wait_ack=False)
            await eventually(lambda: gw.runtime.hub.client_count == 1)
            await reader.close()
            await eventually(lambda: gw.runtime.hub.client_count == 0)
    finally:
        silent.close()
        await asyncio.sleep(0)


async def test_a_backend_down_at_listen_time_is_left_out_of_the_ack_without_waiting():
    alive = python_server("mutable_modern.py", name="mutable-alive").start()
    dead = python_server("mutable_modern.py", name="mutable-dead").start()
    try:
        config = {"backends": [{"name": "alive", "url": alive.url}, {"name": "dead", "url": dead.url}],
                  # Far longer than the reader waits: only failing fast can pass.
                  "subscriptions": {"ack_timeout_seconds": 600}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            dead.kill()  # capabilities are known (discovered), the listen connection is refused
            reader = await ListenReader(http, gw.url, {"resourceSubscriptions": ["mutable://config"]}).open(
                timeout=30)
            # The URI is asked of both backends; only the live one acknowledged it.
            assert reader.ack["params"]["notifications"] == {"resourceSubscriptions": ["mutable://config"]}
            await http.post(f"http://127.0.0.1:{alive.port}/touch", params={"uri": "mutable://config"})
            await reader.wait_count(2)
            assert reader.messages[1]["params"]["uri"] == "mutable://config"
            await reader.close()
    finally:
        alive.stop()
        dead.stop()


async def test_a_backend_that_ends_its_listen_stream_gracefully_is_listened_to_again():
    # spec §Graceful Closure from the backend's side (it is shutting down, or shedding load):
    # the gateway listens again, and its clients are told they may have missed changes.
    backend = python_server("mutable_modern.py", name="mutable-closing").start()
    control = f"http://127.0.0.1:{backend.port}"
    try:
        config = {"backends": [{"name": "m", "url": backend.url}],
                  "subscriptions": {"reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.5}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            reader = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="c").open()
            assert (await http.post(f"{control}/close-listens")).json() == {"closing": 1}
            await reader.wait_count(2)
            assert reader.messages[1] == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
                                          "params": {"_meta": {SUB: "c"}}}
            await eventually(lambda: _stats(http, control, open_listens=1, listens_total=2))
            await http.post(f"{control}/change/tools")
            await reader.wait_count(3)
            assert reader.messages[2]["method"] == "notifications/tools/list_changed"
            assert not reader.ended
            await reader.close()
    finally:
        backend.stop()


async def _stats(http: httpx.AsyncClient, control: str, **expected: int) -> bool:
    stats = (await http.get(f"{control}/stats")).json()
    return all(stats[k] == v for k, v in expected.items())


async def test_a_backend_that_refuses_subscriptions_listen_is_left_out_of_the_ack_at_once():
    # It advertises tools.listChanged but answers the listen with an error (here -32601).
    scripted = Scripted("refuser").start()
    try:
        config = {"backends": [{"name": "s", "url": scripted.url}],
                  # Far longer than the reader waits: only the refusal itself can answer. Without
                  # the polling fallback, which would deliver what the listen refused
                  # (tests/integration/test_listen_polling.py).
                  "subscriptions": {"ack_timeout_seconds": 600, "poll_fallback": False}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            for i in (1, 2):
                reader = await ListenReader(http, gw.url, {"toolsListChanged": True}, id=i).open(timeout=30)
                assert reader.status == 200 and reader.ack["params"]["notifications"] == {}
                await reader.close()
            assert await scripted.calls("subscriptions/listen")  # it was asked, and said no
    finally:
        scripted.stop()


async def test_a_backend_down_and_never_discovered_is_left_out_of_the_ack():
    alive = python_server("mutable_modern.py", name="mutable-beside-undiscovered").start()
    try:
        config = {"backends": [{"name": "alive", "url": alive.url}, {"name": "gone", "url": refused_url()}],
                  "subscriptions": {"ack_timeout_seconds": 600}}
        async with running_gateway(config, discover=False) as gw, httpx.AsyncClient(timeout=30) as http:
            both = {"toolsListChanged": True, "promptsListChanged": True}
            reader = await ListenReader(http, gw.url, both, id="u").open(timeout=30)
            assert reader.ack["params"]["notifications"] == both
            assert [s.key.backend for s in gw.runtime.hub.upstreams.values()] == ["alive"]
            await http.post(f"http://127.0.0.1:{alive.port}/change/tools")
            await reader.wait_count(2)
            await reader.close()
    finally:
        alive.stop()


async def test_a_lost_and_regained_redis_subscription_is_a_gap_for_clients_and_cache(redis_server):
    # Pub/sub keeps nothing for a subscriber that is away: when the hub's subscription comes
    # back, every client is told it may have missed changes and the cache forgets what they
    # could have changed.
    backend = python_server("mutable_modern.py", name="mutable-resync").start()
    try:
        config = {"backends": [{"name": "m", "url": backend.url}],
                  "cache": {"store": "memory"},
                  "subscriptions": {"redis_url": redis_server.url}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            wants = {"toolsListChanged": True, "resourceSubscriptions": ["mutable://config"]}
            reader = await ListenReader(http, gw.url, wants, id="r").open()
            await mcp_http.post(http, gw.url, "tools/list")
            assert (await mcp_http.post(http, gw.url, "tools/list")).headers["x-cache"] == "hit"
            redis_server.kill()
            await eventually(lambda: not gw.runtime.hub.bus._subscribed.is_set())
            redis_server.start()
            await reader.wait_count(3)
            assert sorted((n["method"], n["params"].get("uri")) for n in reader.notifications) == [
                ("notifications/resources/updated", "mutable://config"),
                ("notifications/tools/list_changed", None),
            ]
            assert (await mcp_http.post(http, gw.url, "tools/list")).headers["x-cache"] == "miss"
            await reader.close()
    finally:
        backend.stop()
