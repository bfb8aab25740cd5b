"""One upstream `subscriptions/listen`, shared by every client stream that needs it.

A stream is identified by a `StreamKey`: the backend and the filter the gateway asks it for.
No principal: the gateway never forwards a caller's identity upstream, so what a backend sends
cannot depend on who listens (docs/subscriptions.md "Upstream listens"). Each replica keeps one
`UpstreamListen` per key that its clients use; across replicas, the one holding the key's
lease on the bus runs the actual upstream request and the others follow (they hear its
events on the bus).

The holder's upstream loop reconnects with exponential backoff and full jitter when the
backend's stream drops (SHTTP: a broken stream is lost, never resumed), and after such a gap,
or after taking the stream over from another replica, publishes a `gap` event: clients get a
synthetic notification for each type they were granted and the cache drops what that backend
could have changed, since events may have been missed (digest §e, §h.6 [GW]).

Lifetime: a stream lives while local clients are attached, then `linger` seconds more (a
dashboard that reconnects finds it still open), and a holder keeps it open while other
replicas still want it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway import write_batch
from gateway.backends.base import Backend, Reply, internal_call
from gateway.protocol import jsonrpc as rpc
from gateway.subscriptions import metrics
from gateway.subscriptions.bus import Bus, Event
from gateway.subscriptions.encoding import Outgoing
from gateway.subscriptions.filters import ACKNOWLEDGED, DELIVERABLE, SubscriptionFilter
from gateway.subscriptions.poll import PollSettings, Poller, minus, native_part, refuses_listen

if TYPE_CHECKING:
    from gateway.backends.base import Message
    from gateway.settings import SubscriptionSettings

log = logging.getLogger("gateway.subscriptions.upstream")


@dataclass(frozen=True, slots=True)
class StreamKey:
    backend: str
    filter: SubscriptionFilter

    def stream_id(self) -> str:
        """Stable across replicas (it names the stream's lease and events on the bus)."""
        canonical = orjson.dumps([self.backend, sorted(self.filter.lists), sorted(self.filter.uris)])
        return hashlib.sha256(canonical).hexdigest()[:32]


class Sink(Protocol):
    """A client stream as the upstream sees it (hub.ClientListen)."""

    def offer(self, stream_id: str, outgoing: Outgoing) -> None: ...

    def granted(self, stream_id: str) -> SubscriptionFilter: ...

    def acknowledged_late(self, stream: UpstreamListen, granted: SubscriptionFilter) -> None: ...


@dataclass(frozen=True, slots=True)
class Timing:
    linger_seconds: float = 2.0
    reconnect_initial_seconds: float = 0.2
    reconnect_max_seconds: float = 15.0
    # What a backend that cannot listen gets instead (poll.py).
    poll: PollSettings = PollSettings()

    @classmethod
    def from_settings(cls, s: SubscriptionSettings) -> Timing:
        return cls(s.linger_seconds, s.reconnect_initial_seconds, s.reconnect_max_seconds,
                   PollSettings(s.poll_fallback, s.poll_min_seconds, s.poll_max_seconds))


class UpstreamListen:
    def __init__(self, key: StreamKey, backend: Backend, bus: Bus, timing: Timing,
                 retire: Callable[[UpstreamListen], bool]) -> None:
        self.key = key
        self.id = key.stream_id()
        self.backend = backend
        self.bus = bus
        self.timing = timing
        # Called when the stream looks idle; the hub forgets the stream and answers True, or
        # answers False when a client attached meanwhile.
        self._retire = retire
        self.sinks: set[Sink] = set()
        # Clients acknowledged before this stream was (its ack did not come within
        # `ack_timeout_seconds`: a slow or down backend, or a lease still held by a replica
        # that died before storing the ack), and what each wants of it: they stay attached,
        # and the first ack decides what they get (hub.ClientListen.acknowledged_late).
        self.late: dict[Sink, SubscriptionFilter] = {}
        self._filters: dict[SubscriptionFilter, SubscriptionFilter] = {}
        self._idle_since: float | None = time.monotonic()
        self.acked: SubscriptionFilter | None = None
        self._acked_event = asyncio.Event()
        self.holding = False
        # The upstream was never acknowledged and the last attempt failed (backend down):
        # clients are acknowledged without this stream at once instead of after a timeout.
        self.failing = False
        self._task: asyncio.Task[None] | None = None

    # -- clients --------------------------------------------------------------------------

    def canonical(self, granted: SubscriptionFilter) -> SubscriptionFilter:
        """One object per distinct filter granted on this stream, so that a fan-out judges
        each filter once (encoding.Outgoing.admitted_by), however many clients share it."""
        return self._filters.setdefault(granted, granted)

    def attach(self, sink: Sink) -> None:
        self.sinks.add(sink)
        self._idle_since = None

    def detach(self, sink: Sink) -> None:
        self.sinks.discard(sink)
        self.late.pop(sink, None)
        if not self.sinks and self._idle_since is None:
            self._idle_since = time.monotonic()

    def idle(self) -> bool:
        return not self.sinks and (
            self._idle_since is None or time.monotonic() - self._idle_since >= self.timing.linger_seconds
        )

    async def wait_ack(self, timeout: float) -> SubscriptionFilter | None:
        """What the backend acknowledged, or None when no ack came within `timeout`."""
        if self.acked is None and not self.failing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked_event.wait(), timeout)
        return self.acked

    # -- events from the bus (every replica, holder or not) -------------------------------

    def wait_late(self, sink: Sink, wants: SubscriptionFilter) -> None:
        """`sink` was acknowledged without this stream; the first ack decides its grant."""
        if self.acked is not None:
            sink.acknowledged_late(self, wants & self.acked)
        else:
            self.late[sink] = wants

    def on_ack(self, granted: SubscriptionFilter) -> None:
        self.acked = granted
        self.failing = False
        self._acked_event.set()
        if self.late:
            late, self.late = self.late, {}
            for sink, wants in late.items():
                sink.acknowledged_late(self, wants & granted)

    def fan_out(self, message: Message) -> None:
        """Hand `message` to every client of this stream, encoded once for all of them
        (encoding.py): each client in turn makes its bytes (or queues the message), and the
        connections are written back to back, a few hundred at a time, in the same pass."""
        outgoing = Outgoing(message)
        started = time.perf_counter()
        # The streams' writes leave back to back, BURST_WRITES at a time (write_batch.py `burst`).
        with write_batch.for_loop(asyncio.get_running_loop()).burst():
            for sink in tuple(self.sinks):
                sink.offer(self.id, outgoing)
        metrics.FANOUT_SECONDS.observe(time.perf_counter() - started)

    def fan_out_gap(self) -> None:
        # Once per type a client was granted: the same synthetic messages for clients granted
        # the same filter, encoded once per filter.
        encoded: dict[SubscriptionFilter, list[Outgoing]] = {}
        for sink in tuple(self.sinks):
            granted = sink.granted(self.id)
            outgoing = encoded.get(granted)
            if outgoing is None:
                outgoing = encoded[granted] = [Outgoing(m) for m in granted.notifications()]
            for one in outgoing:
                sink.offer(self.id, one)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"listen-{self.key.backend}-{self.id[:8]}")

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        try:
            while True:
                if await self.bus.acquire(self.id):
                    await self._hold()
                else:
                    await self._follow()
                if self.idle() and self._retire(self):
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("listen stream %s for backend %s failed", self.id[:8], self.key.backend)
            self._retire(self)
        finally:
            with contextlib.suppress(Exception):
                await self.bus.unwant(self.id)

    async def _follow(self) -> None:
        """Another replica holds the stream: say we want it, learn its ack, and look for a
        free lease again after a fraction of the lease (takeover within ~lease time)."""
        await self.bus.want(self.id)
        if self.acked is None:
            stored = await self.bus.read_ack(self.id)
            if stored is not None:
                self.on_ack(SubscriptionFilter.from_wire(stored.get("f")))
        await asyncio.sleep(self.bus.tick_seconds)

    async def _hold(self) -> None:
        """This replica holds the lease: run the upstream listen while the lease is ours and
        someone (here or on another replica) wants the stream."""
        self.holding = True
        metrics.UPSTREAMS.labels(self.key.backend).inc()
        # A stream that was already delivering (we followed it, or held it before) may have
        # lost events in the handover.
        upstream = asyncio.create_task(self._upstream(gap_pending=self.acked is not None))
        try:
            while True:
                await asyncio.sleep(self.bus.tick_seconds)
                ack = {"f": self.acked.to_wire()} if self.acked is not None else None
                if not await self.bus.renew(self.id, ack):
                    log.warning("listen stream %s for backend %s: lease lost to another replica",
                                self.id[:8], self.key.backend)
                    return
                if self.idle() and not await self.bus.others_want(self.id):
                    return
        finally:
            upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upstream
            self.holding = False
            metrics.UPSTREAMS.labels(self.key.backend).dec()
            await self.bus.release(self.id)

    async def _publish(self, kind: str, **fields: Any) -> None:
        event: Event = {"t": kind, "k": self.id, "b": self.key.backend, **fields}
        await self.bus.publish(event)

    async def _upstream(self, *, gap_pending: bool) -> None:
        attempt = 0
        polls = self.timing.poll.enabled
        while True:
            delivering = False
            reply: Reply | None = None
            poller: asyncio.Task[None] | None = None
            try:
                # Ask the backend's own listen only for what it says it delivers; with nothing
                # to ask, the whole stream is polled (docs/subscriptions.md "Backends without
                # listen").
                asked = native_part(self.backend.capabilities, self.key.filter) if polls else self.key.filter
                if asked.empty and polls:
                    await self._poll_only("it advertises none of it", gap_pending=gap_pending)
                call = internal_call("subscriptions/listen", {"notifications": asked.to_wire()},
                                     request_id=f"mcp-gateway-listen-{self.id[:12]}")
                reply = await self.backend.send(call)
                if reply.stream is None:
                    error = (reply.message or {}).get("error") or {}
                    if polls:
                        await reply.aclose()
                        await self._poll_only(f"it refused subscriptions/listen ({error.get('code')} "
                                              f"{error.get('message')})", gap_pending=gap_pending)
                    log.warning("backend %s refused subscriptions/listen (%s %s); its notifications are not "
                                "offered to clients", self.key.backend, error.get("code"), error.get("message"))
                    await self._publish("ack", f={})
                    attempt = max(attempt, 6)  # a refusal is not a blip: retry slowly
                else:
                    async for message in reply.stream:
                        method = message.get("method")
                        if method == ACKNOWLEDGED:
                            params = message.get("params") or {}
                            granted = SubscriptionFilter.from_wire(params.get("notifications")) & asked
                            missing = minus(self.key.filter, granted)
                            if polls and granted.empty:
                                await reply.aclose()
                                await self._poll_only("its listen acknowledged none of it", gap_pending=gap_pending)
                            if polls and not missing.empty:
                                # What it did not acknowledge is polled beside its stream.
                                poller = await self._start_polling(missing)
                                granted = granted | missing
                            delivering, attempt = True, 0
                            await self._publish("ack", f=granted.to_wire())
                            if gap_pending:
                                gap_pending = False
                                metrics.GAPS.labels(self.key.backend).inc()
                                await self._publish("gap", u=sorted(self.key.filter.uris))
                        elif method in DELIVERABLE and delivering:
                            await self._publish("event", m=message)
                        elif method is None:
                            log.info("backend %s ended listen stream %s", self.key.backend, self.id[:8])
                            break
                        # Anything else is not a listen-stream notification: dropped (digest §c).
            except rpc.McpError as exc:
                if polls and refuses_listen(exc):
                    await self._poll_only(f"it refused subscriptions/listen ({exc.message})", gap_pending=gap_pending)
                log.info("listen stream %s to backend %s: %s", self.id[:8], self.key.backend, exc.message)
            finally:
                if poller is not None:
                    poller.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await poller
                if reply is not None:
                    with contextlib.suppress(Exception):
                        await reply.aclose()
            if delivering:
                gap_pending = True
            elif self.acked is None:
                self.failing = True
                self._acked_event.set()  # wake clients waiting for an ack that is not coming
            metrics.RECONNECTS.labels(self.key.backend).inc()
            ceiling = min(self.timing.reconnect_max_seconds, self.timing.reconnect_initial_seconds * 2 ** attempt)
            attempt += 1
            await asyncio.sleep(random.uniform(ceiling / 2, ceiling))

    def _poller(self, watch: SubscriptionFilter) -> Poller:
        async def publish(message: Message) -> None:
            await self._publish("event", m=message)

        return Poller(self.backend, watch, self.timing.poll, publish)

    async def _start_polling(self, watch: SubscriptionFilter) -> asyncio.Task[None]:
        poller = self._poller(watch)
        await poller.baseline()
        return asyncio.create_task(poller.run(), name=f"poll-{self.key.backend}-{self.id[:8]}")

    async def _poll_only(self, why: str, *, gap_pending: bool) -> None:
        """The backend delivers none of this stream: poll all of it for as long as this
        replica holds the stream (the holder's `_hold` cancels it). The ack comes after the
        baseline, so no change after the ack goes unreported; after a handover the clients are
        told to refetch, as for a real listen (what changed meanwhile has no digest here)."""
        log.info("backend %s: listen stream %s is polled instead (%s)", self.key.backend, self.id[:8], why)
        poller = self._poller(self.key.filter)
        await poller.baseline()
        await self._publish("ack", f=self.key.filter.to_wire())
        if gap_pending:
            metrics.GAPS.labels(self.key.backend).inc()
            await self._publish("gap", u=sorted(self.key.filter.uris))
        await poller.run()
        # Nothing left to poll (the backend implements none of these lists): hold the stream
        # quietly, as a backend whose listen stays silent would.
        await asyncio.Event().wait()
