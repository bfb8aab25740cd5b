"""What one telemetry setting costs per request, measured A/B in one process.

bench/inprocess.py measures one configuration per process; on a noisy machine two processes
minutes apart differ by more than what a setting costs. This builds two gateway apps in the
same process, against the same backend (`bench/backend.py`), and alternates measured rounds
between them (A, B, A, B, ...), so that drift hits both alike; it reports the median CPU per
request of each and the median of the paired differences.

    python bench/telemetry_ab.py                         # A: defaults, B: JSON access log on
    python bench/telemetry_ab.py --b tracing             # B: JSON access log + tracing at 100 %
    python bench/telemetry_ab.py --rounds 15 --requests 10000

Access lines and spans go to a temporary file (fd 1 and 2 point at it); figures to the terminal.
Takes the bench lock like run.py.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from gateway.app import build_app  # noqa: E402
from gateway.observability import tracing  # noqa: E402
from gateway.settings import GatewaySettings  # noqa: E402
from inprocess import free_port, measure, started, take_lock  # noqa: E402


async def main_async(args: argparse.Namespace, url: str) -> tuple[list[float], list[float]]:
    backend = [{"name": "bench", "url": url, "era": "modern", "prefix": ""}]
    a = build_app(GatewaySettings(backends=backend))
    observability: dict[str, Any] = {"access_log": True, "log_format": "json"}
    b = build_app(GatewaySettings(backends=backend, observability=observability))
    lifespans = [await started(a), await started(b)]
    results: tuple[list[float], list[float]] = ([], [])
    try:
        for _ in range(args.rounds):
            for index, app in enumerate((a, b)):
                if args.b == "tracing":
                    # The tracer is process-wide: on for B's rounds only (every request sampled,
                    # every span exported by the console exporter into the file).
                    tracing.configure(index == 1, "console")
                results[index].extend(await measure(app, "call", args.callers, args.requests, 1, False))
    finally:
        for queue, task in lifespans:
            await queue.put({"type": "lifespan.shutdown"})
            await task
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--b", choices=("access-log", "tracing"), default="access-log",
                   help="what B adds to the defaults (tracing: the access log and tracing at 100 %%)")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--requests", type=int, default=10_000, help="requests per round")
    p.add_argument("--rounds", type=int, default=11, help="rounds per app, alternated")
    args = p.parse_args(argv)
    report = os.fdopen(os.dup(1), "w")
    sink = tempfile.NamedTemporaryFile(prefix="telemetry-ab-", suffix=".log", delete=False)
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    with take_lock(900):
        port = free_port()
        pin = ["taskset", "-c", "0"] if (os.cpu_count() or 1) >= 2 else []
        backend = subprocess.Popen([*pin, sys.executable, str(BENCH / "backend.py"), "--port", str(port),
                                    "--mode", "modern", "--tools", "50", "--ttl-ms", "60000"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            if (os.cpu_count() or 1) >= 2:
                os.sched_setaffinity(0, {1})
            import uvloop

            a, b = uvloop.run(main_async(args, f"http://127.0.0.1:{port}/mcp"))
        finally:
            backend.kill()
            backend.wait(timeout=5)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    diffs = [y - x for x, y in zip(a, b, strict=True)]
    print(f"A (defaults): median {median(a):.1f} µs/request; B ({args.b}): median {median(b):.1f} µs/request; "
          f"paired B-A: median {median(diffs):+.1f} µs (min {min(diffs):+.1f}, max {max(diffs):+.1f}) "
          f"over {len(diffs)} pairs of {args.requests} requests; lines in {sink.name}", file=report, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
