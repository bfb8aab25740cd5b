"""Instructions per request, counted by valgrind, for trees compared in the same run.

On a machine shared with other tenants, CPU time per request moves by ±10–30 µs between
identical runs, more than a few-µs cost can be told from. An instruction count does not depend
on the load: this runs bench/inprocess.py's pass-through `tools/call` loop (32 callers, the
backend `bench/backend.py` in its own process, not counted) under `valgrind --tool=callgrind`
twice per configuration, with `--small` and `--large` requests after the same warm-up, and
reports (instructions(large) − instructions(small)) / (large − small): the gateway process's
instructions per request, start-up and warm-up cancelled out.

    python bench/instructions.py --tree pre21=/work/wt/base-pre21 --tree base=/work/wt/base \\
        --tree this=. --tree this-json=.:access-log

A tree is a directory holding gateway/ (its own .venv/bin/python when it has one); `:access-log`
turns `observability: {log_format: json, access_log: true}` on (lines to a temporary file);
`:access-log-batched` too, its lines written 256 at a time as under load (see `_inner`);
`:governance` configures bench/run.py governance-call's 20 rules and 3 memory rate limits
(issue 19's budget: `--tree plain=. --tree governed=.:governance`).

Steady counts: `--callers 1` (one request at a time: every request the same loop passes; with
32 callers how many share a pass follows the backend's timing, ±25,000 instructions between
runs), the hash seed fixed, no garbage collection inside the counted part (its timing follows
every allocation before it; the allocations themselves are counted), `--repeat` to see the
spread. What still moves: work done per unit of wall time (timers), which valgrind's slowness
turns into work per request.
No bench lock is taken: instruction counts are not disturbed by other processes. Needs valgrind
(Debian's package). Instructions are not time: bench/README.md "Observability" says how the
counts relate to µs on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def tree_app(tree: str, option: str, port: int) -> tuple[Any, bytes, list[tuple[bytes, bytes]]]:
    """The tree's gateway app as these counts run it, and the request they send: the tree's
    gateway imported (not this bench's), `option` applied (see the module's docstring)."""
    sys.path[:0] = [tree]
    sys.path.append(str(BENCH))
    # The tree's gateway is imported before bench/inprocess.py, which puts *this* bench's tree
    # first on sys.path when imported: imported first, it made every --tree count this tree.
    import gateway
    from gateway.app import build_app
    from gateway.settings import GatewaySettings

    from inprocess import request  # the same request as bench/inprocess.py

    if not gateway.__file__.startswith(tree + os.sep):
        raise SystemExit(f"counted {gateway.__file__}, not the tree {tree}")

    extra: dict[str, Any] = {}
    access_log = option if option.startswith("access-log") else ""
    if option == "governance":
        # bench/run.py governance-call's 20 rules and 3 memory rate limits (this bench's copy
        # of run.py, so every tree is counted with the same rules).
        import yaml
        from run import governance_yaml

        extra.update({k: v for k, v in yaml.safe_load(governance_yaml("memory")).items() if k != "cache"})
    if access_log:
        sink = tempfile.NamedTemporaryFile(prefix="instructions-access-", suffix=".log", delete=False)
        os.dup2(sink.fileno(), 1)
        extra["observability"] = {"access_log": True, "log_format": "json"}
    backend = {"name": "bench", "url": f"http://127.0.0.1:{port}/mcp", "era": "modern", "prefix": "",
               "timeout_seconds": 120, "list_timeout_seconds": 120}
    # Under valgrind everything is ~40x slower: no active health checks or ejections to time
    # out meanwhile (trees from before issue 18 have no `health` block: they had neither).
    try:
        settings = GatewaySettings(backends=[{**backend, "health": {"check_interval_seconds": 0,
                                                                    "consecutive_failures": 1_000_000}}],
                                   cache={"store": "memory"}, **extra)
    except ValueError:
        settings = GatewaySettings(backends=[backend], cache={"store": "memory"}, **extra)
    app = build_app(settings)
    if access_log == "access-log-batched":
        # Under valgrind a request takes ~10 ms: the access log's 50 ms timer would write every
        # ~5 lines, where a loaded gateway (~14,000 requests a second) fills its 256-line batch
        # first. The timer is pushed out so that batches are of 256 lines, as under that load.
        from gateway.observability import logs

        logs._FLUSH_SECONDS = 3600.0
    body, headers = request("call")
    return app, body, headers


def _inner(tree: str, requests: int, option: str, port: int, callers: int) -> None:
    """Runs under valgrind: the tree's gateway app, warmed, then `requests` calls."""
    app, body, headers = tree_app(tree, option, port)
    from inprocess import call_once, started

    async def one() -> None:
        await call_once(app, body, headers)

    async def main() -> None:
        lifespan, task = await started(app, timeout=120)  # valgrind: everything ~40x slower
        for _ in range(300):
            await one()
        # No collection inside the counted part: when a collection falls depends on every
        # allocation before it, so it moved whole-request counts between runs. The warm-up's
        # objects are frozen out of later collections, as before.
        gc.collect()
        gc.freeze()
        gc.disable()

        async def caller(n: int) -> None:
            for _ in range(n):
                await one()

        await asyncio.gather(*(caller(requests // callers) for _ in range(callers)))
        await lifespan.put({"type": "lifespan.shutdown"})
        await task

    import uvloop

    uvloop.run(main())


def _count(python: str, tree: str, requests: int, option: str, port: int, callers: int) -> int:
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, __file__, "--inner", tree,
            "--requests", str(requests), "--port", str(port), "--callers", str(callers)] + (
                ["--option", option] if option else [])
    # One hash seed for every run: str hashes (dict and set probing, their collisions) are then
    # the same in every run and every tree.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tree, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{tree}: valgrind run failed:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--tree", action="append", default=[],
                   help="NAME=DIR[:access-log|:access-log-batched], repeatable")
    p.add_argument("--callers", type=int, default=32,
                   help="concurrent callers (1: one request at a time, every request the same loop passes; "
                        "with 32, how many requests share a pass depends on the backend's timing, and moved "
                        "counts by up to ±25,000 between runs)")
    p.add_argument("--small", type=int, default=320)
    p.add_argument("--large", type=int, default=1920)
    p.add_argument("--repeat", type=int, default=1,
                   help="count each tree this many times (small and large each time), trees interleaved; "
                        "the median and the spread are printed")
    p.add_argument("--inner", help=argparse.SUPPRESS)
    p.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--option", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        _inner(args.inner, args.requests, args.option, args.port, args.callers)
        return 0
    from inprocess import bench_backend
    from run import free_port

    port = free_port()
    backend = bench_backend(port, pinned=False)
    try:
        counts: dict[str, list[float]] = {}
        for repeat in range(args.repeat):  # trees interleaved: a drift in the machine hits all alike
            for spec in args.tree:
                name, _, where = spec.partition("=")
                tree, _, option = where.partition(":")
                tree = str(Path(tree).resolve())
                python = str(Path(tree) / ".venv/bin/python")
                if not os.path.exists(python):
                    python = sys.executable
                small = _count(python, tree, args.small, option, port, args.callers)
                large = _count(python, tree, args.large, option, port, args.callers)
                per_request = (large - small) / ((args.large // args.callers - args.small // args.callers) * args.callers)
                counts.setdefault(name, []).append(per_request)
                print(f"{name}: {per_request:,.0f} instructions per request "
                      f"({tree}{' + ' + option if option else ''}; run {repeat + 1})", flush=True)
        if args.repeat > 1:
            for name, runs in counts.items():
                print(f"{name}: median {statistics.median(runs):,.0f} (min {min(runs):,.0f}, max {max(runs):,.0f}, "
                      f"{len(runs)} runs)", flush=True)
    finally:
        backend.kill()
        backend.wait(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
