"""What one `/metrics` scrape costs with many per-request series, for any tree.

100 backends × 20 tools × 2 outcomes: 4,000 label sets of the loop-owned families, each fed
(one counter, two histograms with the gateway's two bucket layouts) the way a backend call
feeds them, then `generate_latest` timed five times (the minimum printed). The scrape runs on
the event loop that answers requests, so its length is a pause for them.

    python bench/scrape_cost.py            # this tree
    python bench/scrape_cost.py /some/tree # another tree's gateway/

Figures: bench/README.md "The ≤ 5 µs budget, the whole request".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from gateway.observability import loop_metrics  # noqa: E402
from gateway.observability.metrics import LATENCY_BUCKETS, MCP_OPERATION_BUCKETS  # noqa: E402


def main() -> int:
    registry = CollectorRegistry()
    calls = loop_metrics.Counter("bench_calls_total", "Calls.", ["backend", "tool", "outcome"])
    first_byte = loop_metrics.Histogram("bench_first_byte_seconds", "First byte.", ["backend", "tool"],
                                        buckets=LATENCY_BUCKETS)
    duration = loop_metrics.Histogram("bench_duration_seconds", "Duration.", ["tool", "outcome"],
                                      buckets=MCP_OPERATION_BUCKETS)
    loop_metrics.register([calls, first_byte, duration], registry=registry)
    made = 0
    for backend in map(str, range(100)):
        for tool in map(str, range(20)):
            for outcome in ("ok", "tool_error"):
                children = ([calls.labels(backend, tool, outcome)],
                            [first_byte.labels(backend, tool), duration.labels(tool, outcome)])
                # Trees from before the Events: one Event class taking the children.
                make = getattr(loop_metrics, "event", None) or loop_metrics.Event
                make(*children).add(0.0003)
                made += 1
    times, size = [], 0
    for _ in range(5):
        started = time.perf_counter()
        size = len(generate_latest(registry))
        times.append(time.perf_counter() - started)
    print(f"{made} label sets, {size:,} bytes of exposition: {min(times) * 1000:.1f} ms per scrape (min of 5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
