"""subscriptions/listen fan-out across two gateway replicas that share a Redis (standalone or
Cluster): the path an upstream event takes through the listen bus.

    /work/.venv/bin/python bench/redis_fanout.py redis://127.0.0.1:6379/0
    /work/.venv/bin/python bench/redis_fanout.py redis+cluster://127.0.0.1:7000 --clients 2000

One mutable fixture backend (mcp==2.3.0), two gateway processes with the same `redis:` block,
N `subscriptions/listen` streams split evenly between them (bench/listen_fanout.py's raw
readers). One replica holds the upstream listen (the lease); every event it hears goes through
Redis pub/sub (sharded on Cluster) to both replicas, which fan it out to their own clients.
`--rounds` times the backend adds a tool and publishes tools/list_changed; reported: p50/p99
over all deliveries and over rounds of the time to the LAST client. It checks what it
measures: one upstream listen for both replicas, every client gets every notification. All
processes share this machine's CPUs: numbers are for comparison within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from listen_fanout import pct  # noqa: E402

from tests.support import mcp_http  # noqa: E402
from tests.support.procs import Proc, gateway_process, python_server  # noqa: E402

# A raw listen stream in this process (bench/listen_fanout.py runs its readers in processes of
# their own, pinned away from the gateway; here both replicas and the readers share the CPUs).
MARK = b"notifications/tools/list_changed"


class Reader:
    """One raw listen stream: counts notifications and stamps their arrival."""

    def __init__(self, i: int) -> None:
        self.id = f"bench-{i}"
        self.acked = asyncio.Event()
        self.arrivals: list[float] = []
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self, port: int) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        body = orjson.dumps(mcp_http.body("subscriptions/listen", {"notifications": {"toolsListChanged": True}},
                                          id=self.id))
        head = "".join(f"{k}: {v}\r\n" for k, v in mcp_http.headers("subscriptions/listen").items())
        self.writer.write(f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}content-length: {len(body)}\r\n\r\n"
                          .encode() + body)
        tail = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            now = time.time()
            data = tail + chunk
            if not self.acked.is_set() and b"subscriptions/acknowledged" in data:
                self.acked.set()
            self.arrivals.extend([now] * data.count(MARK))
            tail = data[-len(MARK):] if MARK not in data[-len(MARK):] else b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()


async def measure(redis_url: str, n: int, rounds: int) -> dict[str, float]:
    backend = python_server("mutable_modern.py", name="bench-mutable").start()
    workdir = Path(tempfile.mkdtemp(prefix="mcp-redis-fanout-"))
    config = workdir / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url}],
        "redis": {"url": redis_url},
        "subscriptions": {"max_listens": n, "max_listens_per_principal": n},
        "observability": {"log_level": "warning"},
    }))
    gateways: list[Proc] = []
    readers = [Reader(i) for i in range(n)]
    try:
        gateways = [gateway_process(config).start(), gateway_process(config).start()]
        async with httpx.AsyncClient(timeout=60) as http:
            control = f"http://127.0.0.1:{backend.port}"
            for gw in gateways:
                await mcp_http.post(http, gw.url, "tools/list")
            for i in range(0, n, 500):
                batch = readers[i:i + 500]
                for j, r in enumerate(batch):
                    r.task = asyncio.create_task(r.run(gateways[(i + j) % 2].port))
                await asyncio.wait_for(asyncio.gather(*(r.acked.wait() for r in batch)), 120)
            await asyncio.sleep(1.0)
            upstreams = (await http.get(f"{control}/stats")).json()["open_listens"]

            deliveries: list[float] = []
            last: list[float] = []
            for k in range(1, rounds + 1):
                published_at = (await http.post(f"{control}/change/tools")).json()["published_at"]

                async def all_arrived(k: int = k) -> None:
                    while any(len(r.arrivals) < k for r in readers):
                        await asyncio.sleep(0.005)

                await asyncio.wait_for(all_arrived(), 120)
                round_latencies = [r.arrivals[k - 1] - published_at for r in readers]
                deliveries.extend(round_latencies)
                last.append(max(round_latencies))
                await asyncio.sleep(0.2)
            complete = all(len(r.arrivals) == rounds for r in readers)
    finally:
        for r in readers:
            r.close()
        await asyncio.gather(*(r.task for r in readers if r.task is not None), return_exceptions=True)
        for gw in gateways:
            gw.stop()
        backend.stop()
    return {
        "n": n, "upstreams": upstreams, "complete": complete,
        "p50_ms": pct(deliveries, 0.5) * 1000, "p99_ms": pct(deliveries, 0.99) * 1000,
        "last_p50_ms": statistics.median(last) * 1000, "last_p99_ms": pct(last, 0.99) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("redis_url")
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    started = time.perf_counter()
    r = asyncio.run(measure(args.redis_url, args.clients, args.rounds))
    print({**r, "seconds": round(time.perf_counter() - started, 1)})
    return 0 if r["complete"] and r["upstreams"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
