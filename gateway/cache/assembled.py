"""Aggregated list answers, kept encoded while every entry they were made from still holds.

A cached `tools/list` over the fleet is the same answer request after request: the same
entries, merged the same way, encoded to the same bytes. Only the request id and the `ttlMs`
left change. Assembling it again each time (a key digest and a store lookup per backend, a
copy of every page, the merge, one encoding of the whole list) was most of a cache hit's cost
(bench/README.md "Profile"). So the first answer assembled entirely from fresh entries is
kept here, encoded without its `ttlMs`, and the next identical request gets it back with its
own id and the freshness left — provided nothing it was made from has changed:

- each backend's lookup would still return the very same entry object, still fresh (one sync
  `Store.peek` per backend: an invalidation, an eviction, a newer or a private entry for this
  principal all make it another object or none);
- the request goes to the same targets (the capability view of the fleet can change);
- the route table learned nothing since (`RouteTable.revision`): what the merge filtered and
  renamed, and what it taught the table, would be the same.

A store that cannot answer synchronously (Redis without its local layer) never reuses; the
full path runs and nothing is lost but time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.cache.entry import Entry, Store
from gateway.cache.keys import canonical_params
from gateway.observability import metrics
from gateway.observability.record import note_cache

if TYPE_CHECKING:
    from gateway.backends.base import Message
    from gateway.protocol.request import Call
    from gateway.routing.table import Target

# One backend's part of an answer: the keys its lookup reads, in order, and the entry it used.
Source = tuple[tuple[str, ...], Entry]

# Bounds: distinct list requests (method × params × version × principal) kept, and their bytes.
MAX_ANSWERS = 1024
MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Answer:
    targets: tuple[Target, ...]
    revision: int
    sources: tuple[Source, ...]
    result: dict[str, Any]  # without ttlMs; shared with every answer handed out, never mutated
    encoded: bytes  # `result` encoded, from just after its opening brace


class AssembledAnswers:
    def __init__(self, store: Store, clock: Callable[[], int]) -> None:
        self.store = store
        self.clock = clock
        self._answers: dict[tuple[Any, ...], _Answer] = {}
        self._bytes = 0
        self.reused = 0  # answers handed out again (tests and operators can tell it works)

    def again(self, call: Call, principal: str | None, targets: Sequence[Target], revision: int,
              endpoint: Hashable = "") -> tuple[Message, bytes] | None:
        """The kept answer to `call` as (message, body), or None when it must be assembled."""
        key = _key(call, principal, endpoint)
        answer = self._answers.get(key) if key is not None else None
        if answer is None or answer.revision != revision or answer.targets != tuple(targets):
            return None
        ttl: int | None = None
        now = self.clock()
        for keys, entry in answer.sources:
            entries = self.store.peek(keys)
            if entries is None:
                return None
            current = next((e for e in entries if e is not None and e.fresh(now)), None)
            if current is not entry:
                return None
            left = entry.remaining_ms(now)
            ttl = left if ttl is None else min(ttl, left)
        assert ttl is not None
        for _, entry in answer.sources:
            metrics.cache_lookups_child(call.method, entry.scope, "hit").inc()
        note_cache("hit", answer.sources[0][1].scope if answer.sources else None)
        self.reused += 1
        ttl_bytes = str(ttl).encode()
        body = b"".join((b'{"jsonrpc":"2.0","id":', orjson.dumps(call.id), b',"result":{"ttlMs":', ttl_bytes, b",",
                         answer.encoded, b"}"))
        return {"jsonrpc": "2.0", "id": call.id, "result": {**answer.result, "ttlMs": ttl}}, body

    def keep(self, call: Call, principal: str | None, targets: Sequence[Target], revision: int,
             sources: Sequence[Source], result: dict[str, Any], endpoint: Hashable = "") -> None:
        """Keep `result`, assembled from exactly `sources` (every one a fresh entry)."""
        if not sources or self.store.peek(sources[0][0]) is None:
            return
        key = _key(call, principal, endpoint)
        if key is None:
            return
        rest = {k: v for k, v in result.items() if k != "ttlMs"}
        if not rest:
            return  # (never: a list answer has its items) the splice below needs one key
        try:
            encoded = orjson.dumps(rest)[1:]
        except (TypeError, orjson.JSONEncodeError):
            return
        if len(encoded) > MAX_BYTES // 4:
            return
        old = self._answers.pop(key, None)
        if old is not None:
            self._bytes -= len(old.encoded)
        # Oldest kept first out: a hot answer is kept again as soon as it is assembled again.
        while self._answers and (len(self._answers) >= MAX_ANSWERS or self._bytes + len(encoded) > MAX_BYTES):
            oldest = self._answers.pop(next(iter(self._answers)))
            self._bytes -= len(oldest.encoded)
        self._answers[key] = _Answer(tuple(targets), revision, tuple(sources), rest, encoded)
        self._bytes += len(encoded)


def _key(call: Call, principal: str | None, endpoint: Hashable = "") -> tuple[Any, ...] | None:
    try:
        params = orjson.dumps(canonical_params(call.params))
    except (TypeError, orjson.JSONEncodeError):
        return None
    return call.method, call.version, principal, params, endpoint
