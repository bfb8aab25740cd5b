"""Freshness and scope rules: what is stored, for how long, and for whom.

spec: server/utilities/caching. Only `resultType: "complete"` results carry hints and may be
stored; `ttlMs` is a max-age (0 or negative: immediately stale; absent: 0 — only old servers
omit it); `cacheScope: "private"` results are reused only within one authorization context.

The gateway's own rules sit on top (docs/cache.md):
- a backend that says `ttlMs: 0` is never stored, whatever the configured minimum;
- otherwise the TTL is clamped to [min_ttl_ms, max_ttl_ms] of the most specific rule;
- a backend that sends no `ttlMs` gets the configured default (0 unless configured);
- anything but an explicit `"public"` is treated as private (a remembered error too), and a
  rule may force private.
What the client is told (`ttlMs`, `cacheScope`) is what the gateway applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.protocol import jsonrpc as rpc
from gateway.settings import CacheRule, CacheSettings

Scope = Literal["public", "private"]


@dataclass(frozen=True, slots=True)
class Freshness:
    """The rule that applies to one (backend, method), every field resolved."""

    enabled: bool
    default_ttl_ms: int
    min_ttl_ms: int
    max_ttl_ms: int
    force_private: bool


@dataclass(frozen=True, slots=True)
class Decision:
    store: bool
    ttl_ms: int  # the freshness the gateway applies (and tells the client on a miss)
    scope: Scope
    negative: bool = False  # a remembered error, not a result


def _specificity(rule: CacheRule) -> int:
    return (rule.backend is not None) * 2 + (rule.method is not None)


class CachePolicy:
    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        # Least specific first, so that more specific rules override field by field; among
        # rules of equal specificity the later one wins.
        self._rules = sorted(settings.rules, key=_specificity)
        self._resolved: dict[tuple[str, str], Freshness] = {}

    def freshness(self, backend: str, method: str) -> Freshness:
        key = (backend, method)
        found = self._resolved.get(key)
        if found is not None:
            return found
        s = self.settings
        fields: dict[str, Any] = {
            "enabled": True,
            "default_ttl_ms": s.default_ttl_ms,
            "min_ttl_ms": s.min_ttl_ms,
            "max_ttl_ms": s.max_ttl_ms,
            "force_private": False,
        }
        for rule in self._rules:
            if rule.backend not in (None, backend) or rule.method not in (None, method):
                continue
            for name in fields:
                value = getattr(rule, name)
                if value is not None:
                    fields[name] = value
        found = Freshness(**fields)
        self._resolved[key] = found
        return found

    def decide(self, backend: str, method: str, message: dict[str, Any]) -> Decision | None:
        """How to treat a backend's final answer; None when it carries no caching hints at all
        (an input_required result, or an error that is not remembered)."""
        rule = self.freshness(backend, method)
        result = message.get("result")
        if isinstance(result, dict):
            if result.get("resultType", "complete") != "complete":
                return None  # spec: interim results are not cacheable and carry no hints
            scope: Scope = (
                "public" if result.get("cacheScope") == "public" and not rule.force_private else "private"
            )
            sent = result.get("ttlMs")
            if isinstance(sent, (int, float)) and not isinstance(sent, bool):
                if sent <= 0:
                    # spec: 0 (and negative, read as 0) means immediately stale: never stored.
                    return Decision(store=False, ttl_ms=0, scope=scope)
                ttl = int(sent)
            else:
                ttl = rule.default_ttl_ms
                if ttl <= 0:
                    return Decision(store=False, ttl_ms=0, scope=scope)
            ttl = min(max(ttl, rule.min_ttl_ms), rule.max_ttl_ms)
            return Decision(store=rule.enabled and ttl > 0, ttl_ms=ttl, scope=scope)
        error = message.get("error")
        if (
            isinstance(error, dict)
            and error.get("code") == rpc.METHOD_NOT_FOUND
            and self.settings.negative_ttl_ms > 0
            and rule.enabled
        ):
            # An error carries no cacheScope, and anything but an explicit "public" is private
            # (spec: caching §cacheScope): the backend answered this caller, and may answer
            # another one otherwise (its message can name the caller). So a remembered
            # "method not found" is reused for the same principal only, and never stored
            # without an authenticated one (`Principal.cache_key`).
            return Decision(
                store=True,
                ttl_ms=self.settings.negative_ttl_ms,
                scope="private",
                negative=True,
            )
        return None


def with_hints(message: dict[str, Any], request_id: Any, ttl_ms: int, scope: Scope) -> dict[str, Any]:
    """A copy of a complete result message addressed to `request_id`, carrying the freshness
    that is left and the scope applied. Nested values are shared: cached messages are never
    mutated by anyone."""
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    result = message.get("result")
    if isinstance(result, dict):
        out["result"] = {**result, "ttlMs": max(0, int(ttl_ms)), "cacheScope": scope}
    else:
        out["error"] = message.get("error")
    return out
