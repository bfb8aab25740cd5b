"""A legacy (initialize-era) backend behind the modern front (digest §h).

`send(call)` takes a validated modern call and answers it as a modern server would: it picks
a warm session from the pool, sends the translated request under a fresh id, and turns what
the backend sends back into modern messages — progress with the client's token, log messages
only when asked for, backend requests as `InputRequiredResult` (MRTR), the final response
with `resultType`, caching hints and serverInfo.

Transport (HTTP or stdio) is a subclass concern: `_new_session`.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.backends.base import Backend, Message, Reply
from gateway.backends.credentials import credentials_for
from gateway.backends.legacy import mrtr, translate
from gateway.backends.legacy.listen import LegacyListens
from gateway.backends.legacy.pool import SessionPool
from gateway.backends.exchange import Exchange
from gateway.backends.legacy.session import LegacySession
from gateway.observability.tracing import traced
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta
from gateway.protocol.principal import ANONYMOUS, Principal
from gateway.protocol.request import Call
from gateway.backends.replica import ReplicaContext
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.legacy")

# How long to wait, after a backend request, for more requests to put in the same
# InputRequiredResult. Concurrent requests leave a legacy server within microseconds; the
# window only has to cover their arrival, and it is spent once per MRTR round, where a human
# or an LLM answers next.
_GATHER_SECONDS = 0.05


class LegacyBackend(Backend):
    def __init__(self, settings: BackendSettings, replica: ReplicaContext | None = None) -> None:
        """`replica`: what this replica shares with the fleet (the sealing key, its address),
        compiled once by Runtime; a backend built alone shares nothing."""
        super().__init__(settings)
        self.replica = replica if replica is not None else ReplicaContext.alone()
        # A call waits for a free session about as long as it would wait to connect.
        # Who the gateway is toward the backend; sessions read their owner's headers live.
        self.credentials = credentials_for(settings)
        self.pool = SessionPool(self.name, self._configured_session, size=settings.session_pool_size,
                                idle_seconds=settings.session_idle_seconds,
                                wait_seconds=settings.connect_timeout_seconds)
        self.listens = LegacyListens(self)
        self.sealer = mrtr.StateSealer(self.replica.secret)
        self.owner = self.replica.owner
        self.continuations = mrtr.Continuations(self.name, max_total=settings.max_parked_calls,
                                                max_per_principal=settings.max_parked_calls_per_principal)
        self.forwarder = mrtr.Forwarder(self.name, settings.timeout_seconds, settings.connect_timeout_seconds)

    # -- transport hooks ----------------------------------------------------------------

    @abc.abstractmethod
    def _new_session(self, capabilities: dict[str, Any], headers: Mapping[str, str]) -> LegacySession:
        """A fresh, not yet initialized session declaring these client capabilities and
        sending these credential headers (HTTP; read at each request)."""

    async def authorize(self, principal: Principal, request_id: Any = None) -> str:
        """The owner whose sessions serve `principal`, its token fetched when due."""
        if self.credentials.dynamic:
            await self.credentials.authorization(principal, request_id)
        return self.credentials.owner(principal)

    def session_capabilities(self, client_capabilities: dict[str, Any]) -> dict[str, Any]:
        return translate.session_capabilities(client_capabilities)

    def _configured_session(self, capabilities: dict[str, Any], owner: str) -> LegacySession:
        """`_new_session` carrying `owner`'s credential headers, told what answers a
        `roots/list` asked outside any client request."""
        session = self._new_session(capabilities, self.credentials.session_headers(owner))
        session.standalone_roots = tuple(root.model_dump(exclude_none=True) for root in self.settings.roots)
        return session

    async def open_channel(self, session: LegacySession) -> tuple[bool, asyncio.Task[None] | None]:
        """Start whatever carries notifications unrelated to requests (HTTP: the GET stream):
        (whether there is such a channel, the task that holds it open if any)."""
        return False, None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self.replica.report_problems()
        if self.settings.forward_headers or self.settings.identity_header:
            # A legacy session serves many clients at once: per-client headers have no place.
            log.warning("backend %s is initialize-era: forward_headers and identity_header apply to modern "
                        "backends only and are not sent", self.name)
        self.pool.start()

    async def aclose(self) -> None:
        self.continuations.close_all()
        await self.listens.aclose()
        await self.pool.aclose()
        await self.forwarder.aclose()
        await self.credentials.aclose()

    async def round_trip(self) -> None:
        """A `ping` on the pooled session (L-BASIC ping; the one `discover` opened or found).
        `server/discover` is answered from that session's initialize, with no request once
        the session is open: an active check on it alone would pass for a backend that
        fails every call, and end its ejection."""
        owner = await self.authorize(ANONYMOUS)  # whom internal calls (discovery) are made for
        capabilities = self.session_capabilities({})
        session = await self.pool.get(capabilities, owner)
        used = session.last_used
        pinged, exchange = await self.pool.request(capabilities, "ping", {}, owner=owner)
        try:
            # Any answer passes, an error one too (a server without `ping` answers -32601): as
            # for calls (health.py), what fails is no answer, a refusal or a timeout.
            await exchange.next(self.settings.health.check_timeout_seconds)
        finally:
            pinged.forget(exchange)
            if pinged is session:
                session.last_used = used  # a check is not a use: idle, it still closes (session_idle_seconds)

    # -- the one working method ---------------------------------------------------------

    async def send(self, call: Call) -> Reply:
        if call.is_notification:
            return Reply(self.name, status=202)
        method = call.method
        if method == "server/discover":
            session = await self.pool.get(self.session_capabilities({}), await self.authorize(call.principal, call.id))
            result = translate.discover_result(session.initialize_result or {}, ttl_ms=self.settings.default_ttl_ms,
                                               cache_scope=self.settings.default_cache_scope)
            return Reply(self.name, message=rpc.result_message(call.id, result))  # type: ignore[arg-type]
        if call.stream_only:
            return await self.listens.listen(call)
        if "requestState" in call.params:
            return await self._resume(call)
        return await self._call(call)

    @traced(None, translation="legacy-session")
    async def _call(self, call: Call) -> Reply:
        """A fresh backend request for this call, on a warm session."""
        method = call.method
        mrtr_capable = call.spec is not None and call.spec.mrtr
        capabilities = self.session_capabilities(call.client_capabilities if mrtr_capable else {})
        wants_logs = call.log_level is not None
        owner = await self.authorize(call.principal, call.id)
        if wants_logs:
            await self._ensure_log_level(await self.pool.get(capabilities, owner))
        try:
            session, exchange = await self.pool.request(
                capabilities, method, translate.legacy_params(call.params),
                progress=meta.PROGRESS_TOKEN in call.meta, wants_logs=wants_logs, owner=owner)
        except rpc.McpError as exc:
            self.last_error = exc.message
            raise exc.with_id(call.id)
        return await self._answer(call, session, exchange)

    async def _ensure_log_level(self, session: LegacySession) -> None:
        """Legacy log levels are per session (§h.8): ask once for everything and filter per
        request, so that one session serves requests with different levels."""
        if session.log_level_set or "logging" not in session.server_capabilities:
            return
        session.log_level_set = True
        try:
            exchange = await session.request("logging/setLevel", {"level": "debug"})
            await exchange.next(self.settings.timeout_seconds)
        except (rpc.McpError, Exception) as exc:  # logging is best effort, never the call's failure
            log.info("backend %s: logging/setLevel failed: %s", self.name, exc)

    # -- relaying one exchange ----------------------------------------------------------

    async def _answer(self, call: Call, session: LegacySession, exchange: Exchange) -> Reply:
        """Read until the answer's shape is known. A lone response becomes a plain JSON reply
        (the common case), and so does an answer that starts with backend requests: an
        InputRequiredResult, or -32021 with its HTTP 400 (SEP-2575), which a stream already
        begun with 200 could no longer carry. Anything else starts a stream."""
        pending: dict[str, Message] = {}
        # Each leg of a call (the first request, each MRTR retry) gets max_call_seconds, however
        # often the backend sends progress in between (SHTTP: senders SHOULD enforce a maximum).
        # time.monotonic(), not the loop's clock: the same clock, without a getpid() system call
        # per lookup of the loop on Python 3.11.
        deadline = time.monotonic() + self.settings.max_call_seconds
        try:
            message = await self._next(call, exchange, pending, deadline)
            assert message is not None  # nothing pending: no gathering window
            while "method" in message and "id" in message:
                refusal = await self._backend_request(call, session, exchange, message, pending)
                if refusal is not None:
                    return Reply(self.name, status=rpc.http_status_of(refusal), message=refusal)
                following = await self._next(call, exchange, pending, deadline)
                if following is None:
                    return Reply(self.name, message=await self._park(call, session, exchange, pending))
                message = following
        except asyncio.CancelledError:
            session.cancel_soon(exchange, "the client went away")
            raise
        except rpc.McpError as exc:
            session.cancel_soon(exchange, exc.message)
            raise _named(exc, self.name).with_id(call.id) from None
        if "method" not in message:
            final = self._final(message, call, session)
            return Reply(self.name, status=rpc.http_status_of(final), message=final)
        return Reply(self.name, stream=self._relay(call, session, exchange, message, pending, deadline))

    async def _next(self, call: Call, exchange: Exchange, pending: dict[str, Message],
                    deadline: float) -> Message | None:
        """The next message of the exchange; None when backend requests are pending and no
        more arrive within the gathering window. Legacy servers ask for several inputs at
        once (e.g. elicitation and sampling under asyncio.gather), which reach us one SSE
        event at a time: requests that arrive together become one InputRequiredResult.
        Past `deadline` (max_call_seconds) the call fails with -31002.

        A backend `notifications/cancelled` of one of its requests is consumed here, never
        relayed (§h.5): the exchange already took that request off its open requests
        (session.py `_withdrawn`), and `pending` drops it too, so the InputRequiredResult
        being gathered does not ask the client for it. With nothing left pending, the wait is
        an ordinary one again (the backend may now finish the call)."""
        overdue = functools.partial(self.overdue, call)
        while True:
            if pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise overdue()
                message = await exchange.next_within(min(_GATHER_SECONDS, remaining))
            else:
                message = await exchange.next_by(deadline, self.settings.timeout_seconds, overdue)
            if message is None or message.get("method") != "notifications/cancelled":
                return message
            exchange.prune(pending)

    async def _relay(self, call: Call, session: LegacySession, exchange: Exchange,
                     first: Message | None, pending: dict[str, Message], deadline: float
                     ) -> AsyncIterator[Message]:
        settled = False  # the call got its answer, or was parked for an MRTR retry
        try:
            message = first
            while True:
                if message is None:
                    try:
                        message = await self._next(call, exchange, pending, deadline)
                    except rpc.McpError as exc:
                        raise _named(exc, self.name).with_id(call.id) from None
                    if message is None:
                        settled = True
                        yield await self._park(call, session, exchange, pending)
                        return
                method = message.get("method")
                if method is None:
                    settled = True
                    yield self._final(message, call, session)
                    return
                if "id" in message:
                    refusal = await self._backend_request(call, session, exchange, message, pending)
                    if refusal is not None:
                        settled = True
                        yield refusal
                        return
                else:
                    relayed = self._notification(call, message)
                    if relayed is not None:
                        yield relayed
                message = None
        finally:
            if not settled:
                session.cancel_soon(exchange, "the client went away")

    def _final(self, message: Message, call: Call, session: LegacySession) -> Message:
        error = message.get("error")
        if isinstance(error, dict) and error.get("code") == translate.URL_ELICITATION_REQUIRED:
            return self._url_elicitation(call, error)
        return translate.result_for_client(message, call.id, call.method, backend=self.name,
                                           server_info=session.server_info,
                                           ttl_ms=self.settings.default_ttl_ms,
                                           cache_scope=self.settings.default_cache_scope)

    @staticmethod
    def _notification(call: Call, message: Message) -> Message | None:
        method = message["method"]
        params = message.get("params") or {}
        if method == "notifications/progress":
            token = call.meta.get(meta.PROGRESS_TOKEN)
            if token is None:
                return None
            return rpc.notification(method, {**params, "progressToken": token})
        if method == "notifications/message":
            # LOG: nothing for a request without a level; at or above it otherwise.
            level = call.log_level
            if level is None or not translate.log_level_passes(params.get("level"), level):
                return None
            return rpc.notification(method, params)
        # elicitation/complete and anything else legacy-only have no modern meaning on a
        # response stream (§h.5); notifications/cancelled never gets here (`_next`).
        return None

    async def _backend_request(self, call: Call, session: LegacySession, exchange: Exchange,
                               message: Message, pending: dict[str, Message]) -> Message | None:
        """A backend request on this call's stream: added to `pending` (to become an
        InputRequiredResult), refused upstream, or — when the client lacks the capability —
        the end of the call, whose error is returned."""
        method = message["method"]
        if method not in translate.INPUT_METHODS or call.spec is None or not call.spec.mrtr:
            # §h.5: only tools/call, prompts/get and resources/read can carry input requests.
            await _respond(session, message["id"], error=(
                rpc.METHOD_NOT_FOUND, f"{method} cannot reach the client during {call.method}"))
            return None
        missing = translate.missing_capability(message, call.client_capabilities)
        if missing is None:
            pending[f"r{message['id']}"] = message
            return None
        if method == "roots/list":
            # The session declared roots for every client (stdio: one session for all), not
            # because this client did: the gateway answers what it promised, with the
            # configured roots, as it does outside a request, instead of failing the call.
            await _respond(session, message["id"], result={"roots": list(session.standalone_roots)})
            return None
        # Never a hang: refuse it (and whatever else waits) upstream, stop the call, tell
        # the client what it lacks.
        for refused in (*pending.values(), message):
            await _respond(session, refused["id"], error=(
                rpc.MISSING_REQUIRED_CLIENT_CAPABILITY, f"the client did not declare {sorted(missing)[0]}"))
        session.cancel_soon(exchange, "the client lacks a required capability")
        err = rpc.missing_capability(missing, call.id)
        err.message = f"Missing required client capability: backend {self.name!r} sent {method}"
        return err.to_message()

    # -- MRTR ---------------------------------------------------------------------------

    @traced("mrtr park", translation="mrtr-minted")
    async def _park(self, call: Call, session: LegacySession, exchange: Exchange,
                    pending: dict[str, Message]) -> Message:
        """The InputRequiredResult that parks this call until the client's retry. Raises
        -31004 (after cancelling the backend call) when this replica already holds as many
        parked calls as it may (per principal or in total)."""
        principal = call.principal.key
        refusal = self.continuations.refusal(principal)
        if refusal is not None:
            # Cancelled before the error leaves. Its pending requests are left unanswered: the
            # cancellation makes them moot (L-CAN), and answering them as well raced with it
            # (mcp 1.30 then lost the whole session, failing the calls parked on it).
            await session.cancel(exchange, "the gateway holds too many calls waiting for input")
            raise refusal.with_id(call.id)
        expires = time.time() + self.settings.input_wait_seconds
        continuation = mrtr.Continuation(mrtr.new_continuation_id(), self.name, session, exchange, pending, expires,
                                         on_expire=self._expired, principal=principal)
        self.continuations.park(continuation)
        exchange.waiting_for_client = True
        state = self.sealer.seal({
            "c": continuation.id, "o": self.owner, "b": self.name, "p": principal,
            "d": mrtr.request_digest(call), "exp": expires, "k": sorted(pending),
        })
        result = {
            "resultType": "input_required",
            "inputRequests": {key: translate.input_request(m) for key, m in pending.items()},
            "requestState": state,
        }
        return rpc.result_message(call.id, result)  # type: ignore[arg-type]

    def _url_elicitation(self, call: Call, error: dict[str, Any]) -> Message:
        """Legacy -32042 URLElicitationRequiredError must not reach a modern client (BASIC):
        it becomes an InputRequiredResult with URL-mode elicitations when the client can
        take them; the retry re-sends the original request, which the backend now accepts
        (digest §h.5). Otherwise the client learns which capability it lacks."""
        requests = translate.url_elicitations(error)
        if call.spec is None or not call.spec.mrtr or not requests:
            return translate.result_for_client({"error": error}, call.id, call.method, backend=self.name,
                                               server_info=None, ttl_ms=0, cache_scope="private")
        missing = translate.missing_capability(next(iter(requests.values())), call.client_capabilities)
        if missing is not None:
            err = rpc.missing_capability(missing, call.id)
            err.message = (f"Missing required client capability: backend {self.name!r} requires a URL "
                           f"elicitation ({error.get('message') or 'URLElicitationRequiredError'})")
            return err.to_message()
        expires = time.time() + self.settings.input_wait_seconds
        # No continuation: nothing is parked, so any replica may serve the retry ("r").
        state = self.sealer.seal({
            "r": True, "b": self.name, "p": call.principal.key, "d": mrtr.request_digest(call),
            "exp": expires, "k": sorted(requests),
        })
        result = {"resultType": "input_required", "inputRequests": requests, "requestState": state}
        return rpc.result_message(call.id, result)  # type: ignore[arg-type]

    def _expired(self, continuation: mrtr.Continuation) -> None:
        session: LegacySession = continuation.session

        async def give_up() -> None:
            # §h.5: what the backend withdrew while the call was parked is not answered at all.
            continuation.exchange.prune(continuation.pending)
            for message in continuation.pending.values():
                if message["method"] == "elicitation/create":
                    await _respond(session, message["id"], result={"action": "cancel"})
                else:
                    await _respond(session, message["id"], error=(rpc.INTERNAL_ERROR, "the client did not answer"))
            await session.cancel(continuation.exchange, "the client did not retry in time")

        session.spawn(give_up())

    @traced("mrtr resume", translation="mrtr-resumed")
    async def _resume(self, call: Call) -> Reply:
        try:
            state = self.sealer.open(call.params.get("requestState"))
        except mrtr.StateError as exc:
            raise rpc.invalid_params(str(exc), call.id) from None
        if state.get("b") != self.name:
            raise rpc.invalid_params("requestState belongs to another backend", call.id)
        if state.get("r") is True:
            # After a URL elicitation (-32042): the retry is the original request again.
            self._check_binding(state, call)
            return await self._call(call)
        if state.get("o") != self.owner:
            if mrtr.FORWARDED_HEADER in call.headers:
                raise rpc.invalid_params("requestState refers to a call this replica does not hold", call.id)
            forwarded = await self.forwarder.forward(call, str(state.get("o")))
            if isinstance(forwarded, dict):
                return Reply(self.name, status=rpc.http_status_of(forwarded), message=forwarded)
            return Reply(self.name, stream=forwarded)
        self._check_binding(state, call)
        continuation = self.continuations.take(str(state.get("c")))
        if continuation is None:
            raise rpc.invalid_params("requestState refers to a call that expired or was already resumed", call.id)
        session: LegacySession = continuation.session
        continuation.exchange.waiting_for_client = False
        # §h.5: requests the backend withdrew (notifications/cancelled) while the call was
        # parked get no answer, even one the client sent, and a missing answer to one is not
        # asked for again.
        continuation.exchange.prune(continuation.pending)
        responses = call.params.get("inputResponses")
        responses = responses if isinstance(responses, dict) else {}
        unanswered: dict[str, Message] = {}
        for key, message in continuation.pending.items():
            answer = responses.get(key)
            if isinstance(answer, dict):
                await _respond(session, message["id"], result=answer)
            else:
                unanswered[key] = message
        if unanswered:
            # MRTR: missing responses SHOULD get a new InputRequiredResult, not an error.
            return Reply(self.name, message=await self._park(call, session, continuation.exchange, unanswered))
        return await self._answer(call, session, continuation.exchange)


    @staticmethod
    def _check_binding(state: dict[str, Any], call: Call) -> None:
        if state.get("p") != call.principal.key:
            raise rpc.invalid_params("requestState was issued to another principal", call.id)
        if state.get("d") != mrtr.request_digest(call):
            raise rpc.invalid_params("requestState was issued for a different request", call.id)


async def _respond(session: LegacySession, request_id: Any, *, result: Message | None = None,
                   error: tuple[int, str] | None = None) -> None:
    try:
        await session.respond(request_id, result=result, error=error)
    except Exception as exc:  # the call's own stream reports the consequence, if any
        log.info("backend %s: could not answer backend request %r: %s", session.backend, request_id, exc)


def _named(exc: rpc.McpError, backend: str) -> rpc.McpError:
    if exc.data is None and exc.code in (rpc.BACKEND_TIMEOUT, rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_PROTOCOL_ERROR):
        exc.data = {"backend": backend}
        if not exc.message.startswith("Backend"):
            exc.message = f"Backend {backend!r}: {exc.message}"
    return exc
