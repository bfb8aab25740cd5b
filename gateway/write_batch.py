"""Socket writes held until the event loop has run every callback that was ready, then sent
together: the answers (and upstream requests) one pass of the loop produced leave back to back.

Why: a `send()` to a peer asleep in `epoll_wait` wakes it. On another core that is an
inter-processor interrupt, which the sender pays inside the system call; on the same core the
woken peer usually preempts the writer, handles that one message and sleeps again. Writing
every answer the moment it was ready, the gateway woke its client once per response (nginx,
which relays the backend's bursts as bursts, does not) and woke its backend once per request,
which then paid its own loop pass per request. Held to the end of the pass, one wakeup serves
every write of the pass (figures: bench/README.md "Profile").

The price is that a write waits for the rest of the pass that made it: the callbacks already
ready, and one `epoll_wait` that does not block. A write of `FLUSH_BYTES` or more goes out at
once, which also bounds what a transport can hold here when an application writes in a loop
without yielding; anything that closes a transport or writes to it directly first calls
`flush(transport)`, so bytes never overtake each other. A writer that knows nothing else can
share the wakeup (http11.py: the only request being answered) uses `write_now`, which sends at
once behind what the transport holds (bench/README.md "Profile").

A listen fan-out writes once to each of thousands of transports in one call (`burst`): their
first writes are collected and sent back to back, `BURST_WRITES` at a time, still in the same
pass. When the receiving side of a write runs on another CPU (the packet handed to another
core, as Receive Packet Steering does), the kernel interrupts that CPU only if it has
nothing queued already: writes spaced by the Python work that decides and frames each
stream's bytes let it drain its queue between them, so nearly every write paid an
inter-processor interrupt (on a VM an exit); back to back, one serves many (bench/README.md
"Listen fan-out, third round").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

log = logging.getLogger("gateway.write_batch")

# Held bytes above which a transport is written at once, as if unbatched.
FLUSH_BYTES = 64 * 1024
# Writes a `burst` collects before it sends them: enough back to back for one wakeup of the
# receiving side to serve many of them, few enough that the first streams need not wait for
# the Python work of the last ones (bench/README.md "Listen fan-out, third round").
BURST_WRITES = 256


class WriteBatch:
    """The writes of one event loop's current pass, per transport, in order."""

    __slots__ = ("_loop", "held", "passes", "_due", "_burst_to", "_burst_data", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # transport → [bytes held, chunk, chunk, ...]; a dict keeps the transports in order.
        self.held: dict[Any, list[Any]] = {}
        # Passes ended so far (`flush_all` runs at the end of each pass that wrote): what a
        # `MarkedWriter` compares its mark with.
        self.passes = 0
        self._due = False  # flush_all is scheduled
        # During a `burst`: the transports whose first write of the pass it collected, and the
        # bytes, in order (two lists, not a tuple per write: 10,000 tuples a fan-out would set
        # off the collector). None outside a burst.
        self._burst_to: list[Any] | None = None
        self._burst_data: list[bytes] = []

    def _flush_at_end_of_pass(self) -> None:
        if not self._due:
            self._due = True
            self._loop.call_soon(self.flush_all)

    def write(self, transport: Any, data: bytes) -> None:
        held = self.held.get(transport)
        if held is None or held is _WRITTEN:
            self._flush_at_end_of_pass()
            held = self.held[transport] = [0]
        held.append(data)
        held[0] += len(data)
        if held[0] >= FLUSH_BYTES:
            self.flush(transport)

    def write_now(self, transport: Any, data: bytes) -> None:
        """Write `data` at once, behind whatever `transport` holds: for a writer that knows no
        other write of this pass could share the wakeup (http11.py: the only request being
        answered), so that its peer need not wait for the rest of the pass."""
        if self._burst_to:
            self._send_burst()  # what a burst collected goes first (it may hold this transport's)
        held = self.held.pop(transport, None)
        if held is None or held is _WRITTEN:
            held = [0]
        held.append(data)
        _send(transport, held)

    def write_through(self, transport: Any, data: bytes) -> None:
        """Write `data` at once unless this pass already wrote to `transport`; hold the
        writes after it until the pass ends. For a writer that writes to thousands of
        transports in one pass (a listen fan-out; http11.py `_DirectStream` uses
        `write_through_marked`, the same without an entry per transport): one notification
        goes out to each at once, and a burst of them in one pass leaves as one write per
        transport instead of one per notification."""
        held = self.held.get(transport)
        if held is not None:
            self._hold_after_write(transport, held, data)
            return
        self._flush_at_end_of_pass()
        # A shared mark, not a list per transport: a fan-out to 10,000 streams would otherwise
        # allocate 10,000 lists a notification for the collector to count.
        self.held[transport] = _WRITTEN
        transport.write(data)

    def write_through_marked(self, writer: MarkedWriter, transport: Any, data: bytes) -> None:
        """`write_through` for a writer that keeps the mark of the pass it last wrote in
        (`writer.written_in`) itself, so that its first write of a pass leaves nothing here:
        a listen fan-out writes to 10,000 transports in one pass, and an entry each in `held`
        (a dict too large for the CPU's caches), walked again at the end of the pass, cost
        ~0.2 µs per stream (bench/README.md "Listen fan-out, second round")."""
        held = self.held.get(transport)
        if held is not None:
            self._hold_after_write(transport, held, data)
            return
        if writer.written_in == self.passes:  # wrote once already in this pass
            self.held[transport] = [len(data), data]
            return
        writer.written_in = self.passes
        self._flush_at_end_of_pass()
        burst = self._burst_to
        if burst is not None:
            burst.append(transport)
            self._burst_data.append(data)
            if len(burst) >= BURST_WRITES:
                self._send_burst()
            return
        transport.write(data)

    @contextlib.contextmanager
    def burst(self) -> Iterator[None]:
        """Within it, the first write of the pass to each transport (`write_through_marked`)
        is collected, and they are sent back to back in the order they were made, each time
        `BURST_WRITES` are collected and when it ends: for a writer that writes once to each of thousands of transports in one
        synchronous loop (a listen fan-out, subscriptions/upstream.py). `flush` and
        `write_now` (and so a close through http11.py) send what the burst collected first,
        so that no bytes overtake it. A later write of the same pass to a transport is held
        as usual and leaves at the end of the pass, behind the burst's. Nested, the outermost
        sends."""
        if self._burst_to is not None:
            yield
            return
        self._burst_to, self._burst_data = [], []
        try:
            yield
        finally:
            self._send_burst()
            self._burst_to = None

    def _send_burst(self) -> None:
        transports, data = self._burst_to, self._burst_data
        self._burst_to, self._burst_data = [], []
        for transport, chunk in zip(transports, data):  # type: ignore[arg-type]  # noqa: B905 (same length)
            _send_one(transport, chunk)

    def _hold_after_write(self, transport: Any, held: Any, data: bytes) -> None:
        """A later write of this pass to a transport already written to: held until the pass
        ends (or until `FLUSH_BYTES`), so a burst leaves as one write per transport."""
        if held is _WRITTEN:
            self.held[transport] = [len(data), data]
            return
        held.append(data)
        held[0] += len(data)
        if held[0] >= FLUSH_BYTES:
            self.flush(transport)

    def flush(self, transport: Any) -> None:
        """Send what `transport` holds now (before a direct write to it, or its close)."""
        if self._burst_to:
            self._send_burst()  # what a burst collected goes first (it may hold this transport's)
        held = self.held.pop(transport, None)
        if held is not None:
            _send(transport, held)

    def flush_all(self) -> None:
        self._due = False
        self.passes += 1
        held, self.held = self.held, {}
        for transport, chunks in held.items():
            _send(transport, chunks)

    def holds(self, transport: Any) -> int:
        """Bytes held for `transport` (0 when none)."""
        held = self.held.get(transport)
        return 0 if held is None else held[0]


class MarkedWriter(Protocol):
    """A writer of one transport that remembers the pass (`WriteBatch.passes`) it last wrote in."""

    written_in: int


# What `write_through` holds for a transport it wrote to in this pass, until a second write.
_WRITTEN: Any = (0,)


def _send(transport: Any, held: Any) -> None:
    if len(held) == 1:
        return  # marked by `write_through`, nothing held after it
    _send_one(transport, held[1] if len(held) == 2 else b"".join(held[1:]))


def _send_one(transport: Any, data: bytes) -> None:
    if transport.is_closing():
        return  # closed before the pass ended: as a write to a closed transport, dropped
    try:
        transport.write(data)
    except Exception:
        # One transport that refuses (written after its write_eof(), say) must not cost the
        # others of the pass their bytes; as a direct write would have, it ends its connection.
        log.exception("write to %r failed; closing it", transport)
        transport.abort()


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WriteBatch] = weakref.WeakKeyDictionary()


def for_loop(loop: asyncio.AbstractEventLoop) -> WriteBatch:
    """The loop's one batch (one per loop, so that every writer's bytes leave in one pass)."""
    batch = _batches.get(loop)
    if batch is None:
        batch = _batches[loop] = WriteBatch(loop)
    return batch
