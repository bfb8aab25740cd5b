"""The gateway's own CPU per request, without uvicorn, sockets on the client side or wrk.

Builds the gateway's ASGI app in this process (one backend: `bench/backend.py` on the other
CPU), runs its lifespan, and calls it directly with ready-made scopes from N concurrent
callers. Reports `time.process_time()` per request, min and median over rounds. This is the
loop bench/README.md "Profile" quotes for every cut: it isolates the application's cost, which
the wrk numbers mix with the ASGI server, the kernel and the backend sharing the core.

    python bench/inprocess.py call            # pass-through tools/call (includes the upstream client)
    python bench/inprocess.py list            # tools/list answered from the memory cache
    python bench/inprocess.py list --cache none   # tools/list forwarded every time (50 tools, ~5 KB)
    python bench/inprocess.py legacy          # warm modern→legacy tools/call
    python bench/inprocess.py call --callers 1 --profile   # one at a time, cProfile of a round
    MCPGW_PROFILE_CALLERS=get_running_loop python bench/inprocess.py legacy --profile   # + who calls it
    MCPGW_PROFILE_SORT=ncalls python bench/inprocess.py legacy --callers 1 --profile     # another pstats order

Takes the bench lock (/tmp/mcp-gateway-bench.lock) like run.py, so runs never overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from run import free_port, take_lock  # noqa: E402  (bench/run.py: same port picking, same lock)

from gateway.app import build_app  # noqa: E402
from gateway.settings import GatewaySettings  # noqa: E402

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def request(mode: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    if mode == "list":
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
        extra = [(b"mcp-method", b"tools/list")]
    else:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": META}}
        extra = [(b"mcp-method", b"tools/call"), (b"mcp-name", b"echo")]
    raw = orjson.dumps(body)
    headers = [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"inprocess"), (b"content-type", b"application/json"),
               (b"accept", b"application/json, text/event-stream"), (b"mcp-protocol-version", b"2026-07-28"),
               *extra, (b"content-length", str(len(raw)).encode())]
    return raw, headers


async def started(app: Any, timeout: float = 30) -> tuple[asyncio.Queue[dict[str, str]], asyncio.Future[Any]]:
    """The app's lifespan started in this loop: (the queue that ends it, its task)."""
    queue: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    ready = asyncio.Event()

    async def send(message: dict[str, str]) -> None:
        if message["type"] == "lifespan.startup.complete":
            ready.set()

    await queue.put({"type": "lifespan.startup"})
    task = asyncio.ensure_future(app({"type": "lifespan"}, queue.get, send))
    await asyncio.wait_for(ready.wait(), timeout)
    return queue, task


async def call_once(app: Any, body: bytes, headers: list[tuple[bytes, bytes]], what: str = "") -> None:
    """One POST /mcp straight into the ASGI app, by a client that stays; SystemExit unless 200."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.sleep(3600)  # a client that stays: never a disconnect
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise SystemExit(f"{what or 'the request'}: the gateway answered {status}, not 200")


async def measure(app: Any, mode: str, callers: int, requests: int, rounds: int, profile: bool) -> list[float]:
    body, headers = request(mode)

    async def one() -> None:
        await call_once(app, body, headers, mode)

    async def caller(n: int) -> None:
        for _ in range(n):
            await one()

    for _ in range(200):  # warm: discovery, the tool index, the cache entry, pooled connections
        await one()
    gc.freeze()
    results = []
    for round_ in range(rounds):
        profiler = cProfile.Profile() if profile and round_ == rounds - 1 else None
        started = time.process_time()
        if profiler:
            profiler.enable()
        await asyncio.gather(*(caller(requests // callers) for _ in range(callers)))
        if profiler:
            profiler.disable()
            stats = pstats.Stats(profiler).sort_stats(os.environ.get("MCPGW_PROFILE_SORT", "tottime"))
            stats.print_stats(30)
            if os.environ.get("MCPGW_PROFILE_CALLERS"):
                stats.print_callers(os.environ["MCPGW_PROFILE_CALLERS"])
        else:
            results.append(1e6 * (time.process_time() - started) / (requests // callers * callers))
    return results


async def main_async(args: argparse.Namespace, backend_url: str) -> list[float]:
    era = "legacy" if args.mode == "legacy" else "modern"
    backend_extra = json.loads(args.backend) if args.backend else {}
    if args.credentials == "headers":
        backend_extra["auth"] = {"type": "headers", "headers": {"x-api-key": "bench-key-" + "k" * 32}}
    elif args.credentials == "client-credentials":
        backend_extra["auth"] = {"type": "oauth_client_credentials", "token_url": args.token_url,
                                 "client_id": "bench", "client_secret": "bench-secret"}
    extra: dict[str, Any] = {}
    if args.access_log or args.tracing:
        # The access log is written to fd 1, which main() points at a file (the figures go to stderr).
        extra["observability"] = {"access_log": args.access_log, "log_format": "json"}
    if args.tracing:
        from gateway.observability import tracing

        tracing.configure(True, "console")  # every span exported, as JSON lines on stderr → a file
    if args.governance:
        # The rules and limits of bench/run.py's governance-call workload (memory limiter).
        import yaml
        from run import governance_yaml

        governance = yaml.safe_load(governance_yaml("memory"))
        governance.pop("cache", None)
        extra.update(governance)
    settings = GatewaySettings(backends=[{"name": "bench", "url": backend_url, "era": era, "prefix": "", **backend_extra}],
                               cache={"store": args.cache}, security={"secret": "inprocess-bench-secret-0123456789"},
                               **extra)
    app = build_app(settings)
    lifespan, task = await started(app)
    try:
        return await measure(app, args.mode, args.callers, args.requests, args.rounds, args.profile)
    finally:
        await lifespan.put({"type": "lifespan.shutdown"})
        await task


def bench_backend(port: int, mode: str = "modern", pinned: bool = True) -> subprocess.Popen[bytes]:
    """bench/backend.py (50 tools, ttlMs 60 s) on `port`, once it accepts; pinned to CPU 0 unless
    `pinned` is false (the scheduler places it, as bench/instructions.py and paired_cpu.py run it)."""
    pin = ["taskset", "-c", "0"] if pinned and (os.cpu_count() or 1) >= 2 else []
    backend = subprocess.Popen([*pin, sys.executable, str(BENCH / "backend.py"), "--port", str(port),
                                "--mode", mode, "--tools", "50", "--ttl-ms", "60000"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return backend


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("mode", choices=("call", "list", "legacy"))
    p.add_argument("--callers", type=int, default=32, help="concurrent callers (default 32)")
    p.add_argument("--requests", type=int, default=20_000, help="requests per round (default 20,000)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    p.add_argument("--profile", action="store_true", help="also run one round under cProfile")
    p.add_argument("--cache", choices=("memory", "none"), default="memory", help="cache.store (default memory)")
    p.add_argument("--access-log", action="store_true", help="observability.access_log: true, JSON (to a file)")
    p.add_argument("--tracing", action="store_true",
                   help="tracing on, every request sampled, console exporter (to a file)")
    p.add_argument("--credentials", choices=("none", "headers", "client-credentials"), default="none",
                   help="backends[].auth: none, static headers, or a cached client-credentials token from "
                        "bench/token_server.py (issue 20)")
    p.add_argument("--backend", default="", help='extra backend settings as JSON, e.g. \'{"max_concurrent_calls": 1000}\'')
    p.add_argument("--governance", action="store_true",
                   help="with the 20 rules and 3 rate limits of bench/run.py governance-call")
    args = p.parse_args(argv)
    report = sys.stdout
    if args.access_log or args.tracing:
        import tempfile

        report = os.fdopen(os.dup(1), "w")
        sink = tempfile.NamedTemporaryFile(prefix="inprocess-telemetry-", suffix=".log", delete=False)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        sys.stderr = sys.stdout = open(sink.name, "a")  # noqa: SIM115 - lives as long as the process
    if args.profile:
        args.rounds += 1

    with take_lock(900):
        port = free_port()
        token_server = None
        backend = bench_backend(port, "legacy" if args.mode == "legacy" else "modern")
        try:
            if args.credentials == "client-credentials":
                token_port = free_port()
                token_server = subprocess.Popen([sys.executable, str(BENCH / "token_server.py"), "--port",
                                                 str(token_port)], stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL, start_new_session=True)
                args.token_url = f"http://127.0.0.1:{token_port}/token"
                for _ in range(100):
                    try:
                        socket.create_connection(("127.0.0.1", token_port), timeout=0.2).close()
                        break
                    except OSError:
                        time.sleep(0.1)
            if (os.cpu_count() or 1) >= 2:
                os.sched_setaffinity(0, {1})
            import uvloop

            results = uvloop.run(main_async(args, f"http://127.0.0.1:{port}/mcp"))
        finally:
            backend.kill()
            backend.wait(timeout=5)
            if token_server is not None:
                token_server.kill()
                token_server.wait(timeout=5)
    results.sort()
    print(f"{args.mode} (credentials: {args.credentials}), {args.callers} callers: gateway CPU per request min {results[0]:.1f} µs, "
          f"median {results[len(results) // 2]:.1f} µs over {len(results)} rounds of {args.requests}",
          file=report, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
