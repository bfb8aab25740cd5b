"""What 20 authorization rules and 3 rate limits (memory) cost a pass-through call, in CPU per
request: two gateways in one process (no rules; bench/run.py governance-call's rules and
limits), one backend, measured round by round in alternation (A B, B A, A B, ...), so that a
noisy neighbour slows both alike. Each round is bench/inprocess.py's loop (`measure`): the
gateway's ASGI app called directly by 32 concurrent callers, `time.process_time()` per request.

    python bench/governance_budget.py                 # 20 rounds of 5,000 calls per variant
    python bench/governance_budget.py --rounds 40 --requests 10000
    python bench/governance_budget.py --redis         # and the same limits in a redis-server

Prints per variant the min and median, and the median of the per-round differences (governed
minus plain): the figure the issue's budget (≤ 10 µs) is about. With `--redis` a third variant
keeps the limits in a fresh local redis-server (`cache.store: redis`), and the redis-server's
own CPU per request (utime + stime from /proc) is printed beside the gateway's: what the shared
limiter costs. Takes the bench lock.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from inprocess import bench_backend, measure, started  # noqa: E402
from run import free_port, governance_yaml, take_lock  # noqa: E402

from gateway.app import build_app  # noqa: E402
from gateway.settings import GatewaySettings  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (utime + stime), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(backend_url: str, rounds: int, requests: int, callers: int,
              redis: subprocess.Popen[bytes] | None = None, redis_url: str = "") -> dict[str, list[float]]:
    backend = [{"name": "bench", "url": backend_url, "era": "modern", "prefix": ""}]
    governance = yaml.safe_load(governance_yaml("memory"))
    governance.pop("cache", None)
    variants = {
        "plain": GatewaySettings(backends=backend, cache={"store": "memory"}),
        "governed": GatewaySettings(backends=backend, cache={"store": "memory"}, **governance),
    }
    if redis is not None:
        variants["governed-redis"] = GatewaySettings(backends=backend, cache={"store": "redis", "redis_url": redis_url},
                                                     **governance)
    apps = {}
    for name, settings in variants.items():
        app = build_app(settings)
        apps[name] = (app, *await started(app))
    results: dict[str, list[float]] = {name: [] for name in variants}
    if redis is not None:
        results["redis-server"] = []
    try:
        order = list(variants)
        for round_ in range(rounds):
            for name in order if round_ % 2 == 0 else reversed(order):
                redis_before = cpu_seconds(redis.pid) if redis is not None else 0.0
                results[name] += await measure(apps[name][0], "call", callers, requests, 1, False)
                if redis is not None and name == "governed-redis":
                    # Every call measure() made: its 200 warm-up calls, then the round's.
                    calls = 200 + requests // callers * callers
                    results["redis-server"].append(1e6 * (cpu_seconds(redis.pid) - redis_before) / calls)
    finally:
        for _, lifespan, task in apps.values():
            await lifespan.put({"type": "lifespan.shutdown"})
            await task
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=20, help="rounds per variant (default 20)")
    p.add_argument("--requests", type=int, default=5000, help="calls per round (default 5,000)")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--redis", action="store_true", help="add the limits in a fresh redis-server (a third variant)")
    args = p.parse_args(argv)
    with take_lock(900):
        port = free_port()
        backend = bench_backend(port)
        redis = None
        redis_port = free_port()
        if args.redis:
            redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", redis_port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        try:
            if (os.cpu_count() or 1) >= 2:
                os.sched_setaffinity(0, {1})
            import uvloop

            results = uvloop.run(run(f"http://127.0.0.1:{port}/mcp", args.rounds, args.requests, args.callers,
                                     redis, f"redis://127.0.0.1:{redis_port}/0"))
        finally:
            backend.kill()
            backend.wait(timeout=5)
            if redis is not None:
                redis.kill()
                redis.wait(timeout=5)
    for name, values in results.items():
        print(f"{name:14s} CPU per request: min {min(values):.1f} µs, median {statistics.median(values):.1f} µs "
              f"over {len(values)} rounds of {args.requests}")
    diffs = [g - p for p, g in zip(results["plain"], results["governed"], strict=True)]
    print(f"governed − plain, per round: median {statistics.median(diffs):+.1f} µs "
          f"(min of each: {min(results['governed']) - min(results['plain']):+.1f} µs)")
    if args.redis:
        diffs = [g - p for p, g in zip(results["plain"], results["governed-redis"], strict=True)]
        print(f"governed-redis − plain, per round: median {statistics.median(diffs):+.1f} µs of the gateway's CPU, "
              f"plus {statistics.median(results['redis-server']):.1f} µs of redis-server's (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
