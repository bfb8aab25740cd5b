"""1,000 concurrent listen streams through one gateway process share one upstream listen
(counted at the backend), and every one of them receives every notification, tagged with
its own id."""

from __future__ import annotations

import asyncio

import httpx
import yaml

from tests.support.listen import ListenReader, eventually
from tests.support.procs import gateway_process, python_server

CLIENTS = 1000


async def test_a_thousand_listeners_share_one_upstream_listen(tmp_path):
    backend = python_server("mutable_modern.py", name="mutable-fanout").start()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url}],
        "subscriptions": {"max_listens_per_principal": CLIENTS, "max_listens": CLIENTS},
        "observability": {"log_level": "warning"},
    }))
    gateway = gateway_process(config).start()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    try:
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            stats = f"http://127.0.0.1:{backend.port}/stats"
            readers = [ListenReader(http, gateway.url, {"toolsListChanged": True}, id=f"client-{i}")
                       for i in range(CLIENTS)]
            await asyncio.gather(*(r.open() for r in readers))
            for r in readers:
                assert r.status == 200, r.error
                assert r.ack["params"] == {"_meta": {"io.modelcontextprotocol/subscriptionId": r.id},
                                           "notifications": {"toolsListChanged": True}}
            assert (await http.get(stats)).json()["open_listens"] == 1

            for round_ in (1, 2):
                await http.post(f"http://127.0.0.1:{backend.port}/change/tools")
                await asyncio.gather(*(r.wait_count(1 + round_, timeout=30) for r in readers))
            for r in readers:
                assert [(n["method"], n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"])
                        for n in r.notifications] == [("notifications/tools/list_changed", r.id)] * 2
            assert (await http.get(stats)).json()["listens_total"] == 1

            await asyncio.gather(*(r.close() for r in readers))
            # The last client gone, the shared upstream listen closes after its linger.
            await eventually(lambda: _open(http, stats, 0), timeout=30)
    finally:
        gateway.stop()
        backend.stop()


async def _open(http: httpx.AsyncClient, url: str, expected: int) -> bool:
    return (await http.get(url)).json()["open_listens"] == expected
