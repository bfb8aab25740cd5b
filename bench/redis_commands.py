"""What the gateway sends to Redis, counted by Redis itself (`INFO commandstats`), per
operation: a cache hit with and without the local layer, a miss that fills, an invalidation,
and an idle listen stream per lease tick (holder and follower replica). The figures of
docs/scale.md "What goes to Redis".

    /work/.venv/bin/python bench/redis_commands.py [redis-url]   # default: starts its own

Two in-process gateways share the Redis (so the listen lease has a holder and a follower);
the backends are the test fixtures (counting_modern.py, mutable_modern.py).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import mcp_http  # noqa: E402
from tests.support.gateway import running_gateway  # noqa: E402
from tests.support.listen import ListenReader, eventually  # noqa: E402
from tests.support.procs import RedisServer, python_server  # noqa: E402


async def _stats(client: aioredis.Redis) -> dict[str, int]:
    info = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


def _diff(before: dict[str, int], after: dict[str, int], per: int = 1) -> dict[str, float]:
    out = {k: (after[k] - before.get(k, 0)) / per for k in after if after[k] != before.get(k, 0)}
    for noise in ("info",):  # this script's own
        out.pop(noise, None)
    return dict(sorted(out.items()))


async def measure(url: str) -> dict[str, dict[str, float]]:
    counting = python_server("counting_modern.py", name="cmds-counting").start()
    mutable = python_server("mutable_modern.py", name="cmds-mutable").start()
    admin = aioredis.from_url(url)
    results: dict[str, dict[str, float]] = {}
    try:
        def config(local: bool) -> dict[str, Any]:
            return {"backends": [{"name": "counted", "url": counting.url, "resource_prefixes": ["count://"]},
                                 {"name": "m", "url": mutable.url}],
                    "redis": {"url": url},
                    "cache": {"store": "redis", **({} if local else {"local_max_entries": 0})},
                    "subscriptions": {"lease_seconds": 3.0}}

        async with running_gateway(config(False)) as one, running_gateway(config(False)) as two, \
                httpx.AsyncClient(timeout=30) as http:
            async def read(gw: Any, uri: str) -> str:
                response = await mcp_http.post(http, gw.url, "resources/read", {"uri": uri})
                return response.headers["x-cache"]

            await asyncio.sleep(1.0)
            n = 100
            uris = [f"count://public/{uuid.uuid4().hex[:10]}" for _ in range(n)]
            before = await _stats(admin)
            assert {await read(one, u) for u in uris} == {"miss"}
            results["cache miss that fills (per request)"] = _diff(before, await _stats(admin), n)
            before = await _stats(admin)
            assert {await read(two, u) for u in uris} == {"hit"}
            results["cache hit, no local layer (per request)"] = _diff(before, await _stats(admin), n)

            # Idle listen streams: 10 clients on each replica, one upstream stream.
            readers = [await ListenReader(http, gw.url, {"toolsListChanged": True}, id=f"r{i}").open()
                       for i in range(10) for gw in (one, two)]
            await eventually(lambda: any(s.holding for s in one.runtime.hub.upstreams.values())
                             or any(s.holding for s in two.runtime.hub.upstreams.values()))
            await asyncio.sleep(2.0)
            seconds = 10
            before = await _stats(admin)
            await asyncio.sleep(seconds)
            results["listen: one stream, 2 replicas x 10 clients, idle (per second)"] = \
                _diff(before, await _stats(admin), seconds)
            before = await _stats(admin)
            changes = 10
            for _ in range(changes):
                await http.post(f"http://127.0.0.1:{mutable.port}/change/tools")
                await asyncio.sleep(0.05)
            for r in readers:
                await r.wait(lambda r=r: len(r.notifications) >= changes)
            idle = results["listen: one stream, 2 replicas x 10 clients, idle (per second)"]
            spent = _diff(before, await _stats(admin))
            # Commands the idle ticks also send are left out: what remains is the change's own.
            results["listen: one upstream change (list_changed) heard by 20 clients, net of idle ticks"] = {
                k: round(v / changes, 2) for k, v in spent.items() if k not in idle}
            for r in readers:
                await r.close()

        async with running_gateway(config(True)) as one, httpx.AsyncClient(timeout=30) as http:
            uri = f"count://public/{uuid.uuid4().hex[:10]}"
            await mcp_http.post(http, one.url, "resources/read", {"uri": uri})
            await asyncio.sleep(1.2)  # past local_ttl_ms: the next read goes to Redis once
            before = await _stats(admin)
            for _ in range(n):
                await mcp_http.post(http, one.url, "resources/read", {"uri": uri})
            results[f"cache hit, local layer, one hot key ({n} requests in <1 s, total)"] = \
                _diff(before, await _stats(admin))
    finally:
        await admin.aclose()
        counting.stop()
        mutable.stop()
    return results


def main() -> int:
    own = None
    if len(sys.argv) > 1:
        url = sys.argv[1]
    else:
        own = RedisServer().start()
        url = own.url
    try:
        for what, commands in asyncio.run(measure(url)).items():
            shown = ", ".join(f"{k} {v:g}" for k, v in commands.items()) or "nothing"
            print(f"{what}: {shown}")
    finally:
        if own is not None:
            own.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
