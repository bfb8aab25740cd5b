"""Legacy client sessions and their resumable SSE streams (digest §h.2, §h.9).

An initialize-era client gets a session from the gateway: a secure random id bound to the
principal that created it, the negotiated version, the client's declared capabilities, its
log level and its resource subscriptions. The gateway is the legacy *server* here, so it owes
the server duties of L-TR §Session Management: unguessable ids, 404 after the session ends,
DELETE to end it.

Sessions live in this process's memory: they hold live things (SSE streams, parked
server-to-client requests, a subscription listener). Alone, a replica mints random ids and a
legacy client must reach it for the life of its session. With `security.secret` and Redis,
fleet.py mints sealed ids any replica can open, and the store here holds only this replica's
materialization of each session (docs/legacy-clients.md "Replicas").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.protocol.principal import ANONYMOUS, Principal, principal_of

log = logging.getLogger("gateway.legacy_clients")

Message = dict[str, Any]

# Events a stream keeps for replay after a dropped connection (L-TR §Resumability). A client
# that falls further behind than this cannot resume that stream.
REPLAY_EVENTS = 512
# How long a finished stream stays resumable, so that a client whose connection broke just
# before the final response can still fetch it.
FINISHED_STREAM_RETENTION_SECONDS = 60.0
# Sessions one authenticated principal may hold at once (further capped at half the store, so
# that one principal can never fill it). L-SBP §Session Hijacking binds sessions to the user;
# without a share per user, one user's flood of `initialize` would evict, least recently used
# first, every other user's session. Unauthenticated callers (auth mode none) have no stable
# identity to count against (the key is a hash of whatever credentials they present, and all
# credential-less callers share one), so for them only the store's LRU bound applies.
MAX_SESSIONS_PER_PRINCIPAL = 100
# A sequence number longer than this is no event id of ours (REPLAY_EVENTS is far smaller).
_MAX_SEQ_DIGITS = 18


def per_principal_share(total: int) -> int:
    """How many of `total` sessions (or HTTP+SSE streams) one authenticated principal may hold."""
    return max(1, min(MAX_SESSIONS_PER_PRINCIPAL, total // 2))


class EventLog:
    """One SSE stream of a session: numbered events, replayable from any retained point.

    Event ids are `<stream id>:<seq>`: globally unique within the session and naming their
    stream, so a `Last-Event-ID` finds the stream it came from (L-TR §Resumability 1). The
    producer (the request's work) appends; any number of consecutive readers (the POST
    response, then GETs with `Last-Event-ID`) follow it. Nothing is broadcast across streams.
    """

    def __init__(self, stream_id: str, *, capacity: int = REPLAY_EVENTS) -> None:
        self.stream_id = stream_id
        self._events: deque[tuple[int, bytes]] = deque(maxlen=capacity)
        self._seq = 0
        self._changed = asyncio.Event()
        self.finished_at: float | None = None
        self.readers = 0
        # The last event a reader wrote to a client: a new reader without `Last-Event-ID`
        # starts after it, so nothing is sent twice and nothing buffered is lost.
        self.delivered = 0

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def _append(self, payload: bytes) -> int:
        self._seq += 1
        self._events.append((self._seq, payload))
        self._changed.set()
        self._changed = asyncio.Event()
        return self._seq

    def prime(self, retry_ms: int) -> None:
        """The priming event: an id and empty data, with the reconnect delay (L-TR §Sending 6)."""
        seq = self._seq + 1
        self._append(f"id: {self.stream_id}:{seq}\nretry: {retry_ms}\ndata: \n\n".encode())

    def append(self, message: Message) -> None:
        seq = self._seq + 1
        self._append(
            f"id: {self.stream_id}:{seq}\nevent: message\ndata: ".encode() + orjson.dumps(message) + b"\n\n"
        )

    def finish(self) -> None:
        if self.finished_at is None:
            self.finished_at = time.monotonic()
            self._changed.set()

    def can_resume_after(self, seq: int) -> bool:
        if seq > self._seq:
            return False
        oldest = self._events[0][0] if self._events else self._seq + 1
        return seq >= oldest - 1

    @property
    def last_seq(self) -> int:
        return self._seq

    async def follow(self, after: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """Events with a sequence number above `after`, then every new one until the stream
        finishes."""
        self.readers += 1
        try:
            while True:
                waiter = self._changed
                for seq, payload in list(self._events):
                    if seq > after:
                        after = seq
                        yield seq, payload
                if self.done and after >= self._seq:
                    return
                await waiter.wait()
        finally:
            self.readers -= 1


def principal_key(scope: Any) -> str:
    """The key a session is bound to: the request's `Principal.key` (protocol/principal.py)."""
    return principal_of(scope).key


def is_authenticated(scope: Any) -> bool:
    """Did the request prove who it is (auth mode jwt)? Only such principals get a share."""
    return principal_of(scope).authenticated


def parse_event_id(value: str) -> tuple[str, int] | None:
    """`<stream>:<seq>` of a `Last-Event-ID`, or None for anything else. The header is the
    client's (L-TR §Resumability 2): only ASCII digits of a bounded length are a sequence
    number (`str.isdigit` also accepts "²", and `int()` refuses over 4,300 digits: either
    used to escape as a 500)."""
    stream, sep, seq = value.rpartition(":")
    if not sep or not stream or not (seq.isascii() and seq.isdigit()) or len(seq) > _MAX_SEQ_DIGITS:
        return None
    return stream, int(seq)


@dataclass(eq=False)
class LegacySession:
    id: str
    principal_key: str
    protocol_version: str
    client_capabilities: dict[str, Any]
    client_info: dict[str, Any] | None
    last_seen: float = 0.0
    initialized: bool = False
    log_level: str | None = None
    subscriptions: set[str] = field(default_factory=set)
    # The client's in-flight requests (client id -> the task doing the work), so that its
    # `notifications/cancelled` can stop them (L-CAN).
    in_flight: dict[Any, asyncio.Task[Any]] = field(default_factory=dict)
    # Requests the gateway sent to the client (gateway id -> future of the client's answer).
    pending: dict[str, asyncio.Future[Message]] = field(default_factory=dict)
    streams: dict[str, EventLog] = field(default_factory=dict)
    # The standalone GET stream: notifications unrelated to any request.
    notifications: EventLog | None = None
    listener: asyncio.Task[None] | None = None
    # The authenticated caller (scope["auth"]) that every modern call of the session carries.
    principal: Principal = ANONYMOUS
    # What the gateway advertised in its InitializeResult (translate.legacy_capabilities).
    server_capabilities: dict[str, Any] = field(default_factory=dict)
    closed: bool = False
    # Set when the session is shared by the fleet (fleet.py): its key in Redis, what makes this
    # replica's stream ids and input-request ids its own, whether Redis has recorded it yet,
    # and which replica holds its GET stream (None: none, or unknown).
    shared_key: str | None = None
    stream_tag: str = ""
    input_id_suffix: str = ""
    recorded: bool = True
    stream_holder: str | None = None
    # Set to stop the reader of the GET stream: a new GET replaces it (server.py).
    stream_stop: asyncio.Event | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    @property
    def active(self) -> bool:
        """Something is streaming to (or waiting for) the client right now."""
        return (
            bool(self.in_flight or self.pending)
            or any(s.readers for s in self.streams.values())
            or bool(self.notifications is not None and self.notifications.readers)
        )

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def next_input_id(self) -> str:
        """The id of a request the gateway sends the client (elicitation, sampling, roots)."""
        return self.next_id("gw") + self.input_id_suffix

    def new_stream(self) -> EventLog:
        self._drop_finished_streams()
        stream = EventLog(self.stream_tag + self.next_id("s"))
        self.streams[stream.stream_id] = stream
        return stream

    def notification_stream(self) -> EventLog:
        if self.notifications is None or self.notifications.done:
            self.notifications = EventLog(self.stream_tag + self.next_id("g"))
            self.streams[self.notifications.stream_id] = self.notifications
        return self.notifications

    def _drop_finished_streams(self) -> None:
        now = time.monotonic()
        for key in [
            k
            for k, s in self.streams.items()
            if s.finished_at is not None and now - s.finished_at > FINISHED_STREAM_RETENTION_SECONDS
        ]:
            del self.streams[key]

    async def close(self) -> None:
        """End the session: stop its work, fail what waits on the client, end its streams."""
        self.closed = True
        tasks = [*self.in_flight.values()]
        if self.listener is not None:
            tasks.append(self.listener)
        for task in tasks:
            task.cancel()
        for future in self.pending.values():
            if not future.done():
                future.cancel()
        for stream in self.streams.values():
            stream.finish()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.in_flight.clear()
        self.pending.clear()


class SessionStore:
    """The sessions of this replica: bounded in number (in total, and per authenticated
    principal), expired after idling."""

    def __init__(
        self,
        *,
        idle_seconds: float,
        max_sessions: int,
        max_per_principal: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if idle_seconds <= 0 or max_sessions <= 0:
            raise ValueError("idle_seconds and max_sessions must be positive")
        self.idle_seconds = idle_seconds
        self.max_sessions = max_sessions
        self.max_per_principal = max_per_principal or per_principal_share(max_sessions)
        self._clock = clock
        self._sessions: OrderedDict[str, LegacySession] = OrderedDict()
        self._held: Counter[str] = Counter()  # live sessions per principal key
        self._closing_tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(
        self,
        principal_key: str,
        protocol_version: str,
        client_capabilities: dict[str, Any],
        client_info: dict[str, Any] | None,
        *,
        authenticated: bool = False,
    ) -> LegacySession:
        await self.sweep()
        while authenticated and self._held[principal_key] >= self.max_per_principal:
            # The principal's share is full: its own least recently used session makes room,
            # never another principal's (L-SBP §Session Hijacking: sessions are the user's).
            own = next(s for s in self._sessions.values() if s.principal_key == principal_key)
            log.warning(
                "legacy sessions per principal (%d) reached: ending that principal's least recently "
                "used session", self.max_per_principal
            )
            await self.end(own)
        while len(self._sessions) >= self.max_sessions:
            # Full: the least recently used session makes room (its client gets 404 and
            # re-initializes, as L-TR §Session Management prescribes).
            _, oldest = self._sessions.popitem(last=False)
            self._release(oldest)
            log.warning(
                "legacy session limit (%d) reached: ending least recently used session", self.max_sessions
            )
            await oldest.close()
        # L-TR: globally unique and cryptographically secure; token_urlsafe is visible ASCII.
        session = LegacySession(
            secrets.token_urlsafe(32),
            principal_key,
            protocol_version,
            client_capabilities,
            client_info,
            last_seen=self._clock(),
        )
        self._sessions[session.id] = session
        self._held[principal_key] += 1
        return session

    def adopt(self, session: LegacySession) -> None:
        """Hold this replica's materialization of a fleet session (fleet.py). The fleet
        enforces the shares; here only the replica's own bound applies, and making room
        forgets a materialization (its streams and calls here end) without ending the session,
        which lives on in its id and in Redis."""
        replaced = self._sessions.pop(session.id, None)
        if replaced is not None:
            self._release(replaced)
            if replaced is not session:
                self._closing(replaced)
        for idle in [s for s in self._sessions.values() if self._expired(s)]:
            del self._sessions[idle.id]
            self._release(idle)
            self._closing(idle)
        while len(self._sessions) >= self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            self._release(oldest)
            self._closing(oldest)
        session.last_seen = self._clock()
        self._sessions[session.id] = session
        self._held[session.principal_key] += 1

    def _closing(self, session: LegacySession) -> None:
        task = asyncio.ensure_future(session.close())
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)

    def peek(self, session_id: str) -> LegacySession | None:
        """The session held here under `session_id`, without touching it (no principal check:
        for the gateway's own bookkeeping, never for a request)."""
        return self._sessions.get(session_id)

    def _release(self, session: LegacySession) -> None:
        self._held[session.principal_key] -= 1
        if self._held[session.principal_key] <= 0:
            del self._held[session.principal_key]

    def touch(self, session: LegacySession) -> None:
        session.last_seen = self._clock()

    def get(self, session_id: str, principal_key: str) -> LegacySession | None:
        """The live session `session_id` of this principal, or None (unknown, expired, ended,
        or another principal's: a session is never the authentication, L-SBP)."""
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            return None
        if not secrets.compare_digest(session.principal_key, principal_key):
            log.warning("legacy session presented by a different principal; treated as unknown")
            return None
        if self._expired(session):
            return None
        session.last_seen = self._clock()
        self._sessions.move_to_end(session_id)
        return session

    def _expired(self, session: LegacySession) -> bool:
        return not session.active and self._clock() - session.last_seen > self.idle_seconds

    async def end(self, session: LegacySession) -> None:
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
            self._release(session)
        await session.close()

    async def sweep(self) -> None:
        for session in [s for s in self._sessions.values() if self._expired(s)]:
            await self.end(session)

    def end_notification_streams(self) -> None:
        for session in self._sessions.values():
            if session.notifications is not None:
                session.notifications.finish()

    async def aclose(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._held.clear()
        for session in sessions:
            await session.close()
