"""Bench-only launcher: `mcp-gateway serve` with its memory cache pre-filled with N entries.

    python bench/prefilled_gateway.py --entries 100000 --stats-out s.json \\
        serve --config gateway.yaml --host 127.0.0.1 --port 8080

Used by ``bench/run.py``'s ``cache-scale`` workload.  It adds no endpoint to the gateway:
before serving, it builds the cache the configuration asks for (``build_cache``) and fills it
through the cache service's own ``fetch`` path, the one the dispatcher uses, with N public
``resources/read`` answers of the first configured backend (URIs ``bench://fill/0`` ...,
a ~40-byte text each; each entry gets its key, tags and LRU slot exactly as a real read
would).  Then it runs the normal CLI (``gateway.cli.main``) with the runtime's cache factory
swapped for one returning that filled cache, so an HTTP ``resources/read`` of
``bench://fill/<i>`` is a hit on an N-entry store.

It also writes ``--stats-out`` (JSON):

- ``bytes_per_entry``: process RSS after the fill minus before, divided by N (key strings,
  Entry and LRU slot objects, tag index, the result dicts themselves);
- ``fill_seconds``: how long the N misses-with-store took;
- ``hit_us_random`` / ``hit_us_hot``: an in-process micro-benchmark of ``StoreCache.fetch``
  hits (no HTTP): mean over a batch of lookups of random entries, and of one hot entry.
  Random lookups touch memory all over the store, so they show what the size costs once
  the CPU caches no longer hold it.

The cache must be ``store: memory`` with ``max_entries`` above N (run.py writes that config).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.backends.base import internal_call  # noqa: E402
from gateway.cache.factory import build_cache  # noqa: E402
from gateway.routing.table import Target  # noqa: E402
from gateway.settings import load_settings  # noqa: E402

FILL_TTL_MS = 3_600_000
PROBES = 20_000


def fill_uri(i: int) -> str:
    return f"bench://fill/{i}"


def fill_answer(i: int) -> dict:
    return {"jsonrpc": "2.0", "id": i, "result": {
        "resultType": "complete",
        "contents": [{"uri": fill_uri(i), "mimeType": "text/plain", "text": f"fill entry {i}"}],
        "ttlMs": FILL_TTL_MS, "cacheScope": "public"}}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def fill_and_probe(cache, target, n: int) -> dict:
    async def answer(i: int) -> dict:
        return fill_answer(i)

    async def must_not_load() -> dict:
        raise AssertionError("probe missed the pre-filled cache")

    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    for i in range(n):
        call = internal_call("resources/read", {"uri": fill_uri(i)}, request_id=i)
        _, outcome = await cache.fetch(target, call, lambda i=i: answer(i))
        if outcome != "miss":
            raise RuntimeError(f"fill entry {i}: expected a miss that stores, got {outcome!r}")
    fill_seconds = time.perf_counter() - started
    gc.collect()
    after = rss_bytes()
    stored = len(cache.store)
    if stored != n:
        raise RuntimeError(f"store holds {stored} entries after filling {n} (evicted? max_entries "
                           "/ max_bytes too small)")

    rng = random.Random(6)
    randoms = [internal_call("resources/read", {"uri": fill_uri(rng.randrange(n))}, request_id=1)
               for _ in range(PROBES)]
    hot = [internal_call("resources/read", {"uri": fill_uri(n - 1)}, request_id=1)
           for _ in range(PROBES)]
    for call in hot[:2_000]:  # warm-up: first-use costs (metric label children, memo dicts)
        await cache.fetch(target, call, must_not_load)
    timings = {}
    for label, calls in (("hit_us_random", randoms), ("hit_us_hot", hot)):
        t0 = time.perf_counter()
        for call in calls:
            _, outcome = await cache.fetch(target, call, must_not_load)
            if outcome != "hit":
                raise RuntimeError(f"probe {call.params['uri']}: expected a hit, got {outcome!r}")
        timings[label] = (time.perf_counter() - t0) / len(calls) * 1e6
    return {"entries": n, "bytes_per_entry": (after - before) / n, "rss_after_fill": after,
            "fill_seconds": fill_seconds, **timings}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, required=True)
    p.add_argument("--stats-out", type=Path, required=True)
    a, cli_argv = p.parse_known_args(argv)
    if "--config" not in cli_argv:
        p.error("pass the gateway CLI arguments: serve --config F --host H --port P")
    settings = load_settings(cli_argv[cli_argv.index("--config") + 1])
    if settings.cache.store != "memory" or settings.cache.max_entries < a.entries:
        p.error("the config needs cache.store: memory and cache.max_entries >= --entries")
    cache = build_cache(settings.cache)
    first = settings.backends[0]
    # The cache reads only a backend's name and settings (key fingerprint); no connection.
    target = Target(SimpleNamespace(name=first.name, settings=first), settings.prefix_of(first))  # type: ignore[arg-type]
    stats = asyncio.run(fill_and_probe(cache, target, a.entries))
    a.stats_out.write_text(json.dumps(stats))
    print(f"prefilled: {json.dumps(stats)}", file=sys.stderr, flush=True)

    import gateway.runtime
    from gateway import cli

    gateway.runtime.build_cache = lambda *_args: cache  # the filled one, for this process
    return cli.main(cli_argv)


if __name__ == "__main__":
    sys.exit(main())
