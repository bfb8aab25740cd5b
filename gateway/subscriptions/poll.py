"""Listen by polling, for backends that cannot listen (docs/subscriptions.md "Backends without
listen").

A backend that refuses `subscriptions/listen` (HTTP 404, -32601, any error answer), or whose
ack honours less than it was asked (fastmcp 4.x acknowledges nothing), still changes its lists
and resources. For what it does not deliver, the holder of the stream (`upstream.py`, under the
same lease as a real upstream listen, so a backend sees one poller however many clients and
replicas listen) reads the lists (`tools/list`, `prompts/list`, `resources/list` and
`resources/templates/list`, every page) and the subscribed `resources/read`s, keeps a digest
of each, and when one changes publishes the notification the backend would have sent
(`notifications/tools/list_changed`, …, `notifications/resources/updated {uri}`) through the
same bus events, so clients, replicas and the cache cannot tell it from a real one (the hub
invalidates the cached pages as for any notification).

When: each watched thing on its own clock, every `ttlMs` of its last answer (the backend's own
word for how long it stays fresh; CACHE), bounded by `subscriptions.poll_min_seconds` and
`poll_max_seconds`, with ±10 % jitter, and backed off exponentially (to the maximum) while
polls fail — CACHE: "TTL SHOULD NOT drive background polling. Anyone who does poll MUST apply
jitter and backoff." The first answer of each is its baseline: changes before it are not
reported (as a real listen reports nothing from before its ack). A poll that fails leaves the
digest as it was, so a change made while the backend was unreachable is reported by the first
poll that succeeds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.backends.base import Backend, internal_call
from gateway.protocol import jsonrpc as rpc
from gateway.subscriptions import metrics
from gateway.subscriptions.filters import LIST_FLAGS, RESOURCE_UPDATED, SubscriptionFilter, deliverable

log = logging.getLogger("gateway.subscriptions.poll")

Message = dict[str, Any]
Publish = Callable[[Message], Awaitable[None]]

# Each list-changed flag: the capability that makes the lists exist, and the lists to read.
_LISTS_OF_FLAG: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "toolsListChanged": ("tools", (("tools/list", "tools"),)),
    "promptsListChanged": ("prompts", (("prompts/list", "prompts"),)),
    "resourcesListChanged": ("resources", (("resources/list", "resources"),
                                           ("resources/templates/list", "resourceTemplates"))),
}
# A backend that pages forever is not followed forever (as the dispatcher's index refreshes).
_MAX_PAGES = 100
_JITTER = 0.1


@dataclass(frozen=True, slots=True)
class PollSettings:
    enabled: bool = True
    min_seconds: float = 5.0
    max_seconds: float = 300.0


def pollable(capabilities: Mapping[str, Any] | None) -> tuple[frozenset[str], bool]:
    """What polling can watch on a backend: a list-changed flag for every list capability it
    advertises (`listChanged` or not), and resources/read when it has resources at all."""
    if not capabilities:
        return frozenset(), False
    flags = frozenset(flag for flag, (capability, _) in _LISTS_OF_FLAG.items()
                      if isinstance(capabilities.get(capability), Mapping))
    return flags, isinstance(capabilities.get("resources"), Mapping)


def native_part(capabilities: Mapping[str, Any] | None, wanted: SubscriptionFilter) -> SubscriptionFilter:
    """The part of `wanted` worth asking the backend's own listen for: what its capabilities
    say it delivers (`listChanged`, `resources.subscribe`). The rest can only be polled."""
    flags, subscribe = deliverable(capabilities)
    return SubscriptionFilter(wanted.lists & flags, wanted.uris if subscribe else frozenset())


def minus(a: SubscriptionFilter, b: SubscriptionFilter) -> SubscriptionFilter:
    return SubscriptionFilter(a.lists - b.lists, a.uris - b.uris)


def refuses_listen(exc: rpc.McpError) -> bool:
    """A gateway-made error that means "this backend has no listen" (its endpoint answered the
    listen with 404 or 405 and no JSON-RPC body), not "it is down"."""
    data = exc.data if isinstance(exc.data, dict) else {}
    return exc.code == rpc.BACKEND_UNAVAILABLE and data.get("status") in (404, 405)


class _Watched:
    """One thing polled: a list (all its pages) or one resource."""

    __slots__ = ("what", "method", "key", "uri", "notification", "digest", "due", "failures")

    def __init__(self, what: str, method: str, key: str, notification: Message, uri: str | None = None) -> None:
        self.what = what  # for logs: "tools/list", "resources/read file:///a"
        self.method = method
        self.key = key  # the result's list key; "contents" for a read
        self.uri = uri
        self.notification = notification
        self.digest: bytes | None = None
        self.due = 0.0
        self.failures = 0


class Poller:
    """Polls `watch` on `backend`, publishing a notification when a digest changes."""

    def __init__(self, backend: Backend, watch: SubscriptionFilter, settings: PollSettings,
                 publish: Publish) -> None:
        self.backend = backend
        self.settings = settings
        self._publish = publish
        self.parts: list[_Watched] = []
        for flag in sorted(watch.lists):
            _, lists = _LISTS_OF_FLAG[flag]
            notification = rpc.notification(LIST_FLAGS[flag], {})
            self.parts += [_Watched(method, method, key, notification) for method, key in lists]
        for uri in sorted(watch.uris):
            self.parts.append(_Watched(f"resources/read {uri}", "resources/read", "contents",
                                       rpc.notification(RESOURCE_UPDATED, {"uri": uri}), uri))

    async def baseline(self) -> None:
        """Read everything once, reporting nothing: what later polls compare with."""
        await asyncio.gather(*(self._poll(part) for part in self.parts))

    async def run(self) -> None:
        """Poll each part when it is due, forever (the stream's holder cancels it)."""
        while self.parts:
            now = time.monotonic()
            due = [part for part in self.parts if part.due <= now]
            if not due:
                await asyncio.sleep(min(part.due for part in self.parts) - now)
                continue
            changed = await asyncio.gather(*(self._poll(part) for part in due))
            # resources/list and resources/templates/list share one notification: sent once.
            sent: set[str] = set()
            for part, did_change in zip(due, changed, strict=True):
                key = orjson.dumps(part.notification).decode()
                if did_change and key not in sent:
                    sent.add(key)
                    log.info("backend %s: %s changed (polled); publishing %s", self.backend.name, part.what,
                             part.notification["method"])
                    await self._publish(part.notification)

    async def _poll(self, part: _Watched) -> bool:
        """Read `part` once and schedule its next poll; whether it changed since the last
        known answer (never on its first, nor on a failure)."""
        try:
            async with asyncio.timeout(self.backend.settings.list_timeout_seconds):
                digest, ttl_ms, answered = await self._read(part)
        except (rpc.McpError, TimeoutError) as exc:
            part.failures += 1
            metrics.POLLS.labels(self.backend.name, "failed").inc()
            part.due = time.monotonic() + self._backoff(part)
            log.info("backend %s: polling %s failed (%s); next try in %.1fs", self.backend.name, part.what,
                     getattr(exc, "message", None) or "no answer in time", part.due - time.monotonic())
            return False
        if digest is None:  # the backend has no such method: nothing to watch
            log.info("backend %s: %s is not implemented; not polled", self.backend.name, part.what)
            self.parts.remove(part)
            return False
        metrics.POLLS.labels(self.backend.name, "ok").inc()
        previous, part.digest = part.digest, digest
        if answered:
            part.failures = 0
            part.due = time.monotonic() + self._interval(ttl_ms)
        else:  # a JSON-RPC error answer (a resource gone, say): kept as the digest, backed off
            part.failures += 1
            part.due = time.monotonic() + self._backoff(part)
        return previous is not None and previous != digest

    async def _read(self, part: _Watched) -> tuple[bytes | None, float | None, bool]:
        """(digest, smallest ttlMs seen, whether it was a result). Digest None: -32601."""
        items: list[Any] = []
        ttl_ms: float | None = None
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params: dict[str, Any] = {"uri": part.uri} if part.uri is not None else {}
            if cursor is not None:
                params["cursor"] = cursor
            reply = await self.backend.send(internal_call(part.method, params, request_id="mcp-gateway-poll"))
            message = await reply.final()
            result = message.get("result")
            if not isinstance(result, dict):
                error = message.get("error")
                code = error.get("code") if isinstance(error, dict) else None
                if code == rpc.METHOD_NOT_FOUND:
                    return None, None, False
                # The error's code only: its message may carry a timestamp or a request id.
                return hashlib.blake2b(orjson.dumps(["error", code]), digest_size=16).digest(), None, False
            ttl = result.get("ttlMs")
            if isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
                ttl_ms = max(0.0, ttl) if ttl_ms is None else min(ttl_ms, max(0.0, ttl))
            page = result.get(part.key)
            items.extend(page if isinstance(page, list) else [page])
            cursor = result.get("nextCursor")
            if part.uri is not None or not isinstance(cursor, str):
                break
        # What the list or resource holds, not the answer's envelope (`ttlMs`, `_meta`, cursors).
        return hashlib.blake2b(orjson.dumps(items, option=orjson.OPT_SORT_KEYS), digest_size=16).digest(), \
            ttl_ms, True

    def _interval(self, ttl_ms: float | None) -> float:
        s = self.settings
        base = min(s.max_seconds, max(s.min_seconds, (ttl_ms or 0) / 1000))
        return base * random.uniform(1 - _JITTER, 1 + _JITTER)

    def _backoff(self, part: _Watched) -> float:
        s = self.settings
        return min(s.max_seconds, s.min_seconds * 2 ** min(part.failures, 30)) * random.uniform(1 - _JITTER,
                                                                                                1 + _JITTER)
