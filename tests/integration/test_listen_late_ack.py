"""An upstream ack that comes after the client's own ack went out without it.

A client's ack waits `ack_timeout_seconds` for each upstream stream it needs. An upstream
ack can come later than that: the backend is slow, or down at the time (its client is then
acknowledged at once without it), or (two replicas) the stream's lease is still held by a
replica that was killed before it stored the ack, so the surviving replica takes the stream
over only when that lease expires. The client's stream stays attached to the
late stream, and its ack decides (hub.ClientListen.acknowledged_late): what the client's ack
listed is delivered from then on (with one refetch notification first); a type its ack left
out makes the gateway close the stream without the graceful result, the spec's signal to
re-listen, and the new listen is acknowledged with it and hears that backend.

The backends hold their listens (`POST /hold-listens`) to make the ack late on purpose.
"""

from __future__ import annotations

import re

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY

from tests.integration.test_listen import control
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.procs import gateway_process, python_server

SUB = "io.modelcontextprotocol/subscriptionId"
TOOLS_CHANGED = "notifications/tools/list_changed"
TOOLS = {"toolsListChanged": True}


async def _holds(http: httpx.AsyncClient, port: int) -> bool:
    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    match = re.search(r'^mcp_gateway_listen_upstreams\{backend="m"\} (\S+)$', text, re.M)
    return match is not None and float(match.group(1)) == 1.0


@pytest.mark.parametrize("http_protocol", ["gateway", "uvicorn"])
async def test_a_listen_on_a_replica_whose_stream_lease_a_killed_replica_holds_hears_the_backend(
    tmp_path, redis_server, http_protocol
):
    # Under either HTTP protocol: the stream is cut from the hub's callback (direct delivery)
    # or by cancelling the request task that writes it (`server.http: uvicorn`).
    backend = python_server("mutable_modern.py", name="mutable-late-ack").start()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url}],
        "server": {"http": http_protocol},
        # The client's ack waits far less than the dead holder's lease lasts.
        "subscriptions": {"redis_url": redis_server.url, "lease_seconds": 3.0, "ack_timeout_seconds": 0.3,
                          "reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.5},
        "observability": {"log_level": "warning"},
    }))
    doomed, survivor = gateway_process(config).start(), gateway_process(config).start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            # The doomed replica takes the stream's lease and asks the backend, which holds
            # the listen: no ack is stored beside the lease when the replica is killed.
            await http.post(f"{control(backend)}/hold-listens", params={"seconds": 60})
            first = await ListenReader(http, f"http://127.0.0.1:{doomed.port}/mcp", TOOLS, id="on-doomed").open()
            await eventually(lambda: _holds(http, doomed.port))
            doomed.kill()
            await http.post(f"{control(backend)}/hold-listens", params={"seconds": 0})
            await first.close()

            # While the dead replica's lease lasts, the survivor's client is acknowledged
            # without the backend (that is the situation, not the fix).
            reader = await ListenReader(http, survivor.url, TOOLS, id="dashboard").open()
            assert reader.ack["params"]["notifications"] == {}
            assert not await _holds(http, survivor.port)

            # The lease expires, the survivor listens upstream and is acknowledged: its client,
            # whose ack did not list the tools, is told to re-listen (no graceful result) ...
            await reader.wait(lambda: reader.ended, timeout=20)
            assert [m.get("method") for m in reader.messages] == ["notifications/subscriptions/acknowledged"]
            assert await _holds(http, survivor.port)
            # ... and the new listen is acknowledged with them and hears the backend.
            again = await ListenReader(http, survivor.url, TOOLS, id="dashboard").open()
            assert again.ack["params"]["notifications"] == TOOLS
            await http.post(f"{control(backend)}/change/tools")
            await again.wait_count(2)
            assert again.messages[1] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED,
                                         "params": {"_meta": {SUB: "dashboard"}}}
            assert not again.ended
            await again.close()
    finally:
        doomed.stop()
        survivor.stop()
        backend.stop()


def _late_acks(backend: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("mcp_gateway_listen_late_acks_total",
                                     {"backend": backend, "outcome": outcome}) or 0.0


async def test_a_backend_acknowledged_late_is_delivered_within_what_the_ack_listed():
    fast = python_server("mutable_modern.py", name="mutable-fast").start()
    slow = python_server("mutable_modern.py", name="mutable-slow").start()
    try:
        config = {"backends": [{"name": "fast", "url": fast.url}, {"name": "slow", "url": slow.url}],
                  "subscriptions": {"ack_timeout_seconds": 0.3}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            await http.post(f"{control(slow)}/hold-listens", params={"seconds": 60})
            reader = await ListenReader(http, gw.url, TOOLS, id=7).open()
            # The tools are listed (the fast backend acknowledged them); the slow one is late.
            assert reader.ack["params"]["notifications"] == TOOLS
            granted_before = _late_acks("slow", "granted")
            await http.post(f"{control(slow)}/hold-listens", params={"seconds": 0})
            # Its ack comes: the client is told its tools may have changed meanwhile ...
            await reader.wait_count(2)
            assert reader.messages[1] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED, "params": {"_meta": {SUB: 7}}}
            assert _late_acks("slow", "granted") == granted_before + 1
            # ... and hears the slow backend from then on, on the same stream.
            await http.post(f"{control(slow)}/change/tools")
            await reader.wait_count(3)
            assert reader.messages[2] == {"jsonrpc": "2.0", "method": TOOLS_CHANGED, "params": {"_meta": {SUB: 7}}}
            await http.post(f"{control(fast)}/change/tools")
            await reader.wait_count(4)
            assert not reader.ended
            await reader.close()
            await eventually(lambda: gw.runtime.hub.client_count == 0)
    finally:
        fast.stop()
        slow.stop()


async def test_a_backend_down_at_listen_time_is_heard_once_it_is_back():
    # Its listen connection is refused at once, so the client is acknowledged without it at
    # once (test_listen_resilience.py); the stream keeps trying with backoff, and its ack, when
    # the backend is back, grants the client what its ack already listed (the URI, which the
    # live backend acknowledged).
    alive = python_server("mutable_modern.py", name="mutable-alive-beside-returning").start()
    returning = python_server("mutable_modern.py", name="mutable-returning").start()
    uri = "mutable://config"
    try:
        config = {"backends": [{"name": "alive", "url": alive.url}, {"name": "returning", "url": returning.url}],
                  "subscriptions": {"ack_timeout_seconds": 600, "reconnect_initial_seconds": 0.05,
                                    "reconnect_max_seconds": 0.3}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            returning.stop()
            reader = await ListenReader(http, gw.url, {"resourceSubscriptions": [uri]}, id="r").open(timeout=30)
            assert reader.ack["params"]["notifications"] == {"resourceSubscriptions": [uri]}
            returning.start()
            # Acknowledged now: the client may have missed an update of the URI meanwhile ...
            await reader.wait_count(2)
            assert reader.messages[1] == {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                          "params": {"uri": uri, "_meta": {SUB: "r"}}}
            # ... and the returned backend's updates reach it.
            await http.post(f"{control(returning)}/touch", params={"uri": uri})
            await reader.wait_count(3)
            assert reader.messages[2]["params"] == {"uri": uri, "_meta": {SUB: "r"}}
            assert not reader.ended
            await reader.close()
    finally:
        alive.stop()
        returning.stop()
