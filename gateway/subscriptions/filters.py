"""`SubscriptionFilter`: what a listen stream asks for, what it is granted, and which
notifications it admits (spec: basic/patterns/subscriptions §Notification Filter; digest §d).

A filter is a value: the three list-changed flags plus a set of resource URIs. The hub
combines filters with `|` (what an upstream listen must ask a backend for) and `&` (what a
client is granted: its request cut down to what the backend acknowledged).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.protocol import jsonrpc as rpc

# Wire flag → the notification it enables.
LIST_FLAGS: dict[str, str] = {
    "toolsListChanged": "notifications/tools/list_changed",
    "promptsListChanged": "notifications/prompts/list_changed",
    "resourcesListChanged": "notifications/resources/list_changed",
}
FLAG_OF: dict[str, str] = {method: flag for flag, method in LIST_FLAGS.items()}
RESOURCE_UPDATED = "notifications/resources/updated"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
# The only notifications that ride a listen stream (digest §c: progress and log messages
# never do; tasks are an extension the gateway does not offer).
DELIVERABLE = frozenset({*LIST_FLAGS.values(), RESOURCE_UPDATED})
# Capability (server/discover) that lets a backend deliver each flag (TOOLS, PROMPTS, RES).
_CAPABILITY_OF_FLAG = {"toolsListChanged": "tools", "promptsListChanged": "prompts",
                       "resourcesListChanged": "resources"}
# Cache entries a notification makes stale (digest §e, "Notifications").
INVALIDATES: dict[str, tuple[str, ...]] = {
    "notifications/tools/list_changed": ("tools/list",),
    "notifications/prompts/list_changed": ("prompts/list",),
    "notifications/resources/list_changed": ("resources/list", "resources/templates/list"),
}


@dataclass(frozen=True, slots=True)
class SubscriptionFilter:
    lists: frozenset[str] = frozenset()  # wire flag names that are true
    uris: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not self.lists and not self.uris

    def __or__(self, other: SubscriptionFilter) -> SubscriptionFilter:
        return SubscriptionFilter(self.lists | other.lists, self.uris | other.uris)

    def __and__(self, other: SubscriptionFilter) -> SubscriptionFilter:
        return SubscriptionFilter(self.lists & other.lists, self.uris & other.uris)

    def admits(self, message: Mapping[str, Any]) -> bool:
        """Whether a notification belongs on a stream granted this filter. A resource update
        is admitted for a subscribed URI or a sub-resource of one (schema
        `ResourceUpdatedNotification`: the uri "might be a sub-resource")."""
        method = message.get("method")
        flag = FLAG_OF.get(method) if isinstance(method, str) else None
        if flag is not None:
            return flag in self.lists
        if method == RESOURCE_UPDATED:
            params = message.get("params")
            uri = params.get("uri") if isinstance(params, Mapping) else None
            return isinstance(uri, str) and any(covers(s, uri) for s in self.uris)
        return False

    def notifications(self) -> list[dict[str, Any]]:
        """One notification per granted type: what a stream that may have missed changes
        is told (list-changed per flag, resources/updated per URI: both are level triggers,
        "refetch if you care")."""
        out: list[dict[str, Any]] = [rpc.notification(LIST_FLAGS[f], {}) for f in sorted(self.lists)]
        out.extend(rpc.notification(RESOURCE_UPDATED, {"uri": u}) for u in sorted(self.uris))
        return out

    def to_wire(self) -> dict[str, Any]:
        """The wire object: granted flags as `true`, URIs as a sorted list; omitted types are
        absent (spec §Acknowledgment: "types the server does not support are omitted")."""
        wire: dict[str, Any] = {flag: True for flag in LIST_FLAGS if flag in self.lists}
        if self.uris:
            wire["resourceSubscriptions"] = sorted(self.uris)
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> SubscriptionFilter:
        """Lenient reading of a filter a backend acknowledged (unknown or malformed parts are
        treated as not granted)."""
        if not isinstance(wire, Mapping):
            return cls()
        uris = wire.get("resourceSubscriptions")
        return cls(
            frozenset(flag for flag in LIST_FLAGS if wire.get(flag) is True),
            frozenset(u for u in uris if isinstance(u, str)) if isinstance(uris, list) else frozenset(),
        )


def union(filters: Iterable[SubscriptionFilter]) -> SubscriptionFilter:
    out = SubscriptionFilter()
    for f in filters:
        out = out | f
    return out


def parse_request(params: Mapping[str, Any], request_id: rpc.RequestId | None) -> tuple[SubscriptionFilter, bool]:
    """The client's `params.notifications`, strictly validated (a malformed filter is -32602
    naming the field), and whether it asks for `taskIds` (the Tasks extension)."""
    wire = params.get("notifications")
    if not isinstance(wire, Mapping):
        raise rpc.invalid_params('"params.notifications" (a SubscriptionFilter object) is required', request_id)
    for flag in LIST_FLAGS:
        if flag in wire and not isinstance(wire[flag], bool):
            raise rpc.invalid_params(f'"params.notifications.{flag}" must be a boolean', request_id)
    uris = wire.get("resourceSubscriptions", [])
    if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
        raise rpc.invalid_params('"params.notifications.resourceSubscriptions" must be an array of URI strings',
                                 request_id)
    task_ids = wire.get("taskIds")
    if task_ids is not None and not (isinstance(task_ids, list) and all(isinstance(t, str) for t in task_ids)):
        raise rpc.invalid_params('"params.notifications.taskIds" must be an array of strings', request_id)
    requested = SubscriptionFilter(frozenset(f for f in LIST_FLAGS if wire.get(f) is True), frozenset(uris))
    return requested, task_ids is not None


def deliverable(capabilities: Mapping[str, Any] | None) -> tuple[frozenset[str], bool]:
    """What a backend's advertised capabilities let it deliver on a listen stream: the
    list-changed flags, and whether it honours resource subscriptions (`resources.subscribe`,
    RES: "the server supports resourceSubscriptions")."""
    if not capabilities:
        return frozenset(), False
    flags = frozenset(
        flag for flag, cap in _CAPABILITY_OF_FLAG.items()
        if isinstance(capabilities.get(cap), Mapping) and capabilities[cap].get("listChanged") is True
    )
    resources = capabilities.get("resources")
    return flags, isinstance(resources, Mapping) and resources.get("subscribe") is True


def covers(subscribed: str, updated: str) -> bool:
    """`updated` is `subscribed` or one of its sub-resources: the same URI, or one that
    continues it after a path, query or fragment boundary (never a mere string prefix:
    `file:///a` does not cover `file:///ab`)."""
    if updated == subscribed:
        return True
    if not updated.startswith(subscribed):
        return False
    return subscribed.endswith("/") or updated[len(subscribed)] in "/?#"
