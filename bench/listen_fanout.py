"""subscriptions/listen fan-out: delivery latency and memory per idle stream.

    /work/.venv/bin/python bench/listen_fanout.py                 # N = 1,000 and 10,000
    /work/.venv/bin/python bench/listen_fanout.py --clients 1000 --rounds 10

For each N it starts a fresh mutable fixture backend (mcp==2.3.0) and a fresh gateway process,
opens N `subscriptions/listen` streams (toolsListChanged) from this process with raw asyncio
sockets (light enough that 10,000 readers fit in one process), then:

- memory per idle stream: gateway RSS after all N streams are acknowledged and idle, minus
  its RSS before the first stream, divided by N;
- fan-out latency: `--rounds` times, the backend adds a tool and publishes
  tools/list_changed (it answers the wall-clock time of the publish); every client records
  the wall-clock time its notification arrived. Reported: p50/p99 over all deliveries, and
  p50/p99 over rounds of the time to the LAST of the N clients.

It also checks what it measures: the backend must hold exactly one upstream listen, and every
client must receive every notification. All processes run on this machine, so readers and
gateway share CPUs: numbers are informational, for comparison between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import mcp_http  # noqa: E402
from tests.support.procs import Proc, gateway_process, python_server  # noqa: E402

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


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def measure(n: int, rounds: int) -> dict[str, float]:
    backend = python_server("mutable_modern.py", name="bench-mutable").start()
    workdir = Path(tempfile.mkdtemp(prefix="mcp-listen-bench-"))
    config = workdir / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url}],
        "subscriptions": {"max_listens": n, "max_listens_per_principal": n},
        "observability": {"log_level": "warning"},
    }))
    gateway: Proc = gateway_process(config).start()
    readers = [Reader(i) for i in range(n)]
    try:
        assert gateway.proc is not None
        async with httpx.AsyncClient(timeout=60) as http:
            control = f"http://127.0.0.1:{backend.port}"
            # Warm the gateway (imports, pools) before the baseline RSS.
            await mcp_http.post(http, gateway.url, "tools/list")
            await asyncio.sleep(0.5)
            rss_before = rss_bytes(gateway.proc.pid)

            started = time.perf_counter()
            for i in range(0, n, 500):  # in batches: a connection storm measures the backlog, not us
                batch = readers[i:i + 500]
                for r in batch:
                    r.task = asyncio.create_task(r.run(gateway.port))
                await asyncio.wait_for(asyncio.gather(*(r.acked.wait() for r in batch)), 120)
            open_seconds = time.perf_counter() - started
            await asyncio.sleep(1.0)
            rss_idle = rss_bytes(gateway.proc.pid)
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
        gateway.stop()
        backend.stop()
    return {
        "n": n, "upstreams": upstreams, "complete": complete, "open_s": open_seconds,
        "p50_ms": pct(deliveries, 0.5) * 1000, "p99_ms": pct(deliveries, 0.99) * 1000,
        "last_p50_ms": statistics.median(last) * 1000, "last_p99_ms": pct(last, 0.99) * 1000,
        "rss_per_stream_kb": (rss_idle - rss_before) / n / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"listen fan-out, {os.cpu_count()} CPUs; latency = backend publish -> client receives (wall clock)")
    print(f"{'N':>7} {'upstreams':>9} {'all got all':>11} {'open (s)':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'last p50':>9} {'last p99':>9} {'RSS/stream':>11}")
    for n in args.clients:
        r = asyncio.run(measure(n, args.rounds))
        print(f"{r['n']:>7} {r['upstreams']:>9} {str(r['complete']):>11} {r['open_s']:>8.1f} {r['p50_ms']:>8.1f} "
              f"{r['p99_ms']:>8.1f} {r['last_p50_ms']:>9.1f} {r['last_p99_ms']:>9.1f} "
              f"{r['rss_per_stream_kb']:>8.1f} KB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
