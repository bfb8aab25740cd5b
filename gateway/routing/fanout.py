"""Aggregated list methods: one page from every backend, in parallel, merged in order.

Each backend's page is bounded by its own deadline (the fetcher's job: `Dispatcher._list_page`
arms it around the trip to the backend only, so a cache hit pays for no timer); a backend that
fails or is late (`TimeoutError`) is left out of that answer
(logged, never a failed request) unless every backend failed on a first page (-31001), or
every backend refused the request as invalid (the client's -32602, status 400). Such a partial
answer says so: `ttlMs` 0 (nobody may keep it as the list), and the failed backend stays in the
gateway cursor to be asked again on the next page, a bounded number of times (cursor.py
`RETRY_BUDGET`), so the last page still comes. Items keep the fleet's configured backend order
and each backend's own order, so a complete answer is deterministic (spec: tools SHOULD be
listed in a deterministic order). Pagination goes through the gateway cursor, which carries
each backend's own cursor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.backends.base import Message
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.routing import cursor as gw_cursor
from gateway.routing.table import RouteTable, Target

log = logging.getLogger("gateway.fanout")

PageFetcher = Callable[[Target, Call], Awaitable[Message]]
_NO_RETRIES: gw_cursor.Retries = {}  # shared, never written


async def aggregate_list(
    call: Call,
    table: RouteTable,
    targets: Sequence[Target],
    fetch: PageFetcher,
) -> dict[str, Any]:
    """The merged result for a `*/list` call over `targets` (already capability-filtered)."""
    assert call.spec is not None and call.spec.list_key is not None
    list_key = call.spec.list_key
    continuation = "cursor" in call.params
    retries = _NO_RETRIES
    if continuation:
        pending, retries = gw_cursor.decode_position(call.method, call.params["cursor"], call.id)
        # Only backends still in the fleet; a cursor from before a config change loses the rest.
        plan: list[tuple[Target, str | None]] = [
            (t, pending[t.backend.name]) for t in targets if t.backend.name in pending]
    else:
        plan = [(t, None) for t in targets]
    if not plan:
        return {list_key: [], "resultType": "complete", "ttlMs": 0, "cacheScope": "public"}

    async def one(target: Target, backend_cursor: str | None) -> Message:
        if backend_cursor is None and not continuation:
            sub = call  # a first page: the backend gets the client's own params (and body)
        else:
            params = {k: v for k, v in call.params.items() if k != "cursor"}
            if backend_cursor is not None:
                params["cursor"] = backend_cursor
            sub = call.with_params(params)
        return await fetch(target, sub)

    outcomes: list[Message | BaseException]
    if len(plan) == 1:
        # One backend: awaited in this task. gather (and wait_for) added tasks and futures, more
        # than twice the cost of the list itself (bench/README.md "Profile").
        try:
            outcomes = [await one(*plan[0])]
        except Exception as exc:
            outcomes = [exc]
    else:
        outcomes = await asyncio.gather(*(one(t, c) for t, c in plan), return_exceptions=True)

    items: list[Any] = []
    pending_out: gw_cursor.Pending = {}
    retries_out: gw_cursor.Retries | None = None  # made on a failure only (the hot path has none)
    ttl: float | None = None
    private = False
    failures: list[str] = []
    refusals: dict[str, dict[str, Any]] | None = None  # backend → its -32602 error (made on one only)
    for (target, backend_cursor), outcome in zip(plan, outcomes):
        name = target.backend.name
        if isinstance(outcome, BaseException):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            detail = outcome.message if isinstance(outcome, rpc.McpError) else (
                f"no answer within {target.backend.settings.list_timeout_seconds:g}s"
                if isinstance(outcome, TimeoutError) else repr(outcome)
            )
        else:
            result = outcome.get("result")
            if isinstance(result, dict):
                page = result.get(list_key)
                next_cursor = result.get("nextCursor")
                has_next = isinstance(next_cursor, str)
                items.extend(_present(call.method, table, target, page if isinstance(page, list) else [],
                                      first=backend_cursor is None, last=not has_next))
                if has_next:
                    pending_out[name] = next_cursor
                part_ttl = result.get("ttlMs")
                part_ttl = max(0, part_ttl) if isinstance(part_ttl, (int, float)) and not isinstance(
                    part_ttl, bool) else 0
                ttl = part_ttl if ttl is None else min(ttl, part_ttl)
                private = private or result.get("cacheScope") != "public"
                continue
            err = outcome.get("error") or {}
            detail = f"error {err.get('code')} {err.get('message')}"
            if err.get("code") == rpc.INVALID_PARAMS:
                if refusals is None:
                    refusals = {}
                refusals[name] = err
        failures.append(f"{name}: {detail}")
        attempts = retries.get(name, 0) + 1
        if attempts <= gw_cursor.RETRY_BUDGET:
            # Kept in the cursor at the same position: the next page asks it again.
            pending_out[name] = backend_cursor
            if retries_out is None:
                retries_out = {}
            retries_out[name] = attempts
            log.warning("%s: backend %s left out of this page (retried on the next): %s", call.method, name,
                        detail)
        else:
            log.warning("%s: backend %s left out after %d attempts; the list ends without its remaining items: "
                        "%s", call.method, name, attempts, detail)

    if refusals is not None and len(refusals) == len(plan):
        raise _refused_as_invalid(call, refusals)
    if len(failures) == len(plan) and not continuation:
        raise rpc.McpError(
            rpc.BACKEND_UNAVAILABLE,
            f"{call.method}: no backend answered ({'; '.join(failures)})",
            status=502,
            data={"backends": [t.backend.name for t, _ in plan]},
            request_id=call.id,
        )
    merged: dict[str, Any] = {list_key: items, "resultType": "complete"}
    if pending_out:
        merged["nextCursor"] = gw_cursor.encode(call.method, pending_out, retries_out)
    # A partial answer must not be kept as the list: ttlMs 0 is "immediately stale" (SEP-2549).
    merged["ttlMs"] = 0 if failures else int(ttl or 0)
    merged["cacheScope"] = "private" if private else "public"
    return merged


def _refused_as_invalid(call: Call, refusals: dict[str, dict[str, Any]]) -> rpc.McpError:
    """Every backend asked refused the request as invalid (-32602): the request is at fault,
    not the fleet, so the client gets its -32602 with status 400 (digest §a.3), never a 502
    "no backend answered" that would send it retrying a request no retry can mend. One
    backend's error is relayed as it said it; several are quoted together, each named."""
    if len(refusals) == 1:
        (name, error), = refusals.items()
        message = error.get("message") if isinstance(error.get("message"), str) else "Invalid params"
        data = error.get("data")
        return rpc.McpError(rpc.INVALID_PARAMS, message, status=400,
                            data=data if data is not None else {"backend": name}, request_id=call.id)
    quoted = "; ".join(f"{name}: {error.get('message')}" for name, error in refusals.items())
    return rpc.McpError(rpc.INVALID_PARAMS, f"Invalid params: every backend refused this {call.method} ({quoted})",
                        status=400, data={"backends": list(refusals)}, request_id=call.id)


def _present(method: str, table: RouteTable, target: Target, page: list[Any], *, first: bool, last: bool
             ) -> list[Any]:
    """A backend's page as clients see it: names prefixed, routing indexes fed (`first` and
    `last` say where the page sits in the backend's own listing)."""
    curation = target.curation
    if method == "tools/list":
        page = table.filter_tools(target, page)
        if table.pins is not None:
            page = table.pins.present(target.backend.name, page)  # the backend's own definitions
        if curation is not None and curation.tools is not None:
            page = curation.tools.present(page, "name")  # before the prefix (routing/curation.py)
        return [_renamed(item, target) for item in page] if target.prefix else page
    if method == "prompts/list":
        if curation is not None and curation.prompts is not None:
            page = curation.prompts.present(page, "name")
        return [_renamed(item, target) for item in page if isinstance(item, dict)] if target.prefix else page
    if method == "resources/list":
        table.learn_resources(target, page, first=first, last=last)
        if curation is not None and curation.resources is not None:
            page = curation.resources.present(page, "uri")
    elif method == "resources/templates/list":
        table.learn_templates(target, page, first=first, last=last)
        if curation is not None and curation.resources is not None:
            page = curation.resources.present(page, "uriTemplate")
    return page


def _renamed(item: dict[str, Any], target: Target) -> dict[str, Any]:
    if isinstance(item.get("name"), str):
        item = dict(item)
        item["name"] = target.expose(item["name"])
    return item
