"""CPU time per request of trees compared in fine alternation: what instruction counts cost.

On this 2-core VM the CPU time of one identical run moves by ±10–20 µs per request between runs
minutes apart (the host's load, the CPU's clock): whole runs, one tree after another, cannot
tell a few µs apart. Here every tree runs in a process of its own that stays up, warmed, and the
trees take turns in short rounds (`--requests` each, a fraction of a second), A B B A, A B B A,
...: what drifts over seconds hits both trees of a pair alike and cancels in their difference.
Each round reports `time.process_time()` per request (user and system: exact, the scheduler's
runtime), the same pass-through `tools/call` loop as bench/instructions.py (its `tree_app`:
the same app, options and request; 32 callers by default, as under load), with garbage
collection on, as in a gateway.

    python bench/paired_cpu.py --tree pre21=/work/wt/base-pre21 --tree this=.:access-log-batched

Prints the median CPU per request of every tree, and for each tree after the first the median
of its paired differences to the first with a 95 % interval for that median (from the order
statistics of the pairs: no distribution assumed). Takes the bench lock like run.py.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _serve(tree: str, option: str, port: int, callers: int, requests: int, warmup: int, no_gc: bool) -> None:
    """The inner process: the tree's app, warmed; then a round per line read from stdin, each
    answered on stderr with its CPU time per request (stdout may be the access log's file)."""
    sys.path.append(str(BENCH))
    from instructions import tree_app

    app, body, headers = tree_app(tree, option, port)
    from inprocess import call_once, started

    async def caller(n: int) -> None:
        for _ in range(n):
            await call_once(app, body, headers)

    async def main() -> None:
        lifespan, task = await started(app)
        await caller(warmup)
        gc.collect()
        gc.freeze()  # the warm-up's objects, as a long-running gateway's start-up ones
        if no_gc:
            gc.disable()
        loop = asyncio.get_running_loop()
        print("READY", file=sys.stderr, flush=True)
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "round":
            before, cpu = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            await asyncio.gather(*(caller(requests // callers) for _ in range(callers)))
            cpu, after = time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF)
            done = requests // callers * callers
            # getrusage's user/system split is sampled at scheduler ticks: indicative only.
            print(f"ROUND {1e6 * cpu / done:.4f} user={1e6 * (after.ru_utime - before.ru_utime) / done:.2f} "
                  f"system={1e6 * (after.ru_stime - before.ru_stime) / done:.2f} "
                  f"minflt={(after.ru_minflt - before.ru_minflt) / done:.3f} "
                  f"nvcsw={(after.ru_nvcsw - before.ru_nvcsw) / done:.3f} "
                  f"nivcsw={(after.ru_nivcsw - before.ru_nivcsw) / done:.3f}", file=sys.stderr, flush=True)
        await lifespan.put({"type": "lifespan.shutdown"})
        await task

    import uvloop

    uvloop.run(main())


class _Tree:
    """One tree's serving process, driven a round at a time."""

    def __init__(self, spec: str, port: int, args: argparse.Namespace) -> None:
        self.name, _, where = spec.partition("=")
        tree, _, option = where.partition(":")
        self.tree = str(Path(tree).resolve())
        python = str(Path(self.tree) / ".venv/bin/python")
        argv = [python if os.path.exists(python) else sys.executable, __file__, "--serve", self.tree,
                "--option", option, "--port", str(port), "--callers", str(args.callers),
                "--requests", str(args.requests), "--warmup", str(args.warmup)] + (["--no-gc"] if args.no_gc else [])
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        text=True, cwd=self.tree, env={**os.environ, "PYTHONHASHSEED": "0"})
        self.rounds: list[float] = []
        self.details: dict[str, list[float]] = {}  # user, system, minflt, nvcsw, nivcsw: per request, per round
        self._expect("READY")

    def _expect(self, word: str) -> str:
        assert self.process.stdout is None and self.process.stderr is not None
        seen = []
        for line in self.process.stderr:
            if line.startswith(word):
                return line[len(word):].strip()
            seen.append(line)
        raise SystemExit(f"{self.name}: the serving process ended:\n{''.join(seen[-40:])}")

    def round(self) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        cpu, *others = self._expect("ROUND").split()
        self.rounds.append(float(cpu))
        for pair in others:
            key, value = pair.split("=")
            self.details.setdefault(key, []).append(float(value))
        return self.rounds[-1]

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def median_interval(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % interval for the median: the order statistics k and n-1-k, with
    k from the binomial(n, 1/2) quantile (normal approximation, fine from ~20 values)."""
    ordered = sorted(values)
    n = len(ordered)
    k = max(0, math.floor(n / 2 - 1.96 * math.sqrt(n) / 2))
    return ordered[k], ordered[n - 1 - k]


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--tree", action="append", default=[], help="NAME=DIR[:access-log|:access-log-batched], repeatable")
    p.add_argument("--pairs", type=int, default=60, help="A B B A blocks (default 60: 120 rounds of each tree)")
    p.add_argument("--requests", type=int, default=3200, help="requests per round (default 3,200)")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--warmup", type=int, default=3000)
    p.add_argument("--no-gc", action="store_true",
                   help="garbage collection off in the measured rounds, as bench/instructions.py counts them")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--option", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        _serve(args.serve, args.option, args.port, args.callers, args.requests, args.warmup, args.no_gc)
        return 0
    if len(args.tree) < 2:
        p.error("give two trees or more: the first is the one the others are compared with")
    from run import take_lock

    with take_lock(900):
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from inprocess import bench_backend
    from run import free_port

    port = free_port()
    backend = bench_backend(port, pinned=False)
    trees: list[_Tree] = []
    try:
        trees = [_Tree(spec, port, args) for spec in args.tree]
        print(f"load before: {os.getloadavg()[0]:.2f}; {args.pairs} blocks of A B B A, {args.requests:,} requests "
              f"per round, {args.callers} callers", flush=True)
        first, others = trees[0], trees[1:]
        paired: dict[str, list[float]] = {t.name: [] for t in others}
        for _ in range(args.pairs):
            for other in others:
                # A B B A: a drift within the block hits both trees alike, first order cancelled.
                a1, b1, b2, a2 = first.round(), other.round(), other.round(), first.round()
                paired[other.name].append((b1 + b2 - a1 - a2) / 2)
        print(f"load after: {os.getloadavg()[0]:.2f}", flush=True)
        for t in trees:
            print(f"{t.name}: median {statistics.median(t.rounds):.2f} µs CPU per request "
                  f"(min {min(t.rounds):.2f}, max {max(t.rounds):.2f}; {len(t.rounds)} rounds; {t.tree}); medians per "
                  f"request: " + ", ".join(f"{k} {statistics.median(v):g}" for k, v in t.details.items()), flush=True)
        for name, diffs in paired.items():
            low, high = median_interval(diffs)
            print(f"{name} − {first.name}: median {statistics.median(diffs):+.2f} µs per request, 95 % interval "
                  f"{low:+.2f} … {high:+.2f} ({len(diffs)} blocks)", flush=True)
    finally:
        for t in trees:
            t.close()
        backend.kill()
        backend.wait(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
