"""The modern request methods and what the gateway needs to know about each.

One table, so that routing, caching, validation, the endpoint and the backends agree on which
methods exist, which mirror a name into `Mcp-Name`, which may be retried, cached, answered
with MRTR, which may run long and which answer with a stream that stays open. Code reads
these facts from here (`call.spec`) rather than listing method names of its own.
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
    # The work may take long (a tool, a prompt, a read, a completion): a client that goes away
    # cancels it (SHTTP §Cancellation), and an initialize-era client that accepts SSE gets its
    # answer as a stream, for progress, logs and requests for input (L-TR §Sending).
    long_running: bool = False
    # The answer is a stream of notifications that stays open until the client leaves
    # (subscriptions/listen; spec: basic/utilities/subscriptions): no read deadline upstream,
    # answered in a task of its own, served by the subscription hub.
    stream_only: bool = False


# The name of the one stream-only method, for the gateway's own listen requests.
LISTEN = "subscriptions/listen"

METHODS: dict[str, MethodSpec] = {
    m.name: m
    for m in (
        MethodSpec("server/discover", idempotent=True, cacheable=True),
        MethodSpec("tools/list", capability="tools", list_key="tools", idempotent=True, cacheable=True),
        MethodSpec("tools/call", name_field="name", capability="tools", mrtr=True, long_running=True),
        MethodSpec("prompts/list", capability="prompts", list_key="prompts", idempotent=True, cacheable=True),
        MethodSpec("prompts/get", name_field="name", capability="prompts", mrtr=True, long_running=True),
        MethodSpec("resources/list", capability="resources", list_key="resources", idempotent=True, cacheable=True),
        MethodSpec(
            "resources/templates/list",
            capability="resources",
            list_key="resourceTemplates",
            idempotent=True,
            cacheable=True,
        ),
        MethodSpec("resources/read", name_field="uri", capability="resources", idempotent=True, cacheable=True,
                   mrtr=True, long_running=True),
        MethodSpec("completion/complete", capability="completions", long_running=True),
        MethodSpec(LISTEN, stream_only=True),
    )
}

LIST_METHODS = frozenset(m.name for m in METHODS.values() if m.list_key)


def is_long_running(method: str) -> bool:
    spec = METHODS.get(method)
    return spec is not None and spec.long_running
