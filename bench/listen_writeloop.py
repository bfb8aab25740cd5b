"""The gateway's own write loop of a listen fan-out: CPU and wall time from its first write to
its last, in process, with no reader, backend or bus in the figures.

    .venv/bin/python bench/listen_writeloop.py --streams 10000 --rounds 30

Starts the mutable fixture backend and a gateway in this process (the gateway's own HTTP/1.1
protocol), opens `--streams` listen streams from bench/listen_fanout.py's reader processes
(`paced`, on the other CPU), then `--rounds` times hands one tools/list_changed notification
to the upstream stream's `fan_out` directly and measures that call: this thread's user and
system CPU (getrusage RUSAGE_THREAD) and wall time, per stream. The system time is the
kernel's TCP send of one segment per stream, and on plain loopback the receiving side's TCP
input too (`--steering rps` moves that to the readers' CPU, bench/listen_fanout.py STEERING).
Reported: the median and minimum over rounds. For comparing trees: `--gateway-tree` runs this
script's gateway from another source tree; `--floor` writes the same bytes without the gateway
(the kernel's part alone, or through uvloop's transports). It waits for bench/run.py's lock.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--streams", type=int, default=10_000)
parser.add_argument("--rounds", type=int, default=30)
parser.add_argument("--steering", choices=("loopback", "rps"), default="loopback")
parser.add_argument("--gateway-tree", help="import the gateway from this source tree")
parser.add_argument("--floor", choices=("os.write", "transport.write"),
                    help="instead of the gateway's fan-out, write each stream's bytes (made before the clock "
                         "starts) straight to its socket (os.write: the kernel's part alone, the floor of a write "
                         "loop) or to its uvloop transport (transport.write: the floor through uvloop)")
parser.add_argument("--nice", type=int, default=-10 if os.geteuid() == 0 else 0)
args = parser.parse_args()

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))
if args.gateway_tree:
    sys.path.insert(0, str(Path(args.gateway_tree).resolve()))
sys.path.insert(1, str(HERE.parent))

import gateway  # noqa: E402,F401  (first: listen_fanout puts this tree at the front of sys.path)
import listen_fanout  # noqa: E402

from tests.support.gateway import running_gateway  # noqa: E402
from tests.support.procs import python_server  # noqa: E402


def thread_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime, r.ru_stime


def floor_writes(stream: object, message: dict) -> list[tuple[object, bytes]]:
    """(socket, bytes) per stream: the chunk the gateway would write, made as the gateway makes it."""
    from gateway.subscriptions.encoding import Outgoing

    outgoing = Outgoing(message)
    writes = []
    for sink in stream.sinks:  # type: ignore[attr-defined]
        event = outgoing.event_for(sink.listen_id, sink._id_json)
        transport = sink._channel._transport
        to = transport.get_extra_info("socket").fileno() if args.floor == "os.write" else transport
        writes.append((to, b"%x\r\n%b\r\n" % (len(event), event)))
    return writes


async def main() -> None:
    listen_fanout.place(os.getpid(), listen_fanout.GATEWAY_CPU, args.nice)
    backend = python_server("mutable_modern.py", name="bench-mutable").start()
    listen_fanout.place(backend.proc.pid, listen_fanout.OTHERS_CPU, args.nice)  # type: ignore[union-attr]
    readers: list[listen_fanout._ReaderProcess] = []
    try:
        n = args.streams
        settings = {"backends": [{"name": "m", "url": backend.url}],
                    "subscriptions": {"max_listens": n, "max_listens_per_principal": n}}
        async with running_gateway(settings) as gw:
            share = -(-n // listen_fanout.READER_PROCESSES)
            readers = [await listen_fanout._ReaderProcess.start([gw.port], first, min(share, n - first),
                                                                listen_fanout.OTHERS_CPU, "paced")
                       for first in range(0, n, share)]
            for reader in readers:
                listen_fanout.place(reader.proc.pid, None, args.nice)
            for reader in readers:
                await reader.expect("ready")
            (stream,) = gw.runtime.hub.upstreams.values()
            assert len(stream.sinks) == n, len(stream.sinks)
            message = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
            await asyncio.sleep(0.5)
            user, system, wall = [], [], []
            collections = 0  # the collector's runs during the write loops (gc.get_stats)
            with listen_fanout.steering(args.steering):
                for k in range(1, args.rounds + 1):
                    if args.floor:
                        writes = floor_writes(stream, message)
                    gc0 = sum(g["collections"] for g in gc.get_stats())
                    u0, s0 = thread_cpu()
                    t0 = time.perf_counter()
                    if args.floor == "os.write":
                        write = os.write
                        for fd, data in writes:
                            write(fd, data)
                    elif args.floor:
                        for transport, data in writes:
                            transport.write(data)
                    else:
                        stream.fan_out(message)
                    t1 = time.perf_counter()
                    u1, s1 = thread_cpu()
                    collections += sum(g["collections"] for g in gc.get_stats()) - gc0
                    user.append((u1 - u0) / n * 1e6)
                    system.append((s1 - s0) / n * 1e6)
                    wall.append((t1 - t0) * 1e3)
                    for reader in readers:
                        await reader.say(f"wait {k}")
                    for reader in readers:
                        await reader.expect("done")
                    await asyncio.sleep(0.1)
            for reader in readers:
                await reader.say("dump")
                await reader.expect("{")
        print(f"{'floor ' + args.floor if args.floor else 'gateway'} {Path(gateway.__file__).parents[1]}, {n} streams, {args.rounds} rounds, "
              f"steering {args.steering}, load average {os.getloadavg()[0]:.2f}")
        print(f"write loop per stream: user {statistics.median(user):.2f} µs (min {min(user):.2f}), "
              f"system {statistics.median(system):.2f} µs (min {min(system):.2f}); first to last write "
              f"{statistics.median(wall):.1f} ms (min {min(wall):.1f}, max {max(wall):.1f}); "
              f"{collections} garbage collections in them")
    finally:
        for reader in readers:
            reader.kill()
        backend.stop()


if __name__ == "__main__":
    import fcntl
    import tempfile

    # bench/run.py's lock: one measurement at a time on the machine (this one sets loopback's steering).
    lock = open(Path(tempfile.gettempdir()) / "mcp-gateway-bench.lock", "a+")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
