"""The subscription hub: many client `subscriptions/listen` streams over few upstream ones.

A client's listen is planned against the fleet (which backend can deliver which of the
requested types, from its advertised capabilities and the URI routes), attached to the shared
upstream streams that carry them (`upstream.py`), acknowledged with exactly what those
upstreams acknowledged, and then fed every matching notification, re-tagged with the client's
own listen id (spec: basic/patterns/subscriptions; digest §d [GW] "Gateway fan-out").

Each client stream has a bounded queue. Fan-out never waits for a client: a client whose queue
is full is cut off (its stream closes without the graceful result, which tells it to
re-listen and refetch) so one stalled reader costs the others nothing.

Every notification first invalidates the matching cache entries (digest §e), then reaches
clients, so a client that refetches on the notification never gets the stale answer: not
from the store, and not from a fetch that was in flight when the notification came (such a
fetch is neither stored nor joined, cache/service.py; limits in docs/cache.md "Invalidation").
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any

from gateway import descriptors
from gateway.backends.base import Message, Reply
from gateway.cache import NoCache, ResponseCache
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta, sse
from gateway.subscriptions import metrics
from gateway.subscriptions.bus import Bus, Event, LocalBus
from gateway.subscriptions.encoding import Outgoing, encode_id, tag
from gateway.subscriptions.filters import (
    ACKNOWLEDGED,
    INVALIDATES,
    LIST_FLAGS,
    RESOURCE_UPDATED,
    SubscriptionFilter,
    deliverable,
    parse_request,
    union,
)
from gateway.subscriptions.poll import minus, pollable
from gateway.subscriptions.upstream import StreamKey, Timing, UpstreamListen

if TYPE_CHECKING:
    from gateway.direct_stream import DirectStream
    from gateway.protocol.request import Call
    from gateway.routing.table import RouteTable, Target
    from gateway.settings import SubscriptionSettings

log = logging.getLogger("gateway.subscriptions")

_NOTHING = SubscriptionFilter()
# The queue of a stream delivered directly: it holds nothing (maxlen 0), and one serves all.
_DRAINED: collections.deque[Any] = collections.deque(maxlen=0)
# The pseudo stream a reload's list-changed notifications come from (ClientListen.tell).
_RELOAD = "gateway-reload"


class ClientListen:
    """One client's listen stream: the sink the upstreams fan out to, and what the endpoint
    writes to the client (the ack, notifications, maybe the final result).

    Two ways to the client. Under the gateway's own HTTP/1.1 protocol the endpoint hands the
    stream its connection (`deliver_to`, direct_stream.py) once the ack is due: every
    notification is then written to the socket in the loop pass that received it, spliced from
    the one encoding of that notification (encoding.py), and nothing waits per stream (no
    task, queue or coroutine). Otherwise (`server.http: uvicorn`) the endpoint iterates it as
    an async iterator of messages and writes them through the ASGI `send`, from a bounded
    queue."""

    __slots__ = ("hub", "listen_id", "principal", "streams", "_max", "_queue", "_wake", "_granted", "_ack",
                 "_ending", "_result_sent", "_detached", "_owner", "_id_json", "_channel", "_behind", "_quiet",
                 "requested", "honored", "confined_to")

    # `__anext__` may be cancelled while it waits (a keep-alive timeout) and called again
    # without losing a message: the endpoint then reads it directly, with no pump task.
    cancel_safe_next = True

    def __init__(self, hub: SubscriptionHub, listen_id: rpc.RequestId, principal: str, queue_size: int,
                 owner: asyncio.Task[Any] | None) -> None:
        self.hub = hub
        self.listen_id = listen_id
        self.principal = principal
        self._max = queue_size
        self._queue: collections.deque[tuple[str, Outgoing]] = collections.deque()
        self._wake: asyncio.Future[None] | None = None
        self._granted: dict[str, SubscriptionFilter] = {}
        self.streams: list[UpstreamListen] = []
        self._ack: Message | None = None
        self._ending: str | None = None  # "graceful" | "abrupt"
        self._result_sent = False
        self._detached = False
        # What the client asked for and what its ack honoured: a reload attaches it to the
        # streams of backends added meanwhile and tells it which lists changed.
        self.requested = _NOTHING
        self.honored = _NOTHING
        # A view's listen (routing/views.py): the backends it may hear, never others a reload
        # adds; None: the whole fleet, whatever it becomes.
        self.confined_to: frozenset[str] | None = None
        # The request task writing this stream to the client. Cancelling it is how a stream
        # is cut when its client stopped reading: the endpoint's write may be blocked on a
        # full socket, which nothing else would wake (the same path as a disconnect).
        self._owner = owner
        self._id_json = encode_id(listen_id)
        # Direct delivery (`deliver_to`): the connection, the notifications written while its
        # buffer was over the high-water mark, and whether nothing was written since the last
        # keep-alive tick.
        self._channel: DirectStream | None = None
        self._behind = 0
        self._quiet = False

    # -- the upstream side (Sink) ---------------------------------------------------------

    def grant(self, stream: UpstreamListen, wants: SubscriptionFilter) -> None:
        self.streams.append(stream)
        self._granted[stream.id] = wants
        stream.attach(self)

    def granted(self, stream_id: str) -> SubscriptionFilter:
        return self._granted.get(stream_id, _NOTHING)

    def replace_stream(self, old: UpstreamListen, new: UpstreamListen | None) -> None:
        """A reload closed `old` (its backend was removed, or replaced by `new` under the same
        key): the client stream itself stays open."""
        if old in self.streams:
            self.streams.remove(old)
        late = old.late.pop(self, None)
        if new is None:
            self._granted.pop(old.id, None)
        elif new not in self.streams and not self._detached:
            self.streams.append(new)
            new.attach(self)
            if late is not None:
                new.wait_late(self, late)

    def acknowledged_late(self, stream: UpstreamListen, granted: SubscriptionFilter) -> None:
        """`stream` was acknowledged after this client's own ack went out without it
        (`SubscriptionHub.listen`), and grants `granted` of what the client wanted of it.

        What the client's ack listed can simply start: the client is told that list (or
        resource) may have changed meanwhile, as after a gap, and hears the stream from now
        on. A type its ack left out cannot be delivered on this stream (spec §Acknowledgment:
        the ack is what the server agreed to honor), so the client is cut instead: the stream
        ends without the graceful result, the spec's signal for "re-listen", and the new
        listen is acknowledged with everything."""
        if self._ending is not None or stream not in self.streams:
            return
        if granted.empty:
            metrics.LATE_ACKS.labels(stream.key.backend, "nothing").inc()
            self.streams.remove(stream)
            stream.detach(self)
            return
        if minus(granted, self.honored).empty:
            metrics.LATE_ACKS.labels(stream.key.backend, "granted").inc()
            log.info("listen stream %r: backend %s acknowledged late; delivering it from now on",
                     self.listen_id, stream.key.backend)
            granted = self._granted[stream.id] = stream.canonical(granted)
            for message in granted.notifications():
                self.offer(stream.id, Outgoing(message))
            return
        log.info("listen stream %r: backend %s acknowledged late what this stream's ack did not list; "
                 "closing it so that it re-listens", self.listen_id, stream.key.backend)
        metrics.LATE_ACKS.labels(stream.key.backend, "relisten").inc()
        self._cut()

    def tell(self, lists: frozenset[str]) -> None:
        """A reload changed what the fleet lists: `notifications/*/list_changed` for each of
        `lists` that this client asked for and was granted."""
        granted = self.honored.lists | union(self._granted.values()).lists
        self._granted[_RELOAD] = SubscriptionFilter(lists=lists & self.requested.lists & granted)
        for message in self._granted[_RELOAD].notifications():
            self.offer(_RELOAD, Outgoing(message))

    def offer(self, stream_id: str, outgoing: Outgoing) -> None:
        # Once per client per notification: the fan-out's hot path (bench/README.md "Listen
        # fan-out at dashboard scale"), written to take few steps.
        if self._ending is not None:
            return
        granted = self._granted.get(stream_id)
        if granted is None:
            return
        # `Outgoing.admitted_by`, its common case inline: the filter judged last, shared by most
        # clients of the stream.
        if not (outgoing._admitted if granted is outgoing._judged else outgoing.admitted_by(granted)):
            return
        channel = self._channel
        if channel is not None:
            # Back-pressure per stream: the socket took what the kernel would, the rest waits
            # in the transport's buffer; past its high-water mark every notification counts as
            # one behind, and `queue_size` of them cut the stream (as a full queue does).
            if channel.paused:
                self._behind += 1
                if self._behind > self._max:
                    self._overflow()
                    return
            elif self._behind:
                self._behind = 0
            before = outgoing.before
            if before is None:
                before = outgoing.encode()
            if before:
                channel.write_spliced(outgoing, self._id_json)
            else:
                channel.write(outgoing.event_for(self.listen_id, self._id_json))
            self._quiet = False
            return
        if len(self._queue) >= self._max:
            self._overflow()
            return
        self._queue.append((stream_id, outgoing))
        self._wakeup()

    def _overflow(self) -> None:
        metrics.OVERFLOWS.inc()
        log.warning("listen stream %r (principal %s) fell %d notifications behind; closing it so that it "
                    "re-listens", self.listen_id, self.principal, self._max)
        self._queue.clear()
        self._cut()

    def _cut(self) -> None:
        """End the stream without the graceful result: the client sees it broken."""
        channel = self._channel
        if channel is not None:
            self._channel = None
            self._ending = "abrupt"
            self.detach()
            channel.cut()  # no end of the response: the client sees the stream broken
            return
        self.end(graceful=False)
        if self._owner is not None and not self._owner.done() and self._owner is not asyncio.current_task():
            self._owner.cancel()

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def end(self, *, graceful: bool) -> None:
        """Stop receiving; the stream yields what is queued, then (graceful) the final
        result, then ends."""
        if self._ending is None:
            self._ending = "graceful" if graceful else "abrupt"
        self.detach()
        channel = self._channel
        if channel is not None:
            self._channel = None
            channel.finish(self._final_event())
            return
        self._wakeup()

    def detach(self) -> None:
        if self._detached:
            return
        self._detached = True
        for stream in self.streams:
            stream.detach(self)
        self.hub._forget(self)

    def _final_event(self) -> bytes:
        """What ends the stream after what was delivered: the graceful result, or nothing."""
        if self._ending == "graceful" and not self._result_sent:
            self._result_sent = True
            return sse.encode(self._result())
        return b""

    def _result(self) -> Message:
        # spec §Graceful Closure: the response to the listen request, then close.
        return rpc.result_message(self.listen_id, {
            "resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: self.listen_id}})

    # -- the client side: direct delivery -------------------------------------------------

    def deliver_to(self, channel: DirectStream, keepalive_seconds: float) -> None:
        """From now on write straight to `channel`: the ack, what was queued since it was
        made (re-checked against the grant, which the ack may have narrowed), then every
        notification as it comes. No request task is left: cutting a stalled reader cuts
        the connection."""
        self._owner = None
        ack, self._ack = self._ack, None
        if ack is not None:
            channel.write(sse.encode(ack))
        while self._queue and self._ending != "abrupt":
            stream_id, outgoing = self._queue.popleft()
            if self.granted(stream_id).admits(outgoing.message):
                channel.write(outgoing.event_for(self.listen_id, self._id_json))
        self._queue = _DRAINED
        if self._ending is not None:
            channel.finish(self._final_event())
            return
        channel.on_lost = self._lost
        self._channel = channel
        self.hub._delivering(self, keepalive_seconds)

    def _lost(self) -> None:
        """The client's connection closed."""
        self._channel = None
        if self._ending is None:
            self._ending = "abrupt"
        self.detach()

    def keepalive(self) -> None:
        """A keep-alive comment if nothing was written for a whole tick (hub timer, every
        half `server.keepalive_seconds`): quiet streams hear one every `keepalive_seconds`,
        and none is quiet for longer."""
        channel = self._channel
        if channel is None:
            return
        if self._quiet:
            channel.write(sse.KEEPALIVE)
            self._quiet = False  # a write like any other: an idle stream hears one every other tick
        else:
            self._quiet = True

    # -- the client side: the Reply stream (ASGI send) ------------------------------------

    def __aiter__(self) -> ClientListen:
        return self

    async def __anext__(self) -> Message:
        if self._ack is not None:
            ack, self._ack = self._ack, None
            return ack
        while True:
            while self._queue and self._ending != "abrupt":
                stream_id, outgoing = self._queue.popleft()
                # Re-checked here: messages queued before the ack narrowed the grant.
                if self.granted(stream_id).admits(outgoing.message):
                    return tag(outgoing.message, self.listen_id)
            if self._ending == "graceful" and not self._result_sent:
                self._result_sent = True
                return self._result()
            if self._ending is not None:
                raise StopAsyncIteration
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    async def aclose(self) -> None:
        """The client went away (or the endpoint is done): detach at once."""
        if self._ending is None:
            self._ending = "abrupt"
        self.detach()


def _lists_of(capabilities: dict[str, Any] | None) -> frozenset[str]:
    """The list-changed flags whose lists a backend serves (all of them while unknown)."""
    if capabilities is None:
        return frozenset(LIST_FLAGS)
    return frozenset(flag for flag in LIST_FLAGS if isinstance(capabilities.get(_LIST_CAPABILITY[flag]), dict))


_LIST_CAPABILITY = {"toolsListChanged": "tools", "promptsListChanged": "prompts",
                    "resourcesListChanged": "resources"}


class SubscriptionHub:
    def __init__(self, settings: SubscriptionSettings, table: RouteTable, *, cache: ResponseCache | None = None,
                 bus: Bus | None = None) -> None:
        self.settings = settings
        self.table = table
        self.cache: ResponseCache = cache or NoCache()
        self.bus: Bus = bus or LocalBus()
        self.timing = Timing.from_settings(settings)
        self._streams: dict[str, UpstreamListen] = {}
        self._clients: set[ClientListen] = set()
        # Clients delivered directly to their connections, and the timer that writes their
        # keep-alive comments (one timer for all of them, not one per stream).
        self._direct: set[ClientListen] = set()
        self._keepalive_every: float | None = None
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._per_principal: collections.Counter[str] = collections.Counter()
        self._backends = {t.backend.name: t.backend for t in table.targets}
        self._closing = False
        self._started = False

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.bus.start(self._on_event, self._on_resync)

    # -- a client listens -----------------------------------------------------------------

    async def listen(self, call: Call, targets: tuple[Target, ...], confined_to: frozenset[str] | None = None
                     ) -> Reply:
        """`confined_to`: a view's backends (`targets` are those of them in the fleet now)."""
        assert call.id is not None
        requested, asks_tasks = parse_request(call.params, call.id)
        if asks_tasks and not call.declares_extension(meta.TASKS_EXTENSION):
            # SEP-2663: taskIds needs the Tasks extension declared.
            raise rpc.missing_capability({"extensions": {meta.TASKS_EXTENSION: {}}}, call.id)
        await self.start()
        principal = call.principal.key
        self._admit(principal, call.id)
        client = ClientListen(self, call.id, principal, self.settings.queue_size, asyncio.current_task())
        client.confined_to = confined_to
        self._clients.add(client)
        self._per_principal[principal] += 1
        metrics.CLIENT_STREAMS.inc()
        try:
            plan = await self._plan(requested, targets)
            for key, wants in plan:
                client.grant(self._stream(key), wants)
            await asyncio.gather(*(s.wait_ack(self.settings.ack_timeout_seconds) for s in client.streams))
            late: list[tuple[UpstreamListen, SubscriptionFilter]] = []
            for stream in client.streams:
                wants = client._granted[stream.id]
                if stream.acked is None:
                    # No ack in time: the client is acknowledged without this stream, which
                    # stays attached; its ack, when it comes, decides (`acknowledged_late`).
                    del client._granted[stream.id]
                    late.append((stream, wants))
                else:
                    client._granted[stream.id] = stream.canonical(wants & stream.acked)
            honored = union(client._granted.values())
            client.requested, client.honored = requested, honored
        except BaseException:
            client.end(graceful=False)
            raise
        # Streams that grant nothing are left at once (they would only hold the upstream).
        for stream in tuple(client.streams):
            if stream.acked is not None and client.granted(stream.id).empty:
                client.streams.remove(stream)
                stream.detach(client)
        for stream, wants in late:
            stream.wait_late(client, wants)
        client._ack = rpc.notification(ACKNOWLEDGED, {
            "_meta": {meta.SUBSCRIPTION_ID: call.id}, "notifications": honored.to_wire()})
        return Reply("gateway", stream=client)

    def _admit(self, principal: str, request_id: rpc.RequestId) -> None:
        s = self.settings
        if self._closing:
            metrics.REJECTED.labels("shutdown").inc()
            raise rpc.McpError(rpc.GATEWAY_OVERLOADED, "The gateway is shutting down; re-send subscriptions/listen",
                               status=503, data={"reason": "shutdown"}, request_id=request_id)
        if len(self._clients) >= s.max_listens:
            metrics.REJECTED.labels("total").inc()
            raise rpc.McpError(
                rpc.GATEWAY_OVERLOADED,
                f"Too many listen streams: this gateway replica holds its limit of {s.max_listens} "
                "(subscriptions.max_listens)", status=503, data={"limit": "subscriptions.max_listens",
                                                                 "max": s.max_listens}, request_id=request_id)
        capacity = descriptors.listen_capacity()
        if capacity is not None and len(self._clients) >= capacity:
            metrics.REJECTED.labels("descriptors").inc()
            raise rpc.McpError(
                rpc.GATEWAY_OVERLOADED,
                f"Too many listen streams: this gateway replica's file descriptors allow {capacity} "
                f"(RLIMIT_NOFILE less {descriptors.RESERVED} kept for other work)", status=503,
                data={"limit": "RLIMIT_NOFILE", "max": capacity}, request_id=request_id)
        if self._per_principal[principal] >= s.max_listens_per_principal:
            metrics.REJECTED.labels("per_principal").inc()
            raise rpc.McpError(
                rpc.GATEWAY_OVERLOADED,
                f"Too many listen streams for this caller: {s.max_listens_per_principal} are open "
                "(subscriptions.max_listens_per_principal); close one first", status=429,
                data={"limit": "subscriptions.max_listens_per_principal", "max": s.max_listens_per_principal},
                request_id=request_id)

    async def _plan(self, requested: SubscriptionFilter, targets: tuple[Target, ...]
                    ) -> list[tuple[StreamKey, SubscriptionFilter]]:
        """Which upstream streams carry which part of the request. Per backend: one stream
        with every list-changed flag the backend can deliver (shared by all list listeners,
        and it keeps the cache honest for all list types), and one per distinct set of URIs."""
        capabilities = await asyncio.gather(*(self._capabilities(t) for t in targets))
        can = {t.backend.name: deliverable(c) for t, c in zip(targets, capabilities, strict=True)}
        # What a backend that cannot listen can still deliver, polled (poll.py): every list it
        # has, and reads of the URIs it owns (never of URIs nobody is known to own).
        polled = {t.backend.name: pollable(c) if self.timing.poll.enabled else (frozenset(), False)
                  for t, c in zip(targets, capabilities, strict=True)}
        uris_for: dict[str, set[str]] = collections.defaultdict(set)
        for uri in requested.uris:
            owner = self.table.resolve_uri(uri)
            candidates = (owner,) if owner is not None else targets
            for target in candidates:
                if can[target.backend.name][1] or (owner is not None and polled[target.backend.name][1]):
                    uris_for[target.backend.name].add(uri)
        plan: list[tuple[StreamKey, SubscriptionFilter]] = []
        for target in targets:
            name = target.backend.name
            flags = can[name][0] | polled[name][0]
            wanted_flags = requested.lists & flags
            if wanted_flags:
                plan.append((StreamKey(name, SubscriptionFilter(lists=flags)),
                             SubscriptionFilter(lists=wanted_flags)))
            if uris_for.get(name):
                uris = frozenset(uris_for[name])
                plan.append((StreamKey(name, SubscriptionFilter(uris=uris)), SubscriptionFilter(uris=uris)))
        return plan

    async def _capabilities(self, target: Target) -> dict[str, Any] | None:
        backend = target.backend
        if backend.capabilities is not None:
            return backend.capabilities
        try:
            await asyncio.wait_for(backend.discover(), self.settings.ack_timeout_seconds)
        except (rpc.McpError, TimeoutError) as exc:
            log.info("listen: backend %s capabilities unknown (%s); its notifications are not offered",
                     backend.name, getattr(exc, "message", None) or "discovery timed out")
        return backend.capabilities

    def _stream(self, key: StreamKey) -> UpstreamListen:
        stream_id = key.stream_id()
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = UpstreamListen(key, self._backends[key.backend], self.bus, self.timing, self._retire)
            self._streams[stream_id] = stream
            stream.start()
        return stream

    def _retire(self, stream: UpstreamListen) -> bool:
        if stream.sinks:
            return False
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]
        return True

    def _delivering(self, client: ClientListen, keepalive_seconds: float) -> None:
        self._direct.add(client)
        # Ticks at half the interval: a stream quiet for a whole tick gets a comment at the
        # next one, so no stream stays quiet for longer than `keepalive_seconds`.
        every = keepalive_seconds / 2
        if self._keepalive_every is None or every < self._keepalive_every:
            self._keepalive_every = every
            if self._keepalive_timer is not None:
                self._keepalive_timer.cancel()
                self._keepalive_timer = None
        if self._keepalive_timer is None:
            self._keepalive_timer = asyncio.get_running_loop().call_later(every, self._keepalive)

    def _keepalive(self) -> None:
        self._keepalive_timer = None
        for client in tuple(self._direct):
            client.keepalive()
        if self._direct and self._keepalive_every is not None:
            self._keepalive_timer = asyncio.get_running_loop().call_later(self._keepalive_every, self._keepalive)

    def _forget(self, client: ClientListen) -> None:
        self._direct.discard(client)
        if client in self._clients:
            self._clients.discard(client)
            self._per_principal[client.principal] -= 1
            if self._per_principal[client.principal] <= 0:
                del self._per_principal[client.principal]
            metrics.CLIENT_STREAMS.dec()

    # -- events from the bus --------------------------------------------------------------

    async def _on_event(self, event: Event) -> None:
        kind, backend = event.get("t"), event.get("b")
        stream = self._streams.get(event.get("k", ""))
        if not isinstance(backend, str) or backend not in self._backends:
            return  # another fleet's event (a replica with a different config)
        if kind == "ack":
            if stream is not None:
                stream.on_ack(SubscriptionFilter.from_wire(event.get("f")))
        elif kind == "event":
            message = event.get("m")
            if not isinstance(message, dict):
                return
            metrics.NOTIFICATIONS.labels(backend).inc()
            await self._invalidate(backend, message)
            if stream is not None:
                stream.fan_out(message)
        elif kind == "gap":
            uris = event.get("u")
            await self._invalidate_backend(backend, uris if isinstance(uris, list) else [])
            if stream is not None:
                stream.fan_out_gap()

    async def _invalidate(self, backend: str, message: Message) -> None:
        method = message.get("method")
        try:
            if method in INVALIDATES:
                await self.cache.invalidate_lists(backend, INVALIDATES[method])
            elif method == RESOURCE_UPDATED:
                uri = (message.get("params") or {}).get("uri")
                if isinstance(uri, str):
                    await self.cache.invalidate_resource(backend, uri)
        except Exception:  # a cache fault must not stop delivery
            log.exception("cache invalidation for %s from backend %s failed", method, backend)

    async def _invalidate_backend(self, backend: str, uris: list[Any]) -> None:
        """After a gap anything may have changed: every list, and the watched resources."""
        try:
            await self.cache.invalidate_lists(backend, None)
            for uri in uris:
                if isinstance(uri, str):
                    await self.cache.invalidate_resource(backend, uri)
        except Exception:
            log.exception("cache invalidation after a listen gap on backend %s failed", backend)

    async def _on_resync(self) -> None:
        """The bus was unreachable for a while: events may have been lost for every stream."""
        for stream in tuple(self._streams.values()):
            uris = sorted(stream.key.filter.uris)
            if stream.holding:
                # While our subscription was down, what our upstream published reached only our
                # own clients (bus.publish), yet Redis may have been up and other replicas
                # following this stream, subscribed all along: no resync of theirs will tell
                # their clients. So the gap goes on the bus, to every replica (this one too).
                await self.bus.publish({"t": "gap", "k": stream.id, "b": stream.key.backend, "u": uris})
                continue
            await self._invalidate_backend(stream.key.backend, uris)
            stream.fan_out_gap()

    # -- a reload (gateway/reload/) -------------------------------------------------------

    async def reconfigure(self, table: RouteTable, *, renamed: frozenset[str] = frozenset()) -> None:
        """A reload swapped the fleet (`table`): client streams stay open. Upstream listens of
        backends that are kept go on untouched; those of removed backends close; those of
        replaced backends re-open on the new backend (the same key, so the same grants);
        clients that asked for lists listen to added backends too; and every client hears
        the list-changed notifications of whatever the reload changed (`renamed`: kept
        backends whose names changed, a new prefix)."""
        before = self._backends
        self.table = table
        self._backends = {t.backend.name: t.backend for t in table.targets}
        # Which lists changed, per backend: a view's client hears only its backends' changes.
        changed: dict[str, set[str]] = {}
        for name in renamed:
            changed.setdefault(name, set()).update(_lists_of(self._backends[name].capabilities))
        for name, backend in before.items():
            if self._backends.get(name) is not backend:
                changed.setdefault(name, set()).update(_lists_of(backend.capabilities))
        for stream in tuple(self._streams.values()):
            backend = self._backends.get(stream.key.backend)
            if backend is stream.backend:
                continue
            del self._streams[stream.id]
            sinks = tuple(stream.sinks)
            await stream.aclose()
            replacement = self._stream(stream.key) if backend is not None else None
            for sink in sinks:
                if isinstance(sink, ClientListen):
                    sink.replace_stream(stream, replacement)
        added = tuple(t for t in table.targets if before.get(t.backend.name) is not t.backend)
        if added and self._clients:
            await self._listen_to(added)
        for target in added:
            changed.setdefault(target.backend.name, set()).update(_lists_of(target.backend.capabilities))
        if changed:
            everything = frozenset().union(*changed.values())
            for client in tuple(self._clients):
                confined = client.confined_to
                lists = everything if confined is None else frozenset().union(
                    *(v for k, v in changed.items() if k in confined))
                if lists:
                    client.tell(lists)

    async def _listen_to(self, added: tuple[Target, ...]) -> set[str]:
        """Attach the list listeners to the list streams of backends a reload added; the
        lists those backends serve."""
        everything = SubscriptionFilter(lists=frozenset(LIST_FLAGS))
        plan = await self._plan(everything, added)
        lists: set[str] = set()
        for target in added:
            lists |= _lists_of(target.backend.capabilities)
        for key, offered in plan:
            stream: UpstreamListen | None = None
            for client in tuple(self._clients):
                wants = offered.lists & client.requested.lists
                if not wants or any(s.key.backend == key.backend for s in client.streams):
                    continue
                if client.confined_to is not None and key.backend not in client.confined_to:
                    continue  # a view's listen hears its own backends only
                stream = stream or self._stream(key)
                client.grant(stream, SubscriptionFilter(lists=wants))
            if stream is not None:
                await stream.wait_ack(self.settings.ack_timeout_seconds)
                for sink in tuple(stream.sinks):
                    if not isinstance(sink, ClientListen) or stream.id not in sink._granted:
                        continue
                    if stream.acked is None:  # as in `listen`: its ack, when it comes, decides
                        stream.wait_late(sink, sink._granted.pop(stream.id))
                    else:
                        sink._granted[stream.id] = stream.canonical(sink._granted[stream.id] & stream.acked)
        return lists

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def client_count(self) -> int:
        return len(self._clients)

    @property
    def upstreams(self) -> dict[str, UpstreamListen]:
        return dict(self._streams)

    async def begin_shutdown(self) -> None:
        """Every client gets the graceful-closure result; no new listens are accepted."""
        self._closing = True
        for client in tuple(self._clients):
            client.end(graceful=True)

    async def aclose(self) -> None:
        self._closing = True
        for client in tuple(self._clients):
            client.end(graceful=False)
        if self._keepalive_timer is not None:
            self._keepalive_timer.cancel()
            self._keepalive_timer = None
        await asyncio.gather(*(s.aclose() for s in tuple(self._streams.values())), return_exceptions=True)
        self._streams.clear()
        await self.bus.aclose()
