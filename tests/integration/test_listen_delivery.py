"""How listen streams reach their clients (docs/subscriptions.md "Delivery"): under the
gateway's own HTTP/1.1 protocol a stream takes its connection over once acknowledged and
holds no task while idle; under `server.http: uvicorn` the same stream goes through the ASGI
`send`, with the same bytes a client can see (ids with their JSON type, keep-alives, the
graceful result at shutdown)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.subscriptions.encoding import Outgoing
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, RawListen, close_all, eventually

SUB = "io.modelcontextprotocol/subscriptionId"
TOOLS_CHANGED = "notifications/tools/list_changed"


def settings(backend, **server):
    return {"backends": [{"name": "m", "url": backend.url}], "server": server,
            "subscriptions": {"linger_seconds": 0.2}}


async def test_idle_streams_hold_no_task_once_acknowledged(mutable_backend):
    streams = [RawListen(i if i % 2 else f"s{i}", {"toolsListChanged": True}) for i in range(50)]
    async with running_gateway(settings(mutable_backend)) as gw, httpx.AsyncClient() as http:
        tasks = []
        try:
            before = len(asyncio.all_tasks())
            tasks = [asyncio.create_task(s.run(gw.port)) for s in streams]
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(1) for s in streams)), 20)
            await asyncio.sleep(0.2)
            assert gw.runtime.hub.client_count == 50
            # Our own 50 reader tasks and the one upstream listen: no request task, answer
            # task or disconnect watcher per stream.
            assert len(asyncio.all_tasks()) <= before + 50 + 3
            await http.post(f"http://127.0.0.1:{mutable_backend.port}/change/tools")
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(2) for s in streams)), 20)
            for s in streams:
                ack, changed = s.messages()
                assert ack["params"]["_meta"][SUB] == s.id
                got = changed["params"]["_meta"][SUB]
                assert changed["method"] == TOOLS_CHANGED and got == s.id and type(got) is type(s.id)
            # A client that leaves is detached without any task noticing: the connection does.
            streams[0].close()
            await eventually(lambda: gw.runtime.hub.client_count == 49)
        finally:
            await close_all(streams, tasks)


@pytest.mark.parametrize("http_protocol", ["gateway", "uvicorn"])
async def test_both_http_protocols_deliver_ids_keepalives_and_the_graceful_result(mutable_backend, http_protocol):
    async with running_gateway(settings(mutable_backend, http=http_protocol, keepalive_seconds=0.2)) as gw, \
            httpx.AsyncClient() as http:
        readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=listen_id).open()
                   for listen_id in (7, "7")]
        await http.post(f"http://127.0.0.1:{mutable_backend.port}/change/tools")
        for r in readers:
            await r.wait_count(2)
            got = r.messages[1]["params"]["_meta"][SUB]
            assert r.messages[1]["method"] == TOOLS_CHANGED and got == r.id and type(got) is type(r.id)
            await r.wait(lambda r=r: r.comments >= 2)
        await gw.runtime.begin_shutdown()
        for r in readers:
            await r.wait(lambda r=r: r.ended)
            assert r.messages[-1] == {"jsonrpc": "2.0", "id": r.id,
                                      "result": {"resultType": "complete", "_meta": {SUB: r.id}}}
            assert len(r.messages) == 3


async def test_a_notification_is_encoded_once_per_replica_not_per_stream(mutable_backend, redis_server, monkeypatch):
    """Two in-process replicas sharing Redis, 20 raw streams on each: one change upstream is
    encoded once by each replica (encoding.Outgoing.encode) and reaches all 40 streams."""
    encoded: list[str] = []
    original = Outgoing.encode

    def counting(self: Outgoing) -> bytes:
        encoded.append(self.message["method"])
        return original(self)

    monkeypatch.setattr(Outgoing, "encode", counting)
    config = {"backends": [{"name": "m", "url": mutable_backend.url}],
              "subscriptions": {"redis_url": redis_server.url, "linger_seconds": 0.2, "lease_seconds": 1.5}}
    async with running_gateway(config) as one, running_gateway(config) as two, httpx.AsyncClient() as http:
        streams = [RawListen(i if i % 2 else str(i), {"toolsListChanged": True}) for i in range(40)]
        tasks = [asyncio.create_task(s.run((one if i < 20 else two).port)) for i, s in enumerate(streams)]
        try:
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(1) for s in streams)), 20)
            assert encoded == []
            await http.post(f"http://127.0.0.1:{mutable_backend.port}/change/tools")
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(2) for s in streams)), 20)
            assert encoded == [TOOLS_CHANGED, TOOLS_CHANGED]
            for s in streams:
                got = s.messages()[1]["params"]["_meta"][SUB]
                assert got == s.id and type(got) is type(s.id)
        finally:
            await close_all(streams, tasks)
