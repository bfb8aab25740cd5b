"""bench/listen_fanout.py's measurement, end to end at a small N: a real gateway process and
fixture backend, the reader processes each kind of reader runs, its `ready` / `wait` / `dump`
conversation, and what a row reports (every stream got every notification, checked, with
one upstream listen). It calls the measurement below `measure()`, which would also set the
machine's loopback steering and input backlog for other tenants' runs: neither is left to a
test to change."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import listen_fanout


@pytest.mark.parametrize(("readers", "processes"), [("epoll", 1), ("epoll", 2), ("paced", 2)])
def test_a_small_fanout_is_delivered_checked_and_counted(readers, processes):
    n, rounds = 24, 3
    r = asyncio.run(listen_fanout._measure(n, rounds, replicas=1, tree=None, pinned=False, nice=0, perf=None,
                                           perf_cpu=None, readers=readers, reader_processes=processes))
    assert r["upstreams"] == 1
    assert r["complete"] is True and r["wrong"] == 0
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["last_p99_ms"] < 10_000
    assert r["loop_p50_ms"] is not None and r["loop_p50_ms"] > 0  # this tree's write-loop metric was read
    assert set(r["tcp_retransmits"]) == {"RetransSegs", "TCPLossProbes", "TCPTimeouts"}
    assert len(r["backlog_drops_per_cpu"]) == len(r["net_rx_per_cpu"])
