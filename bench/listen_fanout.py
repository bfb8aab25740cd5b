"""subscriptions/listen fan-out: gateway CPU per delivery, delivery latency, memory per idle stream.

    .venv/bin/python bench/listen_fanout.py                         # N = 1,000 and 10,000
    .venv/bin/python bench/listen_fanout.py --clients 19500 --rounds 10 --replicas 2
    .venv/bin/python bench/listen_fanout.py --gateway-tree /work/wt/base   # another tree's gateway

For each N it starts a fresh mutable fixture backend (mcp==2.3.0) and one gateway process (or,
with `--replicas 2`, two gateway processes sharing a fresh redis-server through
`subscriptions.redis_url`), then opens N `subscriptions/listen` streams (toolsListChanged) from
reader processes (READERS: asyncio sockets, or one raw epoll loop with `--readers epoll`), N/2
per process (`--reader-processes`), the streams spread over the replicas. The gateways are
pinned to CPU 0, everything else (readers, backend, Redis, this process) to CPU 1, so that the readers' own cost is not in the gateway's figures (`--no-pin`
to leave scheduling alone); on loopback the readers' TCP input still runs in the gateway's
`write()` unless `--steering rps` moves it to their CPU (STEERING below). Then:

- memory per idle stream: the gateways' RSS once all N streams are acknowledged and idle,
  minus their RSS before the first stream, divided by N;
- `--rounds` times, the backend adds a tool and publishes tools/list_changed (it answers the
  wall-clock time of the publish), and each reader stamps the wall-clock time every
  notification arrives. Reported: p50/p99 over all deliveries, and p50/p99 over rounds of the
  time to the LAST of the N streams;
- gateway CPU per delivered notification: the gateways' user+system CPU time from just before
  the first publish to the last delivery, divided by N x rounds (it includes the one upstream
  notification per round, its cache invalidation and the bus).

Also reported: the readers' own CPU per delivery (user and system), their CPU's time by kind
(softirq included, which no process is charged with), the NET_RX softirqs per CPU during the
rounds (where packet input ran), the packets dropped for a full input backlog and TCP's
retransmissions (`_MAX_BACKLOG`; `--backlog` raises that queue for a measurement). It checks
what it measures: the backend must hold exactly one upstream listen, and every stream must
receive every notification. The machine may be shared: say so with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import select
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import mcp_http  # noqa: E402
from tests.support.procs import Proc, RedisServer, free_port, python_server  # noqa: E402

MARK = b"notifications/tools/list_changed"
ACK = b"subscriptions/acknowledged"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
GATEWAY_CPU, OTHERS_CPU = 0, 1
READER_PROCESSES = 2


# --------------------------------------------------------------------------- reader process


class _Stream(asyncio.Protocol):
    """One raw listen stream (the `woken` reader): stamps each notification's arrival."""

    __slots__ = ("request", "acked", "arrivals", "tail", "transport")

    def __init__(self, request: bytes, acked: asyncio.Future[None]) -> None:
        self.request = request
        self.acked = acked
        self.arrivals: list[float] = []
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.time()
        seen = self.tail + data
        if not self.acked.done() and ACK in seen:
            self.acked.set_result(None)
        count = seen.count(MARK)
        if count:
            self.arrivals.extend([now] * count)
        self.tail = seen[-(len(MARK) - 1):]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.acked.done():
            self.acked.set_exception(ConnectionError("closed before the ack"))


def check_notification(data: bytes, listen_id: str) -> bool:
    """One SSE event's `data:` line is a tools/list_changed notification tagged with exactly
    this stream's listen id (as a string, the type it was sent with)."""
    for line in data.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                message = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return False
            params = message.get("params") if isinstance(message, dict) else None
            meta = params.get("_meta") if isinstance(params, dict) else None
            return (message.get("jsonrpc") == "2.0" and message.get("method") == MARK.decode()
                    and "id" not in message and isinstance(meta, dict) and meta.get(SUBSCRIPTION_ID) == listen_id)
    return False


class _CheckedStream(asyncio.Protocol):
    """One raw listen stream (the `paced` reader): splits the body into SSE events, checks
    every notification (`check_notification`: its method and this stream's own id), and
    stamps its arrival. A stream's notifications are all the same bytes (the same
    tools/list_changed, the same id, so the same chunk), so once one read brought exactly one
    notification that checked out, a later read of exactly those bytes is that notification
    again, and anything else is parsed in full: a bytes comparison per delivery, not a JSON
    parse (the readers' CPU is the other core's bottleneck with `rps`)."""

    __slots__ = ("request", "listen_id", "acked", "arrivals", "pending", "expected", "wrong", "tally", "transport")

    def __init__(self, request: bytes, listen_id: str, acked: asyncio.Future[None], tally: list[int]) -> None:
        self.request = request
        self.listen_id = listen_id
        self.acked = acked
        self.arrivals: list[float] = []
        self.pending = b""  # the bytes after the last complete event
        self.expected: bytes | None = None  # a read that was exactly one notification that checked out
        self.wrong = 0  # notifications that did not (another id, another method, bad JSON)
        self.tally = tally  # [notifications received by every stream of the process]
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if data == self.expected and not self.pending:
            self.arrivals.append(now)
            self.tally[0] += 1
            return
        whole = not self.pending
        pending = self.pending + data
        end = pending.rfind(b"\n\n")  # an SSE event ends with an empty line
        if end < 0:
            self.pending = pending
            return
        self.pending = pending[end + 2:]
        checked = 0
        for event in pending[:end].split(b"\n\n"):
            # Each event is preceded by its chunk's size line (and the previous chunk's CRLF).
            if MARK in event:
                if check_notification(event, self.listen_id):
                    self.arrivals.append(now)
                    self.tally[0] += 1
                    checked += 1
                else:
                    self.wrong += 1
            elif not self.acked.done() and ACK in event:
                self.acked.set_result(None)
        if whole and checked == 1 and self.pending == b"\r\n" and self.acked.done():
            self.expected = data  # one chunk, one notification: what the next ones look like
            self.pending = b""
        elif self.pending == b"\r\n":  # the end of the chunk: nothing of the next event yet
            self.pending = b""

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.acked.done():
            self.acked.set_exception(ConnectionError("closed before the ack"))


def _request(port: int, listen_id: str) -> bytes:
    body = orjson.dumps(mcp_http.body("subscriptions/listen", {"notifications": {"toolsListChanged": True}},
                                      id=listen_id))
    head = "".join(f"{k}: {v}\r\n" for k, v in mcp_http.headers("subscriptions/listen").items())
    return (f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}content-length: {len(body)}\r\n\r\n"
            .encode() + body)


# The readers (`--readers`; bench/README.md "Listen fan-out, third round").
#   woken: the first rounds' reader. Its event loop sleeps in epoll_wait, so every segment that
#          reaches one of its sockets wakes it: on loopback that wakeup (the reader's CPU sent an
#          inter-processor interrupt, a VM exit here) runs inside the gateway's write(), the
#          readers' cost on the gateway's bill. It counts the method's name in the bytes.
#   paced: the loop never sleeps in epoll_wait: a callback sleeps PACE_SECONDS in nanosleep,
#          then the loop polls without blocking and reads every socket that has data. A segment
#          that arrives meanwhile is queued to its socket with nobody to wake, as a client on
#          another host costs the gateway nothing to wake. Arrivals are stamped when read, so
#          the latency it measures is at worst PACE_SECONDS more, never less. It checks every
#          notification's method and listen id (`_CheckedStream`).
#   epoll: the paced reader's check and pace without asyncio (`EpollReader`): one `select.epoll`
#          over the raw sockets, a non-blocking `recv_into` one preallocated buffer per ready
#          socket, and the same check (`_CheckedStream.data_received` for anything but a read
#          of exactly the bytes that checked out last). It sleeps PACE_SECONDS in nanosleep
#          only when a poll found nothing ready: while segments keep arriving it reads them as
#          fast as it can, never blocked in epoll_wait, so never woken per segment either.
READERS = ("paced", "woken", "epoll")
PACE_SECONDS = 0.0005


async def _reader_main(ports: list[int], first: int, count: int, mode: str = "paced") -> None:
    """Opens `count` streams (ids first.., spread over `ports`), says `ready`, then answers
    `wait K` (every stream has K notifications) and `dump` (the arrival times, and how many
    notifications failed the check) on stdin."""
    loop = asyncio.get_running_loop()
    streams: list[_Stream] | list[_CheckedStream] = []
    tally = [0]
    for start in range(first, first + count, 250):  # in batches: a storm measures the backlog
        batch: list = []
        for i in range(start, min(first + count, start + 250)):
            port = ports[i % len(ports)]
            request = _request(port, f"bench-{i}")
            stream = (_Stream(request, loop.create_future()) if mode == "woken"
                      else _CheckedStream(request, f"bench-{i}", loop.create_future(), tally))
            await loop.create_connection(lambda s=stream: s, "127.0.0.1", port)
            batch.append(stream)
        await asyncio.wait_for(asyncio.gather(*(s.acked for s in batch)), 120)
        streams += batch  # type: ignore[operator]
    if mode == "paced":
        def pace() -> None:
            time.sleep(PACE_SECONDS)  # blocking on purpose: see READERS
            loop.call_soon(pace)
        loop.call_soon(pace)
    print("ready", flush=True)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := (await stdin.readline()).decode().split():
        if line[0] == "wait":
            k = int(line[1])
            deadline = time.monotonic() + 120
            if mode == "woken":
                while any(len(s.arrivals) < k for s in streams) and time.monotonic() < deadline:
                    await asyncio.sleep(0.002)
            else:  # a count, not a walk over every stream every 2 ms
                while ((tally[0] < k * len(streams) or any(len(s.arrivals) < k for s in streams))
                       and time.monotonic() < deadline):
                    await asyncio.sleep(0.002)
            print("done", flush=True)
        elif line[0] == "dump":
            wrong = sum(s.wrong for s in streams) if mode == "paced" else None  # type: ignore[union-attr]
            sys.stdout.write(orjson.dumps({"arrivals": [s.arrivals for s in streams], "wrong": wrong}).decode() + "\n")
            sys.stdout.flush()
            break
    for s in streams:
        if s.transport is not None:
            s.transport.close()


class _Acked:
    """What `_CheckedStream` needs of its `acked` future, without an event loop."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def done(self) -> bool:
        return self.value

    def set_result(self, _: None) -> None:
        self.value = True


class EpollReader:
    """The `epoll` reader (READERS): streams on raw non-blocking sockets, one epoll, one buffer.

    `poll()` reads every ready socket until it is empty: a read of exactly the bytes of this
    stream's last read that was one checked notification (with nothing pending) counts at
    once, as `_CheckedStream.data_received`'s own fast path does; anything else goes through
    that method, so both readers count and check the same way."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.streams: dict[int, _CheckedStream] = {}  # by socket descriptor
        self.sockets: dict[int, socket.socket] = {}
        self.tally = [0]  # notifications that checked out, over every stream
        self.buffer = bytearray(1 << 16)
        self.closed = 0  # streams whose socket closed

    def add(self, sock: socket.socket, listen_id: str) -> _CheckedStream:
        sock.setblocking(False)
        stream = _CheckedStream(b"", listen_id, _Acked(), self.tally)  # type: ignore[arg-type]
        self.streams[sock.fileno()] = stream
        self.sockets[sock.fileno()] = sock
        # Edge-triggered: a socket is on the ready list once per arrival. Level-triggered, epoll
        # would poll every socket it returned once more on the next wait (`tcp_poll`), to find it
        # empty; so each read takes everything there is (`poll` reads until the buffer is not full).
        self.epoll.register(sock.fileno(), select.EPOLLIN | select.EPOLLET)
        return stream

    def poll(self) -> int:
        """Reads each ready socket, without blocking; answers how many were ready."""
        ready = self.epoll.poll(0, len(self.streams) or 1)
        buffer, streams, sockets, tally = self.buffer, self.streams, self.sockets, self.tally
        full = len(buffer)
        for fd, _ in ready:
            size = full
            while size == full:  # edge-triggered: read until the socket has no more
                try:
                    size = sockets[fd].recv_into(buffer)
                except BlockingIOError:
                    break
                except OSError:
                    size = 0
                if size == 0:  # closed: counted, so that a wait for its notifications can give up
                    self.epoll.unregister(fd)
                    self.closed += 1
                    break
                stream = streams[fd]
                expected = stream.expected
                if (expected is not None and size == len(expected) and not stream.pending
                        and buffer.startswith(expected)):
                    stream.arrivals.append(time.time())
                    tally[0] += 1
                else:
                    stream.data_received(bytes(buffer[:size]))
        return len(ready)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.epoll.close()


def _epoll_reader_main(ports: list[int], first: int, count: int) -> None:
    """`_reader_main` for the `epoll` reader: the same streams, the same `ready` / `wait K` /
    `dump` conversation on stdin and stdout, no event loop."""
    reader = EpollReader()
    streams: list[_CheckedStream] = []
    for start in range(first, first + count, 250):  # in batches, as _reader_main
        batch = []
        for i in range(start, min(first + count, start + 250)):
            port = ports[i % len(ports)]
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(_request(port, f"bench-{i}"))
            batch.append(reader.add(sock, f"bench-{i}"))
        deadline = time.monotonic() + 120
        while not all(s.acked.done() for s in batch):
            if reader.closed or time.monotonic() > deadline:
                raise ConnectionError("a stream closed or was not acknowledged in time")
            if not reader.poll():
                time.sleep(PACE_SECONDS)
        streams += batch
    # Every object the rounds need exists now, and the loop makes no reference cycles: without
    # the collector, the tuples each poll returns no longer start collections that walk the
    # streams (`gc_collect_main`, 11 % of this CPU's samples in a `perf` run of this reader).
    gc.freeze()
    gc.disable()
    print("ready", flush=True)
    control = sys.stdin.fileno()
    os.set_blocking(control, False)
    waiting: tuple[int, float] | None = None  # (K, deadline) of a `wait K` not answered yet
    commands = b""
    while True:
        if reader.poll():
            continue
        # Nothing ready: the commands, the answer to a `wait`, then the pace (see READERS).
        with contextlib.suppress(BlockingIOError):
            commands += os.read(control, 4096) or b"dump\n"  # end of input: dump and stop
        while b"\n" in commands:
            line, commands = commands.split(b"\n", 1)
            word = line.decode().split()
            if word and word[0] == "wait":
                waiting = (int(word[1]), time.monotonic() + 120)
            elif word and word[0] == "dump":
                wrong = sum(s.wrong for s in streams)
                sys.stdout.write(orjson.dumps({"arrivals": [s.arrivals for s in streams], "wrong": wrong}).decode()
                                 + "\n")
                sys.stdout.flush()
                reader.close()
                return
        if waiting is not None:
            k, deadline = waiting
            if ((reader.tally[0] >= k * len(streams) and all(len(s.arrivals) >= k for s in streams))
                    or time.monotonic() > deadline):
                print("done", flush=True)
                waiting = None
        time.sleep(PACE_SECONDS)


class _ReaderProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, ports: list[int], first: int, count: int, cpu: int | None,
                    mode: str = "paced") -> _ReaderProcess:
        argv = [sys.executable, __file__, "--reader", "--ports", ",".join(map(str, ports)),
                "--first", str(first), "--count", str(count), "--readers", mode]
        if cpu is not None:
            argv += ["--cpu", str(cpu)]
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, start_new_session=True,
                                                    limit=1 << 26)
        return cls(proc)

    async def expect(self, word: str, timeout: float = 300) -> str:
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), timeout)).decode()
        if not line.startswith(word):
            raise RuntimeError(f"reader said {line[:200]!r}, expected {word!r}")
        return line

    async def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)


# --------------------------------------------------------------------------- controller


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def place(pid: int, cpu: int | None, nice: int) -> None:
    """Every thread of `pid` onto `cpu` (None: anywhere), at niceness `nice` (Linux applies
    both per thread; and to its session's autogroup, as bench/run.py's `boost` does, since
    each process of the run leads its own session)."""
    if nice:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            if cpu is not None:
                os.sched_setaffinity(int(task.name), {cpu})
            if nice:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


# Where loopback runs the receiving side of a packet (bench/README.md "Listen fan-out, second
# round"). On loopback a `write()` runs the receiver's whole TCP input (its `process_backlog`:
# the segment queued, the ACK, the reader woken) in the sender's system call, so the readers'
# cost lands in the gateway's system time, unlike over a network, where it runs on the
# clients' hosts.
#   loopback: the kernel's default, as measured before (the readers' input on the gateway's bill);
#   rps:      Receive Packet Steering on `lo` to the readers' CPU: every packet's input runs
#             there (the readers' and the ACKs to the gateway's sockets alike);
#   rfs:      Receive Flow Steering on `lo`: each packet's input runs on the CPU of the process
#             that reads its socket, so the readers' input runs on their CPU and the ACKs to the
#             gateway's sockets on the gateway's, as on two hosts.
# Either way the sender's CPU pays an inter-processor interrupt to hand the packets over,
# which a VM pays with an exit.
STEERING = ("loopback", "rps", "rfs")
_RPS_CPUS = Path("/sys/class/net/lo/queues/rx-0/rps_cpus")
_RPS_FLOW_CNT = Path("/sys/class/net/lo/queues/rx-0/rps_flow_cnt")
_SOCK_FLOW_ENTRIES = Path("/proc/sys/net/core/rps_sock_flow_entries")


def _ksoftirqd(cpu: int) -> int | None:
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().strip() == f"ksoftirqd/{cpu}":
                return int(comm.parent.name)
    return None


@contextlib.contextmanager
def softirqs_at(cpu: int, nice: int):
    """The CPU's softirq thread at the run's niceness for the duration (restored after). Once
    a CPU has more packet input than one softirq run may take (`netdev_budget`), the rest
    goes to `ksoftirqd/N`, a nice-0 thread the other tenants' processes would delay, while
    everything else of the run is at `nice`."""
    pid = _ksoftirqd(cpu) if nice else None
    if pid is None:
        yield
        return
    saved = os.getpriority(os.PRIO_PROCESS, pid)
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, saved)


@contextlib.contextmanager
def steering(mode: str):
    """Set loopback's packet steering for the duration of a measurement; put it back after,
    whatever happens (it is the whole machine's loopback)."""
    if mode not in STEERING:
        raise ValueError(f"unknown steering {mode!r}; one of {STEERING}")
    files = (_RPS_CPUS, _RPS_FLOW_CNT, _SOCK_FLOW_ENTRIES)
    saved = [f.read_text().strip() for f in files]
    if mode == "loopback" and int(saved[0].replace(",", ""), 16) == 0 and saved[1] == "0":
        yield  # the kernel's default, as it is
        return
    try:
        if mode == "loopback":  # left set by someone (a run killed mid-way): off for this one
            _RPS_CPUS.write_text("0")
            _RPS_FLOW_CNT.write_text("0")
        elif mode == "rps":
            _RPS_CPUS.write_text(f"{1 << OTHERS_CPU:x}")
        else:
            _SOCK_FLOW_ENTRIES.write_text("65536")
            _RPS_FLOW_CNT.write_text("65536")
            _RPS_CPUS.write_text(f"{(1 << (os.cpu_count() or 1)) - 1:x}")
        yield
    finally:
        for f, value in zip(files, saved, strict=True):
            with contextlib.suppress(OSError):
                f.write_text(value)


def cpu_split_of(cpu: int) -> dict[str, float]:
    """One CPU's time so far by kind (/proc/stat, seconds): user (with nice), system, softirq,
    irq, idle (with iowait), steal."""
    for row in Path("/proc/stat").read_text().splitlines():
        if row.startswith(f"cpu{cpu} "):
            v = [int(x) / os.sysconf("SC_CLK_TCK") for x in row.split()[1:]]
            return {"user": v[0] + v[1], "system": v[2], "idle": v[3] + v[4], "irq": v[5], "softirq": v[6],
                    "steal": v[7]}
    return {}


def softnet_drops() -> list[int]:
    """Packets dropped so far per CPU because its input backlog was full (/proc/net/softnet_stat,
    the second column; the backlog holds net.core.netdev_max_backlog packets)."""
    return [int(row.split()[1], 16) for row in Path("/proc/net/softnet_stat").read_text().splitlines()]


def tcp_counters() -> dict[str, int]:
    """TCP retransmissions so far (RetransSegs), tail loss probes and retransmission timeouts."""
    names = {"Tcp": ("RetransSegs",), "TcpExt": ("TCPLossProbes", "TCPTimeouts")}
    found: dict[str, int] = {}
    for source in ("/proc/net/snmp", "/proc/net/netstat"):
        rows = Path(source).read_text().splitlines()
        for head, values in zip(rows[::2], rows[1::2], strict=False):
            kind, _, keys = head.partition(": ")
            for key, value in zip(keys.split(), values.partition(": ")[2].split(), strict=False):
                if key in names.get(kind, ()):
                    found[key] = int(value)
    return found


# A CPU's packet input backlog (net.core.netdev_max_backlog, 1,000 by default) is where RPS
# queues the packets for the readers' CPU. At N = 10,000 the gateway's CPU writes faster than
# the readers' CPU takes them in, the queue passes 1,000, and the kernel drops the rest: each
# dropped segment reaches its stream only when TCP sends it again, a loss probe or timeout of
# 200 ms or more later on loopback, so its stream's delivery is 200+ ms late, and once enough
# are dropped so is the p99 (bench/README.md "Listen fan-out, fourth round"). On
# separate hosts each client's input queue holds its own packets, not 10,000 clients'; a run
# may raise the backlog (`--backlog`) so that the one CPU standing in for them does not drop
# what their own hosts would not. The drops are reported either way ("backlog_drops_per_cpu").
_MAX_BACKLOG = Path("/proc/sys/net/core/netdev_max_backlog")


@contextlib.contextmanager
def input_backlog(packets: int | None):
    """net.core.netdev_max_backlog at `packets` for the duration (None: left alone), put back after."""
    if packets is None:
        yield
        return
    saved = _MAX_BACKLOG.read_text().strip()
    try:
        _MAX_BACKLOG.write_text(str(packets))
        yield
    finally:
        with contextlib.suppress(OSError):
            _MAX_BACKLOG.write_text(saved)


def net_rx_softirqs() -> list[int]:
    """NET_RX softirqs run so far, per CPU (/proc/softirqs): where packet input ran."""
    for row in Path("/proc/softirqs").read_text().splitlines():
        if row.strip().startswith("NET_RX:"):
            return [int(v) for v in row.split()[1:]]
    return []


async def fanout_seconds(http: httpx.AsyncClient, port: int) -> float | None:
    """The gateway's mcp_gateway_listen_fanout_seconds_sum (its write loops so far, s), or None
    when it has no such metric (an older tree)."""
    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    for row in text.splitlines():
        if row.startswith("mcp_gateway_listen_fanout_seconds_sum"):
            return float(row.split()[-1])
    return None


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _gateway(config: Path, tree: str | None) -> Proc:
    port = free_port()
    if tree:
        argv = ["env", f"PYTHONPATH={Path(tree).resolve()}", sys.executable, "-P", "-m", "gateway"]
    else:
        argv = [sys.executable, "-m", "gateway"]
    return Proc([*argv, "serve", "--config", str(config), "--port", str(port)], port, name="gateway")


async def measure(n: int, rounds: int, *, replicas: int = 1, tree: str | None = None,
                  pinned: bool = True, nice: int = 0, perf: str | None = None, perf_cpu: int | None = None,
                  steer: str = "loopback", readers: str = "paced", reader_processes: int = READER_PROCESSES,
                  backlog: int | None = None) -> dict[str, float]:
    """One measurement (the module's docstring). `backlog`: net.core.netdev_max_backlog for its
    duration (None: as the machine has it; `_MAX_BACKLOG` says why a run may raise it)."""
    if pinned and (os.cpu_count() or 1) < 2:
        pinned = False
    # With steering the readers' packet input runs in the readers' CPU's softirqs: at the
    # readers' niceness, as without it, where it runs in the gateway's system calls.
    with (steering(steer), input_backlog(backlog),
          softirqs_at(OTHERS_CPU, nice if steer != "loopback" else 0)):
        result = await _measure(n, rounds, replicas=replicas, tree=tree, pinned=pinned, nice=nice, perf=perf,
                                perf_cpu=perf_cpu,
                                readers=readers, reader_processes=reader_processes)
    return {**result, "steering": steer, "readers": readers, "reader_processes": reader_processes,
            "backlog": int(_MAX_BACKLOG.read_text()) if backlog is None else backlog}


async def _measure(n: int, rounds: int, *, replicas: int, tree: str | None, pinned: bool, nice: int,
                   perf: str | None, perf_cpu: int | None, readers: str, reader_processes: int) -> dict[str, float]:
    if readers not in READERS:
        raise ValueError(f"unknown readers {readers!r}; one of {READERS}")
    mode = readers
    gateway_cpu = GATEWAY_CPU if pinned else None
    others_cpu = OTHERS_CPU if pinned else None
    place(os.getpid(), others_cpu, nice)
    backend = python_server("mutable_modern.py", name="bench-mutable").start()
    redis = RedisServer().start() if replicas > 1 else None
    workdir = Path(tempfile.mkdtemp(prefix="mcp-listen-bench-"))
    gateways: list[Proc] = []
    readers: list[_ReaderProcess] = []
    try:
        for pid in (backend.proc.pid, *([redis.proc.pid] if redis and redis.proc else [])):  # type: ignore[union-attr]
            place(pid, others_cpu, nice)
        for r in range(replicas):
            config = workdir / f"gateway-{r}.yaml"
            subscriptions: dict = {"max_listens": n, "max_listens_per_principal": n}
            if redis is not None:
                subscriptions["redis_url"] = redis.url
            config.write_text(yaml.safe_dump({"backends": [{"name": "m", "url": backend.url}],
                                              "subscriptions": subscriptions,
                                              "observability": {"log_level": "warning"}}))
            gateway = _gateway(config, tree).start()
            gateways.append(gateway)
        pids = [g.proc.pid for g in gateways]  # type: ignore[union-attr]
        for pid in pids:
            place(pid, gateway_cpu, nice)
        async with httpx.AsyncClient(timeout=60) as http:
            control = f"http://127.0.0.1:{backend.port}"
            for g in gateways:  # warm each gateway (imports, pools) before the baseline RSS
                await mcp_http.post(http, g.url, "tools/list")
            await asyncio.sleep(0.5)
            rss_before = sum(rss_bytes(pid) for pid in pids)

            started = time.perf_counter()
            ports = [g.port for g in gateways]
            share = -(-n // reader_processes)
            readers = [await _ReaderProcess.start(ports, first, min(share, n - first), others_cpu, mode)
                       for first in range(0, n, share)]
            for reader in readers:
                place(reader.proc.pid, None, nice)
            for reader in readers:
                await reader.expect("ready")
            open_seconds = time.perf_counter() - started
            await asyncio.sleep(1.0)
            rss_idle = sum(rss_bytes(pid) for pid in pids)
            upstreams = (await http.get(f"{control}/stats")).json()["open_listens"]

            recorder = None
            if perf:  # `perf record` on the gateways for the rounds only (--perf)
                recorder = await asyncio.create_subprocess_exec(
                    "perf", "record", "-g", "-o", perf,
                    *(["-C", str(perf_cpu)] if perf_cpu is not None else ["-p", ",".join(map(str, pids))]),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                await asyncio.sleep(0.5)
            published: list[float] = []
            user = system = 0.0
            net_rx = [0] * len(net_rx_softirqs())
            reader_user = reader_system = 0.0
            reader_pids = [r.proc.pid for r in readers]
            ksoftirqd = _ksoftirqd(OTHERS_CPU)
            others: dict[str, float] = {}  # the readers' CPU's time by kind, over the rounds
            ksoftirqd_seconds = 0.0
            drops = [0] * len(softnet_drops())
            tcp = dict.fromkeys(("RetransSegs", "TCPLossProbes", "TCPTimeouts"), 0)
            fanouts: list[float] = []  # per round, the longest of the replicas' write loops (s)
            for k in range(1, rounds + 1):
                loops_before = [await fanout_seconds(http, g.port) for g in gateways]
                before = [cpu_split(pid) for pid in pids]
                readers_before = [cpu_split(pid) for pid in reader_pids]
                rx_before = net_rx_softirqs()
                others_before = cpu_split_of(OTHERS_CPU)
                ksoftirqd_before = sum(cpu_split(ksoftirqd)) if ksoftirqd else 0.0
                drops_before = softnet_drops()
                tcp_before = tcp_counters()
                change = await http.post(f"{control}/change/tools")
                if change.status_code != 200:
                    raise RuntimeError(f"round {k}: the backend answered {change.status_code}: {change.text[:300]}")
                published.append(change.json()["published_at"])
                for reader in readers:
                    await reader.say(f"wait {k}")
                for reader in readers:
                    await reader.expect("done")
                for pid, (u, s) in zip(pids, before, strict=True):  # the pause between rounds is not counted
                    u1, s1 = cpu_split(pid)
                    user, system = user + u1 - u, system + s1 - s
                net_rx = [t + b - a for t, a, b in zip(net_rx, rx_before, net_rx_softirqs(), strict=True)]
                for pid, (u, s) in zip(reader_pids, readers_before, strict=True):
                    u1, s1 = cpu_split(pid)
                    reader_user, reader_system = reader_user + u1 - u, reader_system + s1 - s
                for kind, value in cpu_split_of(OTHERS_CPU).items():
                    others[kind] = others.get(kind, 0.0) + value - others_before[kind]
                ksoftirqd_seconds += (sum(cpu_split(ksoftirqd)) if ksoftirqd else 0.0) - ksoftirqd_before
                drops = [t + b - a for t, a, b in zip(drops, drops_before, softnet_drops(), strict=True)]
                for key, value in tcp_counters().items():
                    tcp[key] = tcp.get(key, 0) + value - tcp_before.get(key, 0)
                loops = [await fanout_seconds(http, g.port) for g in gateways]
                if None not in loops and None not in loops_before:
                    fanouts.append(max(b - a for a, b in zip(loops_before, loops, strict=True)))  # type: ignore[operator]
                await asyncio.sleep(0.2)
            if recorder is not None:
                recorder.send_signal(2)
                await recorder.wait()
            arrivals: list[list[float]] = []
            wrong: int | None = None  # notifications that failed the reader's check (None: not checked)
            for reader in readers:
                await reader.say("dump")
                dump = orjson.loads(await reader.expect("{"))
                arrivals += dump["arrivals"]
                if dump["wrong"] is not None:
                    wrong = (wrong or 0) + dump["wrong"]
    finally:
        for reader in readers:
            reader.kill()
        for g in gateways:
            g.stop()
        backend.stop()
        if redis is not None:
            redis.stop()
    complete = len(arrivals) == n and all(len(a) == rounds for a in arrivals) and not wrong
    deliveries: list[float] = []
    last: list[float] = []
    first: list[float] = []
    for k, at in enumerate(published):
        latencies = [a[k] - at for a in arrivals if len(a) > k]
        deliveries += latencies
        last.append(max(latencies))
        first.append(min(latencies))
    return {
        "n": n, "replicas": replicas, "upstreams": upstreams, "complete": complete, "wrong": wrong,
        "open_s": open_seconds,
        "p50_ms": pct(deliveries, 0.5) * 1000, "p99_ms": pct(deliveries, 0.99) * 1000,
        "last_p50_ms": statistics.median(last) * 1000, "last_p99_ms": pct(last, 0.99) * 1000,
        # To the first stream (p50 over rounds): the backend's publish, the upstream stream, the
        # hub, one write and one read; what is not the write loop.
        "first_p50_ms": statistics.median(first) * 1000,
        # The gateway's write loop, first stream to last (mcp_gateway_listen_fanout_seconds), p50
        # and the longest over rounds; None for a gateway without that metric.
        "loop_p50_ms": statistics.median(fanouts) * 1000 if fanouts else None,
        "loop_max_ms": max(fanouts) * 1000 if fanouts else None,
        "rss_per_stream_kb": (rss_idle - rss_before) / n / 1024,
        "cpu_us_per_delivery": (user + system) / (n * rounds) * 1e6,
        "user_us_per_delivery": user / (n * rounds) * 1e6,
        "sys_us_per_delivery": system / (n * rounds) * 1e6,
        # The readers' CPU (user+system) per delivery: what the other core spends receiving
        # (mostly the kernel's: their reads, and the ACKs they send, whose input into the
        # gateway's sockets loopback runs in the readers' system calls).
        "reader_us_per_delivery": (reader_user + reader_system) / (n * rounds) * 1e6,
        "reader_user_us_per_delivery": reader_user / (n * rounds) * 1e6,
        "reader_sys_us_per_delivery": reader_system / (n * rounds) * 1e6,
        # The readers' CPU by kind during the rounds, µs per delivery (/proc/stat: its softirq
        # time is not in any process's), and ksoftirqd's share of it.
        "others_cpu_us_per_delivery": {k: v / (n * rounds) * 1e6 for k, v in others.items()},
        "ksoftirqd_us_per_delivery": ksoftirqd_seconds / (n * rounds) * 1e6,
        # Packets dropped because a CPU's input backlog was full, per CPU, and TCP's
        # retransmissions during the rounds: a dropped segment reaches its reader only when
        # TCP sends it again (a probe or a timeout, 200 ms or more later on loopback).
        "backlog_drops_per_cpu": drops,
        "tcp_retransmits": tcp,
        # NET_RX softirqs per CPU during the rounds: on which CPU packet input ran.
        "net_rx_per_cpu": net_rx,
    }


def largest_n(reserve: int = 500) -> int:
    """The most streams one gateway process can hold here: its hard RLIMIT_NOFILE (which it
    raises its soft limit to) less the descriptors the gateway keeps for other work."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 50_000 if hard == resource.RLIM_INFINITY else min(50_000, hard - reserve)


HEADER = (f"{'readers':>7} {'steering':>8} {'N':>7} {'repl':>4} {'upstr':>5} {'all got all':>11} {'open (s)':>8} {'µs CPU/dlv (usr+sys)':>20} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'last p50':>9} {'last p99':>9} {'first p50':>9} {'loop p50/max':>13} {'RSS/stream':>11} {'readers µs/dlv':>14}  NET_RX per CPU")


def line(r: dict[str, float]) -> str:
    cpu = f"{r['cpu_us_per_delivery']:>6.1f} ({r['user_us_per_delivery']:.1f}+{r['sys_us_per_delivery']:.1f})"
    loop = "-" if r["loop_p50_ms"] is None else f"{r['loop_p50_ms']:.1f}/{r['loop_max_ms']:.1f}"
    return (f"{r['readers']:>7} {r['steering']:>8} {r['n']:>7} {r['replicas']:>4} {r['upstreams']:>5} {str(r['complete']):>11} {r['open_s']:>8.1f} "
            f"{cpu:<21}{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['last_p50_ms']:>9.1f} "
            f"{r['last_p99_ms']:>9.1f} {r['first_p50_ms']:>9.1f} {loop:>13} {r['rss_per_stream_kb']:>8.1f} KB {r['reader_us_per_delivery']:>14.1f}  {'/'.join(map(str, r['net_rx_per_cpu']))}"
            f"\n{'':>7} {readers_side(r)}")


def readers_side(r: dict) -> str:
    """The readers' CPU, µs per delivery: their processes (user+sys), and the CPU by kind; the
    backlog drops per CPU and TCP's retransmissions during the rounds."""
    kinds = " ".join(f"{k} {v:.1f}" for k, v in r["others_cpu_us_per_delivery"].items() if v)
    return (f"{r['reader_processes']} reader process(es), backlog {r['backlog']}: "
            f"readers' processes {r['reader_user_us_per_delivery']:.1f}+{r['reader_sys_us_per_delivery']:.1f} µs/dlv; "
            f"CPU {OTHERS_CPU}: {kinds} (ksoftirqd {r['ksoftirqd_us_per_delivery']:.1f}); "
            f"backlog drops {'/'.join(map(str, r['backlog_drops_per_cpu']))}; "
            + " ".join(f"{k} {v}" for k, v in r["tcp_retransmits"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--gateway-tree", help="run the gateway from this source tree (PYTHONPATH=TREE)")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--nice", type=int, default=-10 if os.geteuid() == 0 else 0,
                        help="niceness of every process of the run (default -10 as root, as bench/run.py)")
    parser.add_argument("--perf", help="perf record -g the gateway(s) during the rounds into this file")
    parser.add_argument("--perf-cpu", type=int, help="with --perf: record everything on this CPU instead "
                                                     f"(the readers' is {OTHERS_CPU}: their processes and softirqs)")
    parser.add_argument("--steering", nargs="+", choices=STEERING, default=["loopback"],
                        help="loopback packet steering for each measurement (rfs: the readers' TCP input "
                             "on their own CPU, as over a network); several: each N in each mode")
    parser.add_argument("--readers", nargs="+", choices=READERS, default=["paced"],
                        help="the readers (READERS: paced = not woken per segment, checks every notification; "
                             "woken = the first rounds' reader); several: each N in each")
    parser.add_argument("--reader-processes", type=int, nargs="+", default=[READER_PROCESSES],
                        help="how many reader processes share the N streams; several: each N with each")
    parser.add_argument("--backlog", type=int, nargs="+", default=[0],
                        help="net.core.netdev_max_backlog for each measurement (0: as the machine has it; "
                             "_MAX_BACKLOG says why); several: each N with each")
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        if args.cpu is not None:
            os.sched_setaffinity(0, {args.cpu})
        if args.readers[0] == "epoll":
            _epoll_reader_main([int(p) for p in args.ports.split(",")], args.first, args.count)
            return 0
        with contextlib.suppress(ImportError):
            import uvloop
            uvloop.install()
        asyncio.run(_reader_main([int(p) for p in args.ports.split(",")], args.first, args.count, args.readers[0]))
        return 0
    print(f"listen fan-out, {os.cpu_count()} CPUs; latency = backend publish -> client receives (wall clock)")
    print(HEADER)
    for n in args.clients:
        for steer in args.steering:
            for readers, processes, backlog in ((r, p, b) for b in args.backlog for r in args.readers
                                                for p in args.reader_processes):
                r = asyncio.run(measure(n, args.rounds, replicas=args.replicas, tree=args.gateway_tree,
                                        pinned=not args.no_pin, nice=args.nice, perf=args.perf,
                                        perf_cpu=args.perf_cpu, steer=steer,
                                        readers=readers, reader_processes=processes, backlog=backlog or None))
                print(line(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
