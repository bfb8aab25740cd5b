"""Two gateway processes and one real redis-server: one upstream listen for both, a change
seen upstream by one reaches the clients of both, and when the holder dies the other takes
the stream over (its clients are told they may have missed changes, then hear new ones)."""

from __future__ import annotations

import re

import httpx
import yaml

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
