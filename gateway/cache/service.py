"""`StoreCache`: the `ResponseCache` the dispatcher uses, over any `Store`.

One lookup reads the public key and this principal's private key together. A fresh entry
answers (`hit`) with the freshness it has left. Otherwise the backend is asked, once per key
however many callers miss together (in-process coalescing, plus a short Redis lock across
replicas), and the answer is stored when the policy allows (`miss`). A backend failure with
an entry still inside the stale-if-error window answers from it (`stale`). A store that fails
is stepped around (`bypass`): the request never fails because of the cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.cache import Loader, Outcome
from gateway.cache.assembled import AssembledAnswers, Source
from gateway.cache.entry import Entry, Store, StoreUnavailable, now_ms
from gateway.cache.keys import (
    RequestKeys,
    Uncacheable,
    backend_tag,
    list_tag,
    read_tag,
    request_keys,
    route_fingerprint,
    tags_for,
)
from gateway.cache.policy import CachePolicy, Decision, with_hints
from gateway.cache.singleflight import SingleFlight
from gateway.observability import metrics, tracing
from gateway.observability.record import note_cache
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.methods import LIST_METHODS
from gateway.settings import CacheSettings

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from gateway.backends.base import Message
    from gateway.protocol.request import Call
    from gateway.routing.table import Target

log = logging.getLogger("gateway.cache")

# How often a replica waiting on another replica's fetch looks for the entry.
_POLL_FIRST, _POLL_MAX = 0.01, 0.1


@dataclass(frozen=True, slots=True)
class _Filled:
    """What one fetch produced, shareable with the callers that waited for it."""

    message: Message  # a JSON-RPC response, or a stored entry's body ({"result"} / {"error"})
    decision: Decision | None  # None: not cacheable (input_required, an error not remembered)
    principal: str | None
    outcome: Outcome  # "miss", or "hit" when another replica fetched it


def cacheable(call: Call) -> bool:
    spec = call.spec
    if spec is None or not spec.cacheable:
        return False
    # spec: caching §Cache Key — results of MRTR retries depend on inputs outside the key.
    return "inputResponses" not in call.params and "requestState" not in call.params


class StoreCache:
    def __init__(self, store: Store, settings: CacheSettings, *, clock: Callable[[], int] = now_ms) -> None:
        self.store = store
        self.settings = settings
        self.policy = CachePolicy(settings)
        self.clock = clock
        self._flights: SingleFlight[_Filled] = SingleFlight()
        self._fingerprints: dict[tuple[int, str, str], tuple[Any, str]] = {}
        self.assembled = AssembledAnswers(store, clock)

    # -- lookups ----------------------------------------------------------------------------

    async def fetch(self, target: Target, call: Call, load: Loader, sources: list[Source] | None = None
                    ) -> tuple[Message, Outcome]:
        if not cacheable(call):
            return await load(), self._count(call, "none", "bypass")
        backend = target.backend.name
        try:
            keys = request_keys(
                self.settings.key_prefix,
                backend,
                call.method,
                call.params,
                call.version,
                self._fingerprint(target, call.method),
                call.principal.cache_key,
            )
        except Uncacheable:
            return await self._without_store(backend, call, load)
        candidates = (keys.private, keys.public) if keys.private else (keys.public,)
        try:
            if tracing.enabled():
                # A child span of the request for the store's round trip (Redis: a network call).
                with tracing.internal_span("cache lookup", **{"mcp.gateway.cache.store": type(self.store).__name__}):
                    entries = await self.store.get(candidates)
            else:
                entries = await self.store.get(candidates)
        except StoreUnavailable:
            return await self._without_store(backend, call, load)
        now = self.clock()
        fresh = next((e for e in entries if e is not None and e.fresh(now)), None)
        if fresh is not None:
            if sources is not None:
                sources.append((candidates, fresh))
            return _from_entry(fresh, call.id, now), self._count(call, fresh.scope, "hit")
        stale = next((e for e in entries if e is not None and self._usable_stale(e, now)), None)

        tags = tags_for(backend, call.method, call.params)
        # A request made after an invalidation of its tags never joins a fetch that started
        # before it (that fetch may hold the old answer): the generation is part of the key.
        flight = f"{keys.base}:{self.store.generation(tags)}"
        try:
            filled, shared = await self._flights.run(
                flight,
                lambda: self._fill(target, call, keys, tags, load),
                lambda exc: _own_error(exc, call.id),
            )
            if shared and not _shareable(filled, call.principal.cache_key):
                # The answer that was fetched belongs to another principal: fetch our own.
                filled, shared = await self._fill(target, call, keys, tags, load), False
        except rpc.McpError:
            if stale is not None and self._usable_stale(stale, self.clock()):
                log.debug("%s from %s: backend failed; serving a stale entry", call.method, backend)
                return _from_entry(stale, call.id, self.clock()), self._count(call, stale.scope, "stale")
            raise
        if stale is not None and _failed(filled.message) and self._usable_stale(stale, self.clock()):
            log.debug("%s from %s: backend answered an error; serving a stale entry", call.method, backend)
            return _from_entry(stale, call.id, self.clock()), self._count(call, stale.scope, "stale")
        outcome: Outcome = "hit" if shared else filled.outcome
        decision = filled.decision
        if decision is None:
            return {**filled.message, "id": call.id}, self._count(call, "none", outcome)
        if decision.negative:
            return {"jsonrpc": "2.0", "id": call.id, "error": filled.message.get("error")}, self._count(
                call, decision.scope, outcome
            )
        return with_hints(filled.message, call.id, decision.ttl_ms, decision.scope), self._count(
            call, decision.scope, outcome
        )

    def assembled_again(self, call: Call, targets: Sequence[Target], revision: int, endpoint: Hashable = ""
                        ) -> tuple[Message, bytes] | None:
        """`endpoint`: the view whose answer this is ("" for the main path), so that views over
        other backends do not take each other's place."""
        if not cacheable(call):
            return None
        return self.assembled.again(call, call.principal.cache_key, targets, revision, endpoint)

    def keep_assembled(self, call: Call, targets: Sequence[Target], revision: int, sources: Sequence[Source],
                       result: dict[str, Any], endpoint: Hashable = "") -> None:
        if cacheable(call):
            self.assembled.keep(call, call.principal.cache_key, targets, revision, sources, result, endpoint)

    def _usable_stale(self, entry: Entry, now: int) -> bool:
        window = self.settings.stale_if_error_ms
        return window > 0 and "result" in entry.body and now < entry.stored_at_ms + entry.ttl_ms + window

    async def _without_store(self, backend: str, call: Call, load: Loader) -> tuple[Message, Outcome]:
        """The store cannot be used: ask the backend, still say what freshness applies."""
        message = await load()
        decision = self.policy.decide(backend, call.method, message)
        if decision is None or decision.negative:
            return message, self._count(call, "none", "bypass")
        return with_hints(message, call.id, decision.ttl_ms, decision.scope), self._count(
            call, decision.scope, "bypass"
        )

    async def _fill(
        self, target: Target, call: Call, keys: RequestKeys, tags: tuple[str, ...], load: Loader
    ) -> _Filled:
        backend = target.backend.name
        principal = call.principal.cache_key
        # Read before the backend is asked: an invalidation after this point makes the answer
        # unfit to store (it may predate the change the notification announced).
        try:
            since = await self.store.mark(tags)
        except StoreUnavailable:
            since = None  # the store is down: the put below fails (and is stepped around) too
        token: str | None = None
        if self.store.shared:
            try:
                token = await self.store.lock(keys.lock, self.settings.lock_timeout_ms)
                if token is None:
                    entry = await self._await_other_replica(keys)
                    if entry is not None:
                        return _filled_from_entry(entry, principal, self.clock())
            except StoreUnavailable:
                token = None
        try:
            message = await load()
            decision = self.policy.decide(backend, call.method, message)
            if decision is not None and decision.store and since is not None:
                await self._store(keys, tags, message, decision, since)
            return _Filled(message, decision, principal, "miss")
        finally:
            if token is not None:
                try:
                    await self.store.unlock(keys.lock, token)
                except StoreUnavailable:
                    pass  # it expires on its own after lock_timeout_ms

    async def _await_other_replica(self, keys: RequestKeys) -> Entry | None:
        """Another replica holds the fetch lock: wait for its entry, at most the lock's life.
        None when the lock went away without an entry this caller may use (a private answer
        for someone else, an uncacheable answer, a failure): the caller then fetches."""
        candidates = [keys.private, keys.public] if keys.private else [keys.public]
        deadline = time.monotonic() + self.settings.lock_timeout_ms / 1000
        delay = _POLL_FIRST
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
            entries = await self.store.get(candidates)
            now = self.clock()
            fresh = next((e for e in entries if e is not None and e.fresh(now)), None)
            if fresh is not None:
                return fresh
            if not await self.store.locked(keys.lock):
                entries = await self.store.get(candidates)
                return next((e for e in entries if e is not None and e.fresh(self.clock())), None)
        return None

    async def _store(
        self, keys: RequestKeys, tags: tuple[str, ...], message: Message, decision: Decision, since: Any
    ) -> None:
        if decision.scope == "private":
            if keys.private is None:
                return  # no principal to key it by: a private answer is never shared
            key = keys.private
        else:
            key = keys.public
        if decision.negative:
            body: dict[str, Any] = {"error": message.get("error")}
        else:
            body = {"result": message.get("result")}
        entry = Entry(body, self.clock(), decision.ttl_ms, decision.scope, tags)
        encoded = entry.encode()
        if len(encoded) > self.settings.max_entry_bytes:
            return
        keep_ms = decision.ttl_ms + (0 if decision.negative else self.settings.stale_if_error_ms)
        try:
            if not await self.store.put(key, entry, encoded, tags, keep_ms, since):
                log.debug("%s: not stored, invalidated while it was fetched", key)
        except StoreUnavailable:
            pass  # counted and logged by the store; the answer is served all the same

    def _fingerprint(self, target: Target, method: str) -> str:
        """Digest of the configuration that shapes this route's results (keys.py)."""
        settings = target.backend.settings
        memo = (id(settings), target.prefix, method)
        found = self._fingerprints.get(memo)
        # The settings object is held beside its digest: after a reload an `id` can be reused
        # by other settings, and must not find the digest of the ones it replaced.
        if found is None or found[0] is not settings:
            freshness = dataclasses.asdict(self.policy.freshness(target.backend.name, method))
            found = (settings, route_fingerprint(
                settings.model_dump(mode="json"), target.prefix, freshness, self.settings.negative_ttl_ms
            ))
            self._fingerprints[memo] = found
        return found[1]

    @staticmethod
    def _count(call: Call, scope: str, outcome: Outcome) -> Outcome:
        metrics.cache_lookups_child(call.method, scope, outcome).inc()
        note_cache(outcome, scope)
        return outcome

    # -- invalidation (called by the subscription hub and the operator CLI) ------------------

    async def invalidate_lists(self, backend: str, methods: tuple[str, ...] | None = None) -> None:
        """`notifications/*/list_changed`: every page of those lists (all lists when None)."""
        chosen = methods if methods is not None else tuple(sorted(LIST_METHODS))
        await self._drop("lists", [list_tag(backend, m) for m in chosen])

    async def invalidate_resource(self, backend: str, uri: str) -> None:
        """`notifications/resources/updated`: every principal's read of that URI."""
        await self._drop("resource", [read_tag(backend, uri)])

    async def invalidate_backend(self, backend: str) -> None:
        """Everything from one backend (its notification channel was lost, say)."""
        await self._drop("backend", [backend_tag(backend)])

    async def _drop(self, kind: str, tags: list[str]) -> None:
        metrics.CACHE_INVALIDATIONS.labels(kind).inc()
        try:
            await self.store.drop(tags)
        except StoreUnavailable:
            log.warning(
                "cache invalidation (%s) not applied to the shared store: it is unavailable; "
                "those entries expire with their TTL",
                kind,
            )

    async def flush(self, backend: str | None = None) -> int:
        metrics.CACHE_INVALIDATIONS.labels("flush").inc()
        return await self.store.flush(backend)

    async def start(self) -> None:
        await self.store.start()

    async def aclose(self) -> None:
        await self.store.aclose()


# Error answers that mean "the backend failed", not "the request was wrong".
_FAILURE_CODES = frozenset(
    {rpc.INTERNAL_ERROR, rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT, rpc.BACKEND_PROTOCOL_ERROR}
)


def _failed(message: Message) -> bool:
    error = message.get("error")
    return isinstance(error, dict) and error.get("code") in _FAILURE_CODES


def _own_error(exc: BaseException, request_id: Any) -> BaseException:
    """The leader's failure as a waiting caller's own: a JSON-RPC error must carry the id of
    the request it answers (basic/index §Responses), not the id of the request that fetched."""
    if not isinstance(exc, rpc.McpError):
        return exc
    return rpc.McpError(
        exc.code, exc.message, status=exc.status, data=exc.data, request_id=request_id,
        headers=dict(exc.headers),
    )


def _shareable(filled: _Filled, principal: str | None) -> bool:
    decision = filled.decision
    if decision is None:
        return False  # input_required or an error: never handed to another request
    return decision.scope == "public" or (principal is not None and filled.principal == principal)


def _from_entry(entry: Entry, request_id: Any, now: int) -> Message:
    if "result" in entry.body:
        return with_hints(entry.body, request_id, max(0, entry.remaining_ms(now)), entry.scope)
    return {"jsonrpc": "2.0", "id": request_id, "error": entry.body.get("error")}


def _filled_from_entry(entry: Entry, principal: str | None, now: int) -> _Filled:
    negative = "result" not in entry.body
    decision = Decision(
        store=False, ttl_ms=max(0, entry.remaining_ms(now)), scope=entry.scope, negative=negative
    )
    return _Filled(entry.body, decision, principal, "hit")
