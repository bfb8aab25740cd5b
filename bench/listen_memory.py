"""Where the memory of an idle listen stream goes: tracemalloc in an in-process gateway.

    .venv/bin/python bench/listen_memory.py --streams 2000

Starts the mutable fixture backend and a gateway in this process (the production uvicorn
configuration, the gateway's own HTTP/1.1 protocol), opens `--streams` listen streams from a
reader process (bench/listen_fanout.py's), waits until they are idle, and prints the Python
heap they added per stream, grouped by the line that allocated it, and the RSS added per
stream. Python's heap is not all of it: uvloop's and llhttp's C structures (the libuv handle,
the parser) are allocated with malloc and show only in RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import listen_fanout  # noqa: E402

from tests.support.gateway import running_gateway  # noqa: E402
from tests.support.procs import python_server  # noqa: E402


async def main(streams: int, top: int) -> None:
    backend = python_server("mutable_modern.py", name="bench-mutable").start()
    try:
        settings = {"backends": [{"name": "m", "url": backend.url}],
                    "subscriptions": {"max_listens": streams, "max_listens_per_principal": streams}}
        async with running_gateway(settings) as gw:
            await asyncio.sleep(0.5)
            gc.collect()
            tracemalloc.start(1)
            rss_before = listen_fanout.rss_bytes(os.getpid())
            before = tracemalloc.take_snapshot()
            reader = await listen_fanout._ReaderProcess.start([gw.port], 0, streams, None)
            await reader.expect("ready")
            await asyncio.sleep(1.0)
            gc.collect()
            after = tracemalloc.take_snapshot()
            rss_after = listen_fanout.rss_bytes(os.getpid())
            assert gw.runtime.hub.client_count == streams
            stats = after.compare_to(before, "lineno")
            total = sum(s.size_diff for s in stats)
            print(f"{streams} idle streams: Python heap +{total / streams:.0f} B/stream, "
                  f"RSS +{(rss_after - rss_before) / streams:.0f} B/stream (tracemalloc's own bookkeeping included)")
            for s in stats[:top]:
                frame = s.traceback[0]
                print(f"{s.size_diff / streams:>8.0f} B {s.count_diff / streams:>6.2f} blocks  "
                      f"{frame.filename.split('site-packages/')[-1].split('i24-fanout/')[-1]}:{frame.lineno}")
            reader.kill()
    finally:
        backend.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    import uvloop
    uvloop.install()
    asyncio.run(main(args.streams, args.top))
