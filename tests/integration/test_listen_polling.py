"""Listen for backends that cannot: the gateway polls their lists and subscribed resources and
tells listeners when something changed (gateway/subscriptions/poll.py; docs/subscriptions.md
"Backends without listen").

Real backends on loopback, each unable to listen in its own way: the SDK fixture serving no
listen at all (`mutable_modern.py --no-listen`, which advertises no listChanged), the same
fixture acknowledging every listen with nothing honoured (`--empty-ack`, as fastmcp 4.x does),
and the scripted fixture, which advertises `tools.listChanged` but answers the listen -32601.
Each counts the requests it receives, which is how the tests see how often it is polled; two
gateway replicas share a real redis-server to show that a backend sees one poller however
many clients and replicas listen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.procs import Proc, python_server
from tests.support.scripted import Scripted

SUB = "io.modelcontextprotocol/subscriptionId"
TOOLS_CHANGED = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"
# Fast polling for tests: the fixture's ttlMs (60 s) is clamped to the maximum.
POLL = {"poll_min_seconds": 0.2, "poll_max_seconds": 0.4, "linger_seconds": 0.2}


@pytest.fixture(scope="module")
def no_listen() -> Iterator[Proc]:
    proc = python_server("mutable_modern.py", "--no-listen", name="mutable-poll-no-listen").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def empty_ack() -> Iterator[Proc]:
    proc = python_server("mutable_modern.py", "--empty-ack", name="mutable-poll-empty-ack").start()
    try:
        yield proc
    finally:
        proc.stop()


def control(backend: Proc) -> str:
    return f"http://127.0.0.1:{backend.port}"


async def requests(http: httpx.AsyncClient, backend: Proc, method: str) -> int:
    return (await http.get(f"{control(backend)}/stats")).json()["requests"].get(method, 0)


def config(backend: Any, **subscriptions: Any) -> dict[str, Any]:
    return {"backends": [{"name": "m", "url": backend.url}], "subscriptions": {**POLL, **subscriptions}}


async def test_a_backend_without_listen_is_polled_and_its_tool_change_heard(no_listen):
    cache = {"store": "memory", "default_ttl_ms": 60_000}
    async with running_gateway({**config(no_listen), "cache": cache}) as gw, httpx.AsyncClient(timeout=30) as http:
        before = (await mcp_http.post(http, gw.url, "tools/list")).json()["result"]["tools"]
        assert (await mcp_http.post(http, gw.url, "tools/list")).headers["x-cache"] == "hit"
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True, "promptsListChanged": True},
                                    id="poll-1").open()
        # Acknowledged though the backend advertises no listChanged: the gateway delivers it.
        assert reader.ack["params"]["notifications"] == {"toolsListChanged": True, "promptsListChanged": True}
        assert await requests(http, no_listen, "subscriptions/listen") == 0  # nothing to ask it
        await asyncio.sleep(1.0)
        assert reader.notifications == []  # polled, unchanged: nothing to say
        added = (await http.post(f"{control(no_listen)}/change/tools")).json()["added"]
        changed_at = asyncio.get_running_loop().time()
        await reader.wait_count(2, timeout=5)
        heard_after = asyncio.get_running_loop().time() - changed_at
        assert reader.messages[1] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED, "params": {"_meta": {SUB: "poll-1"}}}
        assert heard_after < 0.4 * 1.1 + 0.5, heard_after  # within one polling interval (+ jitter, slack)
        # The cached pages went with the notification: the refetch has the new tool.
        after = (await mcp_http.post(http, gw.url, "tools/list")).json()["result"]["tools"]
        assert added in [t["name"] for t in after] and added not in [t["name"] for t in before]
        await asyncio.sleep(1.0)
        assert len(reader.notifications) == 1  # one change, one notification
        await reader.close()


async def test_a_backend_whose_ack_honours_nothing_is_polled_lists_and_resources(empty_ack):
    async with running_gateway(config(empty_ack)) as gw, httpx.AsyncClient(timeout=30) as http:
        wants = {"toolsListChanged": True, "resourceSubscriptions": ["mutable://config"]}
        reader = await ListenReader(http, gw.url, wants, id="poll-2").open()
        assert reader.ack["params"]["notifications"] == wants
        assert await requests(http, empty_ack, "subscriptions/listen") >= 1  # asked, and it said "nothing"
        reads = await requests(http, empty_ack, "resources/read")
        await asyncio.sleep(1.0)
        assert await requests(http, empty_ack, "resources/read") > reads  # the subscribed read is polled
        # mutable://config reads "config revision <published>": a publish changes it.
        await http.post(f"{control(empty_ack)}/change/prompts")
        await reader.wait_count(2, timeout=5)
        assert reader.messages[1] == {"jsonrpc": "2.0", "method": UPDATED,
                                      "params": {"uri": "mutable://config", "_meta": {SUB: "poll-2"}}}
        await http.post(f"{control(empty_ack)}/change/tools")  # a tool, and another publish
        await reader.wait(lambda: TOOLS_CHANGED in [m["method"] for m in reader.notifications], timeout=5)
        assert [m["method"] for m in reader.notifications].count(TOOLS_CHANGED) == 1
        await reader.close()


async def test_a_backend_that_refuses_listen_is_polled_at_the_configured_pace():
    # Scripted advertises tools.listChanged and answers subscriptions/listen with -32601.
    with Scripted("refuses") as scripted:
        async with running_gateway(config(scripted, poll_min_seconds=0.3, poll_max_seconds=0.3)) as gw, \
                httpx.AsyncClient(timeout=30) as http:
            reader = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="poll-3").open()
            assert reader.ack["params"]["notifications"] == {"toolsListChanged": True}
            assert await scripted.calls("subscriptions/listen")
            async def polls() -> int:  # each poll reads every page; count the first pages
                return sum("cursor" not in c["params"] for c in await scripted.calls("tools/list"))

            first = await polls()
            await asyncio.sleep(2.0)
            # One poll per 0.3 s ± 10 %: ~6.7 in 2 s.
            assert 4 <= await polls() - first <= 9
            assert reader.notifications == []  # its list never changes
            await reader.close()


async def test_no_polling_when_it_is_turned_off(no_listen):
    async with running_gateway(config(no_listen, poll_fallback=False)) as gw, httpx.AsyncClient(timeout=30) as http:
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="off").open()
        assert reader.ack["params"]["notifications"] == {}
        await reader.close()


async def test_one_poller_for_every_client_of_every_replica(no_listen, redis_server):
    """Two replicas, four listening clients each: the backend is polled as by one listener."""
    shared = config(no_listen, poll_min_seconds=0.3, poll_max_seconds=0.3, redis_url=redis_server.url,
                    lease_seconds=0.6, reconnect_initial_seconds=0.05)
    async with running_gateway(shared) as one, running_gateway(shared) as two, httpx.AsyncClient(timeout=30) as http:
        readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"r{i}-{n}").open()
                   for i, gw in enumerate((one, two)) for n in range(4)]
        for reader in readers:
            assert reader.ack["params"]["notifications"] == {"toolsListChanged": True}
        await eventually(lambda: sum(s.holding for gw in (one, two) for s in gw.runtime.hub.upstreams.values()) == 1)
        start = await requests(http, no_listen, "tools/list")
        await asyncio.sleep(3.0)
        polls = await requests(http, no_listen, "tools/list") - start
        # One poller: ~10 polls in 3 s (0.3 s ± 10 %); eight independent ones would be ~80.
        assert 6 <= polls <= 14, polls
        await http.post(f"{control(no_listen)}/change/tools")
        for reader in readers:  # the holder's poll reaches the clients of both replicas
            await reader.wait_count(2, timeout=5)
            assert reader.messages[1]["method"] == TOOLS_CHANGED
            assert reader.messages[1]["params"]["_meta"] == {SUB: reader.id}
        for reader in readers:
            await reader.close()


async def test_a_stateless_initialize_era_backend_is_polled():
    """No session, so no GET stream and no subscriptions: its listen acknowledges nothing
    (docs/legacy.md), and the gateway polls it instead."""
    from tests.support import legacy_venv

    proc = legacy_venv.legacy_server("--stateless", "--json", name="legacy-poll-stateless").start()
    try:
        settings = {"backends": [{"name": "old", "url": proc.url, "era": "legacy"}], "subscriptions": POLL}
        async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=30) as http:
            reader = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="old-1").open()
            assert reader.ack["params"]["notifications"] == {"toolsListChanged": True}
            bumped = await mcp_http.post(http, gw.url, "tools/call", {"name": "bump_tools", "arguments": {}})
            added = bumped.json()["result"]["content"][0]["text"]
            await reader.wait_count(2, timeout=5)
            assert reader.messages[1]["method"] == TOOLS_CHANGED
            listed = (await mcp_http.post(http, gw.url, "tools/list")).json()["result"]["tools"]
            assert added in [t["name"] for t in listed]
            await reader.close()
    finally:
        proc.stop()
