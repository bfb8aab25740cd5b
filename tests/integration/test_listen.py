"""subscriptions/listen through the gateway, client side exactly per spec (digest §d), against
real mcp==2.3.0 backends that change on demand and real clients (the SDK's `Client.listen`
and raw SSE readers)."""

from __future__ import annotations

import signal

import httpx
import pytest
import yaml
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.procs import gateway_process, python_server

SUB = "io.modelcontextprotocol/subscriptionId"
TOOLS_CHANGED = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"


@pytest.fixture(scope="module")
def silent_backend():
    """Serves no subscriptions/listen, so it advertises no listChanged / subscribe."""
    proc = python_server("mutable_modern.py", "--no-listen", name="mutable-no-listen").start()
    try:
        yield proc
    finally:
        proc.stop()


def control(backend) -> str:
    return f"http://127.0.0.1:{backend.port}"


async def open_listens(http: httpx.AsyncClient, backend) -> int:
    return (await http.get(f"{control(backend)}/stats")).json()["open_listens"]


def settings(*backends, **subscriptions):
    return {"backends": [{"name": f"b{i}", "url": b.url} for i, b in enumerate(backends)],
            "subscriptions": {"linger_seconds": 0.2, **subscriptions}}


async def test_sdk_client_hears_tool_and_resource_changes(mutable_backend):
    async with running_gateway(settings(mutable_backend)) as gw, httpx.AsyncClient() as http:
        async with Client(gw.url, mode="2026-07-28") as client:
            async with client.listen(tools_list_changed=True, resource_subscriptions=["mutable://config"]) as sub:
                assert sub.honored.tools_list_changed is True
                assert sub.honored.resource_subscriptions == ["mutable://config"]
                added = (await http.post(f"{control(mutable_backend)}/change/tools")).json()["added"]
                events = aiter(sub)
                assert await anext(events) == ToolsListChanged()
                # The change is real: the refetched list has the new tool.
                assert added in [t.name for t in (await client.list_tools()).tools]
                await http.post(f"{control(mutable_backend)}/touch", params={"uri": "mutable://config"})
                assert await anext(events) == ResourceUpdated(uri="mutable://config")


@pytest.mark.parametrize("listen_id", [41, "dash-7"])
async def test_ack_first_ids_retagged_only_requested_types_and_graceful_close(mutable_backend, listen_id):
    async with running_gateway(settings(mutable_backend)) as gw, httpx.AsyncClient(timeout=30) as http:
        narrow = await ListenReader(http, gw.url, {"resourceSubscriptions": ["mutable://a"]}, id=listen_id).open()
        # A witness that asks for everything: once it has seen the changes, the narrow
        # stream has been offered them too (one fan-out delivers to both).
        witness = await ListenReader(http, gw.url, {"toolsListChanged": True, "resourcesListChanged": True,
                                                    "resourceSubscriptions": ["mutable://a", "mutable://b"]},
                                     id="witness").open()
        assert narrow.status == 200
        assert narrow.ack == {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                              "params": {"_meta": {SUB: listen_id},
                                         "notifications": {"resourceSubscriptions": ["mutable://a"]}}}
        await http.post(f"{control(mutable_backend)}/change/tools")
        await http.post(f"{control(mutable_backend)}/change/resources")
        await http.post(f"{control(mutable_backend)}/touch", params={"uri": "mutable://b"})
        await http.post(f"{control(mutable_backend)}/touch", params={"uri": "mutable://a"})
        await witness.wait_count(5)
        assert sorted(n["method"] for n in witness.notifications) == sorted(
            [TOOLS_CHANGED, "notifications/resources/list_changed", UPDATED, UPDATED])
        assert all(n["params"]["_meta"][SUB] == "witness" for n in witness.notifications)
        # The narrow stream has its own upstream listen (another URI set): wait for its update
        # too before shutting down, or the closure could overtake it.
        await narrow.wait_count(2)

        await gw.runtime.begin_shutdown()
        await narrow.wait(lambda: narrow.ended)
        assert narrow.messages[1:] == [
            {"jsonrpc": "2.0", "method": UPDATED, "params": {"_meta": {SUB: listen_id}, "uri": "mutable://a"}},
            {"jsonrpc": "2.0", "id": listen_id, "result": {"resultType": "complete", "_meta": {SUB: listen_id}}},
        ]
        await witness.wait(lambda: witness.ended)
        assert witness.messages[-1]["result"]["_meta"] == {SUB: "witness"}


async def test_ack_omits_what_no_backend_can_deliver(silent_backend):
    # Without the polling fallback (tests/integration/test_listen_polling.py has it on).
    async with running_gateway(settings(silent_backend, poll_fallback=False)) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True, "resourceSubscriptions": ["x://1"]}).open()
        assert reader.ack["params"]["notifications"] == {}
        await reader.close()


async def test_fleet_ack_is_the_union_of_what_backends_deliver(mutable_backend, silent_backend):
    async with running_gateway(settings(mutable_backend, silent_backend, poll_fallback=False)) as gw, \
            httpx.AsyncClient() as http:
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True, "promptsListChanged": True}).open()
        assert reader.ack["params"]["notifications"] == {"toolsListChanged": True, "promptsListChanged": True}
        # Only the backend that can deliver holds an upstream listen for it.
        assert [s.key.backend for s in gw.runtime.hub.upstreams.values()] == ["b0"]
        await reader.close()


async def test_keepalive_comments_on_a_quiet_stream(mutable_backend):
    config = {**settings(mutable_backend), "server": {"keepalive_seconds": 0.1}}
    async with running_gateway(config) as gw, httpx.AsyncClient() as http:
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True}).open()
        await reader.wait(lambda: reader.comments >= 2)
        assert len(reader.messages) == 1  # only the ack: the comments are not messages
        await reader.close()


async def test_a_client_that_leaves_is_detached_and_the_upstream_closes(mutable_backend):
    async with running_gateway(settings(mutable_backend)) as gw, httpx.AsyncClient() as http:
        before = await open_listens(http, mutable_backend)
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True}).open()
        assert gw.runtime.hub.client_count == 1
        assert await open_listens(http, mutable_backend) == before + 1
        await reader.close()
        await eventually(lambda: gw.runtime.hub.client_count == 0)
        # After the linger the shared upstream listen is closed at the backend too.
        await eventually(lambda: _equals(open_listens(http, mutable_backend), before))
        assert gw.runtime.hub.upstreams == {}


async def _equals(awaitable, expected) -> bool:
    return await awaitable == expected


async def test_limits_per_principal_and_in_total(mutable_backend):
    async with running_gateway(settings(mutable_backend, max_listens=3, max_listens_per_principal=2)) as gw, \
            httpx.AsyncClient() as http:
        alice = {"authorization": "Bearer alice"}
        first = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=i, headers=alice).open()
                 for i in range(2)]
        refused = await ListenReader(http, gw.url, {"toolsListChanged": True}, id=3, headers=alice).open()
        assert refused.status == 429
        assert refused.error["id"] == 3 and refused.error["error"]["code"] == -31004
        assert "subscriptions.max_listens_per_principal" in refused.error["error"]["message"]
        bob = await ListenReader(http, gw.url, {"toolsListChanged": True}, id=4,
                                 headers={"authorization": "Bearer bob"}).open()
        assert bob.status == 200
        carol = await ListenReader(http, gw.url, {"toolsListChanged": True}, id=5,
                                   headers={"authorization": "Bearer carol"}).open()
        assert carol.status == 503 and "subscriptions.max_listens" in carol.error["error"]["message"]
        # A stream that closes frees its slot at once.
        await first[0].close()
        await eventually(lambda: gw.runtime.hub.client_count == 2)
        again = await ListenReader(http, gw.url, {"toolsListChanged": True}, id=6, headers=alice).open()
        assert again.status == 200
        for r in (*first, bob, again):
            await r.close()


async def test_task_ids_need_the_tasks_extension(mutable_backend):
    async with running_gateway(settings(mutable_backend)) as gw, httpx.AsyncClient() as http:
        response = await mcp_http.post(http, gw.url, "subscriptions/listen", {"notifications": {"taskIds": ["t"]}})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == -32021
        assert error["data"]["requiredCapabilities"] == {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        # `extensions` that is no object is a malformed ClientCapabilities, refused at the front
        # door naming the field (a number was a 500, a string matched by substring).
        for extensions in (5, "io.modelcontextprotocol/tasks"):
            malformed = await mcp_http.post(
                http, gw.url, "subscriptions/listen", {"notifications": {"taskIds": ["t"]}},
                meta={"io.modelcontextprotocol/clientCapabilities": {"extensions": extensions}})
            assert (malformed.status_code, malformed.json()["error"]["code"]) == (400, -32602), extensions
            assert malformed.json()["error"]["data"] == {
                "field": "_meta['io.modelcontextprotocol/clientCapabilities'].extensions"}
        # Declared: accepted, and honestly not acknowledged (the gateway offers no tasks).
        reader = await ListenReader(
            http, gw.url, {"taskIds": ["t"], "toolsListChanged": True}, id=9,
            meta={"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}},
        ).open()
        assert reader.ack["params"]["notifications"] == {"toolsListChanged": True}
        await reader.close()


async def test_notifications_invalidate_the_cache_before_clients_hear_them(mutable_backend):
    async with running_gateway({**settings(mutable_backend), "cache": {"store": "memory", "default_ttl_ms": 60000}}
                               ) as gw, httpx.AsyncClient(timeout=30) as http:
        first = await mcp_http.post(http, gw.url, "tools/list")
        second = await mcp_http.post(http, gw.url, "tools/list")
        assert second.headers.get("x-cache") == "hit"
        reader = await ListenReader(http, gw.url, {"toolsListChanged": True}).open()
        added = (await http.post(f"{control(mutable_backend)}/change/tools")).json()["added"]
        await reader.wait_count(2)
        third = await mcp_http.post(http, gw.url, "tools/list")
        assert third.headers.get("x-cache") != "hit"
        names = [t["name"] for t in third.json()["result"]["tools"]]
        assert added in names and added not in [t["name"] for t in first.json()["result"]["tools"]]
        await reader.close()


async def test_sigterm_gives_every_stream_the_graceful_result(mutable_backend, tmp_path):
    """The real server's shutdown path (cli.GatewayServer → Runtime.begin_shutdown)."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "m", "url": mutable_backend.url}]}))
    gateway = gateway_process(config).start()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            readers = [await ListenReader(http, gateway.url, {"toolsListChanged": True}, id=i).open()
                       for i in range(3)]
            gateway.proc.send_signal(signal.SIGTERM)
            for r in readers:
                await r.wait(lambda r=r: r.ended)
                assert r.messages[-1] == {"jsonrpc": "2.0", "id": r.id,
                                          "result": {"resultType": "complete", "_meta": {SUB: r.id}}}
        # It exits (uvicorn re-raises the SIGTERM it handled, so the status is -SIGTERM).
        assert gateway.proc.wait(15) in (0, -signal.SIGTERM)
    finally:
        gateway.stop()


async def test_a_listen_during_shutdown_is_refused_with_503(mutable_backend):
    async with running_gateway(settings(mutable_backend)) as gw, httpx.AsyncClient(timeout=30) as http:
        first = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="before").open()
        await gw.runtime.begin_shutdown()
        await first.wait(lambda: first.ended)
        late = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="late").open()
        assert late.status == 503
        assert late.error["id"] == "late" and late.error["error"]["code"] == -31004
        assert late.error["error"]["data"] == {"reason": "shutdown"}
        assert gw.runtime.hub.client_count == 0
