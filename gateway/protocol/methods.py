"""The modern request methods and what the gateway needs to know about each.

One table, so that routing, caching and validation agree on which methods exist, which
mirror a name into `Mcp-Name`, which may be retried, cached, or answered with MRTR.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    # The params field mirrored into `Mcp-Name` ("name" or "uri"), if any (digest §b.1).
    name_field: str | None = None
    # Server capability that must be advertised for the method to exist (digest §a.3 row
    # "gated behind an unadvertised server capability" → 404).
    capability: str | None = None
    # Result list key for aggregated list methods.
    list_key: str | None = None
    # Safe to retry before any byte reached the client.
    idempotent: bool = False
    # Results carry ttlMs/cacheScope (spec: server/utilities/caching).
    cacheable: bool = False
    # May answer with InputRequiredResult (spec: basic/patterns/mrtr).
    mrtr: bool = False


METHODS: dict[str, MethodSpec] = {
    m.name: m
    for m in (
        MethodSpec("server/discover", idempotent=True, cacheable=True),
        MethodSpec("tools/list", capability="tools", list_key="tools", idempotent=True, cacheable=True),
        MethodSpec("tools/call", name_field="name", capability="tools", mrtr=True),
        MethodSpec("prompts/list", capability="prompts", list_key="prompts", idempotent=True, cacheable=True),
        MethodSpec("prompts/get", name_field="name", capability="prompts", mrtr=True),
        MethodSpec("resources/list", capability="resources", list_key="resources", idempotent=True, cacheable=True),
        MethodSpec(
            "resources/templates/list",
            capability="resources",
            list_key="resourceTemplates",
            idempotent=True,
            cacheable=True,
        ),
        MethodSpec("resources/read", name_field="uri", capability="resources", idempotent=True, cacheable=True,
                   mrtr=True),
        MethodSpec("completion/complete", capability="completions"),
        MethodSpec("subscriptions/listen"),
    )
}

LIST_METHODS = frozenset(m.name for m in METHODS.values() if m.list_key)
