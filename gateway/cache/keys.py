"""Cache keys: what makes two requests "the same" for the response cache.

spec: server/utilities/caching §Cache Key — a cached response is identified by the method
together with the parameters that affect the result; a response MUST NOT be served for a
request whose method or parameters differ. The key therefore covers (digest §e):

- the backend and the method;
- every param, canonicalized, minus the `_meta` keys that never shape a result (progress
  token, trace context, clientInfo) — the protocol version and client capabilities stay in;
- the protocol version of the request;
- a fingerprint of the gateway's own configuration for that route, so a changed backend
  URL, upstream headers or cache rules never serve what the old configuration produced;
- for `private` entries, the principal (already a hash in `Principal.key`, never a token),
  hashed again together with everything above: two principals never share a private key,
  whatever cursor or URI they present.

The readable parts (`{<prefix>:cache:<backend>}:pub|prv:`) are there for operators and for
`cache flush --backend`. The braces are a Redis Cluster hash tag: every key of one backend
(entries, locks, tag sets, generations) shares a slot, so the multi-key lookups and scripts
of cache/redis.py work on Cluster; backends spread over the masters (docs/scale.md); uniqueness comes from the SHA-256 over a structured encoding, so no
choice of names or params can make two different requests collide short of a hash collision.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import meta

# `_meta` keys that do not change what a backend answers (digest §e, [GW]).
VOLATILE_META = frozenset({meta.PROGRESS_TOKEN, "traceparent", "tracestate", "baggage", meta.CLIENT_INFO})

_FORMAT = 1  # bump when the key layout or the stored value format changes


class Uncacheable(ValueError):
    """The request cannot be keyed (e.g. a number JSON can carry but the encoder refuses)."""


@dataclass(frozen=True, slots=True)
class RequestKeys:
    """The store keys one request may be answered from."""

    base: str  # identifies the request, principal excluded (in-process fetch coalescing)
    public: str
    private: str | None  # None when the caller has no principal: private results are not stored
    lock: str  # cross-replica fetch lock for this request


def canonical_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` without the volatile `_meta` keys (an empty `_meta` is dropped too)."""
    out = dict(params)
    m = out.get("_meta")
    if isinstance(m, dict):
        kept = {k: v for k, v in m.items() if k not in VOLATILE_META}
        if kept:
            out["_meta"] = kept
        else:
            del out["_meta"]
    return out


def _digest(value: Any) -> str:
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise Uncacheable(str(exc)) from None
    return hashlib.sha256(encoded).hexdigest()


def backend_slot(prefix: str, backend: str) -> str:
    """The hash-tagged start of every key of `backend` (one Redis Cluster slot)."""
    return "{" + f"{prefix}:cache:{backend}" + "}"


def request_keys(
    prefix: str,
    backend: str,
    method: str,
    params: Mapping[str, Any],
    version: str,
    route_fingerprint: str,
    principal: str | None,
) -> RequestKeys:
    base = _digest([_FORMAT, backend, method, version, route_fingerprint, canonical_params(params)])
    slot = backend_slot(prefix, backend)
    private = None
    if principal is not None:
        # Hash the principal with the request: the private key reveals neither.
        private = f"{slot}:prv:{_digest([base, principal])}"
    return RequestKeys(
        base=base,
        public=f"{slot}:pub:{base}",
        private=private,
        lock=f"{slot}:lock:{base}",
    )


def route_fingerprint(*parts: Any) -> str:
    """A short digest of the gateway configuration that shapes one route's results."""
    return _digest([_FORMAT, *parts])[:16]


# Invalidation tags: every stored entry is indexed under these, so that a notification can
# drop exactly the entries it makes stale (digest §e, Notifications).


def list_tag(backend: str, method: str) -> str:
    return f"list:{backend}:{method}"


def read_tag(backend: str, uri: str) -> str:
    # The URI is hashed: tags become Redis key names, and a URI may hold any character.
    return f"read:{backend}:{hashlib.sha256(uri.encode()).hexdigest()[:32]}"


def backend_tag(backend: str) -> str:
    return f"backend:{backend}"


def backend_of_tag(tag: str) -> str:
    """The backend a tag belongs to (every tag above is `<kind>:<backend>[:...]`); any other
    tag is a group of its own."""
    parts = tag.split(":", 2)
    return parts[1] if len(parts) > 1 else tag


def tags_for(backend: str, method: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    tags = [backend_tag(backend)]
    if method == "resources/read":
        uri = params.get("uri")
        if isinstance(uri, str):
            tags.append(read_tag(backend, uri))
    else:
        tags.append(list_tag(backend, method))
    return tuple(tags)
