"""gateway/routing/fanout.py: the parallel list merge, driven with page functions in process
(over HTTP: tests/integration/test_front_door_routing.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.backends.modern import ModernHttpBackend
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import parse_call
from gateway.routing import cursor as gw_cursor
from gateway.routing.fanout import aggregate_list
from gateway.routing.table import RouteTable, Target
from gateway.settings import BackendSettings

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def target(name: str, prefix: str, **settings: Any) -> Target:
    backend = ModernHttpBackend(BackendSettings(name=name, url=f"http://127.0.0.1:1/{name}", **settings))
    return Target(backend, prefix)


def list_call(method: str = "tools/list", **params: Any):
    body = orjson.dumps({"jsonrpc": "2.0", "id": 9, "method": method, "params": {**params, "_meta": META}})
    return parse_call(body, {"mcp-protocol-version": "2026-07-28", "mcp-method": method})


# -- fan-out -----------------------------------------------------------------------------


def page(items: list[dict[str, Any]], cursor: str | None = None, **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"tools": items, "resultType": "complete", "ttlMs": 1000, "cacheScope": "public", **extra}
    if cursor:
        result["nextCursor"] = cursor
    return {"jsonrpc": "2.0", "id": 9, "result": result}


async def test_merge_is_in_fleet_order_prefixed_and_paged():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    seen: dict[str, Any] = {}

    async def fetch(t: Target, sub) -> dict[str, Any]:
        seen[t.backend.name] = sub.params.get("cursor")
        if t is b:
            await asyncio.sleep(0.01)  # answers last, still listed second
            return page([{"name": "x"}], ttlMs=500, cacheScope="private")
        if sub.params.get("cursor") == "a-2":
            return page([{"name": "z"}])
        return page([{"name": "x"}, {"name": "y"}], cursor="a-2")

    result = await aggregate_list(list_call(), table, table.targets, fetch)
    assert [t["name"] for t in result["tools"]] == ["a__x", "a__y", "b__x"]
    assert result["ttlMs"] == 500 and result["cacheScope"] == "private"  # the strictest part wins
    assert gw_cursor.decode("tools/list", result["nextCursor"], None) == {"a": "a-2"}
    assert seen == {"a": None, "b": None}

    seen.clear()
    nxt = await aggregate_list(list_call(cursor=result["nextCursor"]), table, table.targets, fetch)
    assert seen == {"a": "a-2"}  # only the backend with pages left, with its own cursor
    assert [t["name"] for t in nxt["tools"]] == ["a__z"]
    assert "nextCursor" not in nxt


async def test_failed_and_late_backends_are_left_out():
    a, b, c = target("a", "a__"), target("b", "b__", list_timeout_seconds=0.05), target("c", "c__")
    table = RouteTable([a, b, c])
    never = asyncio.Event()

    async def fetch(t: Target, sub) -> dict[str, Any]:
        if t is b:  # the fetcher bounds each backend by its list deadline (Dispatcher._list_page)
            async with asyncio.timeout(t.backend.settings.list_timeout_seconds):
                await never.wait()
        if t is c:
            raise rpc.backend_unavailable("c", "connection refused")
        return page([{"name": "x"}])

    result = await aggregate_list(list_call(), table, table.targets, fetch)
    assert [t["name"] for t in result["tools"]] == ["a__x"]


async def test_backend_error_answers_are_left_out_too():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])

    async def fetch(t: Target, sub) -> dict[str, Any]:
        if t is b:
            return {"jsonrpc": "2.0", "id": 9, "error": {"code": -32603, "message": "boom"}}
        return page([{"name": "x"}])

    result = await aggregate_list(list_call(), table, table.targets, fetch)
    assert [t["name"] for t in result["tools"]] == ["a__x"]


async def test_all_failing_is_one_error_naming_every_backend():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])

    async def fetch(t: Target, sub) -> dict[str, Any]:
        raise rpc.backend_timeout(t.backend.name, 1.0)

    with pytest.raises(rpc.McpError) as info:
        await aggregate_list(list_call(), table, table.targets, fetch)
    err = info.value
    assert err.code == rpc.BACKEND_UNAVAILABLE and err.request_id == 9
    assert err.data == {"backends": ["a", "b"]}
    assert "'a'" in err.message and "'b'" in err.message


# -- partial answers ---------------------------------------------------------------------


async def test_a_partial_answer_has_ttl_0_and_pages_on_to_the_failed_backend():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    b_down = True

    async def fetch(t: Target, sub) -> dict[str, Any]:
        if t is b and b_down:
            raise rpc.backend_unavailable("b", "connection refused")
        return page([{"name": "x"}])

    first = await aggregate_list(list_call(), table, table.targets, fetch)
    assert [t["name"] for t in first["tools"]] == ["a__x"]
    assert first["ttlMs"] == 0  # a's 1000 ms would present the partial list as the list
    assert gw_cursor.decode_position("tools/list", first["nextCursor"], None) == ({"b": None}, {"b": 1})

    b_down = False
    second = await aggregate_list(list_call(cursor=first["nextCursor"]), table, table.targets, fetch)
    assert [t["name"] for t in second["tools"]] == ["b__x"]  # b's first page, asked again
    assert second["ttlMs"] == 1000 and "nextCursor" not in second


async def test_a_failed_continuation_keeps_the_backends_own_cursor():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    failing = False

    async def fetch(t: Target, sub) -> dict[str, Any]:
        if t is a and sub.params.get("cursor") == "a-2":
            if failing:
                raise rpc.backend_timeout("a", 1.0)
            return page([{"name": "z"}])
        return page([{"name": "x"}], cursor="a-2" if t is a else None)

    first = await aggregate_list(list_call(), table, table.targets, fetch)
    failing = True
    second = await aggregate_list(list_call(cursor=first["nextCursor"]), table, table.targets, fetch)
    assert second["tools"] == [] and second["ttlMs"] == 0  # every backend failed: still a page
    assert gw_cursor.decode_position("tools/list", second["nextCursor"], None) == ({"a": "a-2"}, {"a": 1})
    failing = False
    third = await aggregate_list(list_call(cursor=second["nextCursor"]), table, table.targets, fetch)
    assert [t["name"] for t in third["tools"]] == ["a__z"] and "nextCursor" not in third


async def test_a_backend_that_stays_down_does_not_page_forever():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    asked: list[str | None] = []

    async def fetch(t: Target, sub) -> dict[str, Any]:
        if t is b:
            asked.append(sub.params.get("cursor"))
            raise rpc.backend_unavailable("b", "connection refused")
        return page([{"name": "x"}])

    result = await aggregate_list(list_call(), table, table.targets, fetch)
    pages = 1
    while "nextCursor" in result:
        assert result["ttlMs"] == 0
        result = await aggregate_list(list_call(cursor=result["nextCursor"]), table, table.targets, fetch)
        pages += 1
        assert pages <= 10, "the list never ended"
    assert result["ttlMs"] == 0
    assert asked == [None] * (1 + gw_cursor.RETRY_BUDGET)  # first page each time, budget then stop


# -- every backend refused the request as invalid ------------------------------------------


def refusal(message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": -32602, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": 9, "error": error}


async def test_every_backend_refusing_as_invalid_is_the_clients_invalid_params():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])

    async def fetch(t: Target, sub) -> dict[str, Any]:
        return refusal(f"{t.backend.name} says: clientInfo.name must be a string")

    with pytest.raises(rpc.McpError) as info:
        await aggregate_list(list_call(), table, table.targets, fetch)
    err = info.value
    assert (err.code, err.status, err.request_id) == (-32602, 400, 9)
    assert err.data == {"backends": ["a", "b"]}
    assert "a: a says: clientInfo.name must be a string" in err.message
    assert "b: b says" in err.message


async def test_one_backend_refusing_as_invalid_is_relayed_as_it_said_it():
    a = target("a", "")
    table = RouteTable([a])

    async def fetch(t: Target, sub) -> dict[str, Any]:
        return refusal("Invalid cursor", {"cursor": "x"})

    with pytest.raises(rpc.McpError) as info:
        await aggregate_list(list_call(), table, table.targets, fetch)
    assert (info.value.code, info.value.status, info.value.message, info.value.data) == (
        -32602, 400, "Invalid cursor", {"cursor": "x"})

    async def bare(t: Target, sub) -> dict[str, Any]:
        return refusal("Invalid params")

    with pytest.raises(rpc.McpError) as info:
        await aggregate_list(list_call(), table, table.targets, bare)
    assert info.value.data == {"backend": "a"}  # it says who refused


async def test_invalid_from_some_and_down_elsewhere_is_still_an_outage():
    """Only a unanimous refusal blames the request: a backend that did not answer may have
    taken it."""
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])

    async def fetch(t: Target, sub) -> dict[str, Any]:
        if t is b:
            raise rpc.backend_unavailable("b", "connection refused")
        return refusal("nope")

    with pytest.raises(rpc.McpError) as info:
        await aggregate_list(list_call(), table, table.targets, fetch)
    assert (info.value.code, info.value.status) == (rpc.BACKEND_UNAVAILABLE, 502)


async def test_invalid_from_one_backend_leaves_it_out_of_the_others_answer():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])

    async def fetch(t: Target, sub) -> dict[str, Any]:
        return refusal("nope") if t is b else page([{"name": "x"}])

    result = await aggregate_list(list_call(), table, table.targets, fetch)
    assert [t["name"] for t in result["tools"]] == ["a__x"] and result["ttlMs"] == 0


async def test_every_backend_refusing_a_continuation_as_invalid_is_invalid_params_too():
    a, b = target("a", "a__"), target("b", "b__")
    table = RouteTable([a, b])
    cursor = gw_cursor.encode("tools/list", {"a": "a-2", "b": "b-2"})

    async def fetch(t: Target, sub) -> dict[str, Any]:
        return refusal("bad cursor")

    with pytest.raises(rpc.McpError) as info:
        await aggregate_list(list_call(cursor=cursor), table, table.targets, fetch)
    assert (info.value.code, info.value.status) == (-32602, 400)
