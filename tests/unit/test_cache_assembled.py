"""Aggregated list answers kept encoded and reused (gateway/cache/assembled.py), driven through
the real Dispatcher, StoreCache and MemoryStore. Each backend answers from a list the test
can change and counts what reached it, so every test can tell a reused answer from an
assembled one, and both from the backend's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.backends.base import internal_call
from gateway.cache.assembled import MAX_ANSWERS
from gateway.cache.memory import MemoryStore
from gateway.cache.service import StoreCache
from gateway.dispatch import Dispatcher
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import Principal
from gateway.routing.table import RouteTable, Target
from gateway.settings import CacheSettings
from tests.support.clock import ManualClock
from tests.support.fake_backend import FakeBackend

# Authenticated (auth.mode jwt): only those key private entries (`Principal.cache_key`).
ALICE, BOB = Principal("alice", "https://idp", True), Principal("bob", "https://idp", True)


class Listing:
    """A FakeBackend handler: answers tools/list and prompts/list with `self.tools` as names, at
    `self.ttl` and `self.scope`; or fails. The backend's `calls` count what reached it."""

    def __init__(self, name: str, tools: list[str]) -> None:
        self.name = name
        self.tools = tools
        self.ttl, self.scope = 60_000, "public"
        self.fail = False

    def __call__(self, call):
        assert call.method in ("tools/list", "prompts/list")
        if self.fail:
            raise rpc.McpError(rpc.BACKEND_UNAVAILABLE, f"{self.name} is down", status=502)
        items = ([{"name": t, "inputSchema": {"type": "object"}} for t in self.tools] if call.method == "tools/list"
                 else [{"name": t} for t in self.tools])
        return {call.method.split("/")[0]: items, "resultType": "complete", "ttlMs": self.ttl,
                "cacheScope": self.scope}


def listing_backend(name: str, tools: list[str]) -> FakeBackend:
    return FakeBackend(Listing(name, tools), name=name)


@pytest.fixture
def fleet():
    clock = ManualClock()
    backends = [listing_backend("alpha", ["a1", "a2"]), listing_backend("beta", ["b1"])]
    table = RouteTable([Target(b, f"{b.name}__") for b in backends])
    cache = StoreCache(MemoryStore(max_entries=100, max_bytes=1 << 20, clock=clock), CacheSettings(), clock=clock)
    return Dispatcher(table, cache=cache), backends, clock


def tools_list(principal: Principal = ALICE, request_id: Any = 1, method: str = "tools/list", **params: Any):
    call = internal_call(method, params, request_id=request_id)
    call.principal = principal
    return call


async def answer(dispatcher: Dispatcher, call) -> tuple[dict[str, Any], str]:
    reply = await dispatcher.dispatch(call)
    assert reply.message is not None
    if reply.raw is not None:
        # The body the client gets and the message other consumers get are the same answer.
        assert orjson.loads(reply.raw) == reply.message
    return reply.message, dict(reply.headers or [])[b"x-cache"].decode()


def reused(dispatcher: Dispatcher) -> int:
    return dispatcher.cache.assembled.reused  # type: ignore[attr-defined]


async def test_a_repeated_list_is_reused_with_its_own_id_and_the_freshness_left(fleet):
    dispatcher, backends, clock = fleet
    first, status1 = await answer(dispatcher, tools_list(request_id=1))
    second, status2 = await answer(dispatcher, tools_list(request_id=2))
    clock.now += 1_500
    third, status3 = await answer(dispatcher, tools_list(request_id="three"))
    assert (status1, status2, status3) == ("miss", "hit", "hit")
    assert reused(dispatcher) == 1
    assert [len(b.calls) for b in backends] == [1, 1]
    assert third["id"] == "three"
    assert third["result"]["ttlMs"] == second["result"]["ttlMs"] - 1_500 > 0
    without = lambda m: {k: v for k, v in m["result"].items() if k != "ttlMs"}  # noqa: E731
    assert without(third) == without(second) == without(first)
    assert [t["name"] for t in third["result"]["tools"]] == ["alpha__a1", "alpha__a2", "beta__b1"]


async def test_an_invalidation_ends_the_reuse(fleet):
    dispatcher, backends, _ = fleet
    for request_id in (1, 2):
        await answer(dispatcher, tools_list(request_id=request_id))
    backends[0].handler.tools = ["a1", "a3"]
    await dispatcher.cache.invalidate_lists("alpha", ("tools/list",))
    after, status = await answer(dispatcher, tools_list(request_id=3))
    assert status == "miss"
    assert reused(dispatcher) == 0
    assert [t["name"] for t in after["result"]["tools"]] == ["alpha__a1", "alpha__a3", "beta__b1"]


async def test_expiry_ends_the_reuse(fleet):
    dispatcher, backends, clock = fleet
    for request_id in (1, 2):
        await answer(dispatcher, tools_list(request_id=request_id))
    clock.now += 60_000  # both entries exactly at the end of their freshness
    _, status = await answer(dispatcher, tools_list(request_id=3))
    assert status == "miss"
    assert reused(dispatcher) == 0
    assert [len(b.calls) for b in backends] == [2, 2]


async def test_private_answers_are_reused_only_for_their_principal(fleet):
    dispatcher, backends, _ = fleet
    for b in backends:
        b.handler.scope = "private"
    for request_id in (1, 2, 3):
        await answer(dispatcher, tools_list(ALICE, request_id))
    assert reused(dispatcher) == 1
    bob, status = await answer(dispatcher, tools_list(BOB, 4))
    assert status == "miss"  # Bob's own entries, fetched for him
    assert bob["result"]["cacheScope"] == "private"
    assert reused(dispatcher) == 1
    assert [len(b.calls) for b in backends] == [2, 2]


async def test_what_the_route_table_learns_ends_the_reuse(fleet):
    dispatcher, _, _ = fleet
    for request_id in (1, 2):
        await answer(dispatcher, tools_list(request_id=request_id))
    dispatcher.table.learn_resources(dispatcher.table.targets[1], [{"uri": "test://b"}])
    _, status = await answer(dispatcher, tools_list(request_id=3))
    assert status == "hit"  # still the cached entries, assembled again
    assert reused(dispatcher) == 0
    await answer(dispatcher, tools_list(request_id=4))
    assert reused(dispatcher) == 1


async def test_a_partial_answer_is_never_kept(fleet):
    dispatcher, backends, _ = fleet
    await answer(dispatcher, tools_list(request_id=1))
    backends[1].handler.fail = True
    await dispatcher.cache.invalidate_lists("beta", ("tools/list",))
    for request_id in (2, 3):
        partial, _ = await answer(dispatcher, tools_list(request_id=request_id))
        assert partial["result"]["ttlMs"] == 0
        assert [t["name"] for t in partial["result"]["tools"]] == ["alpha__a1", "alpha__a2"]
    assert reused(dispatcher) == 0


async def test_requests_that_differ_in_what_shapes_the_answer_are_kept_apart(fleet):
    dispatcher, backends, _ = fleet
    for request_id in (1, 2):
        await answer(dispatcher, tools_list(request_id=request_id))
    # A progress token does not shape the answer (cache/keys.py VOLATILE_META): reused.
    await answer(dispatcher, tools_list(request_id=3, _meta={"progressToken": "p-3"}))
    assert reused(dispatcher) == 1
    # A cursor does: the page it names is another answer, never the first page's.
    first = (await answer(dispatcher, tools_list(request_id=4)))[0]
    assert "nextCursor" not in first["result"]
    with pytest.raises(rpc.McpError):
        await dispatcher.dispatch(tools_list(request_id=5, cursor="not-a-gateway-cursor"))
    assert reused(dispatcher) == 2


async def test_without_a_cache_nothing_is_kept():
    backends = [listing_backend("alpha", ["a1"])]
    dispatcher = Dispatcher(RouteTable([Target(backends[0], "")]))
    for request_id in (1, 2, 3):
        message, status = await answer(dispatcher, tools_list(request_id=request_id))
        assert status == "bypass"
    assert len(backends[0].calls) == 3


async def test_an_entry_refilled_by_another_request_ends_the_reuse(fleet):
    # The memo is keyed by the params as sent, the store by the params canonicalized: the
    # same entry is reached by both orders. An entry dropped and refilled through the other
    # order is a new entry: the answer kept from the old one must not come back. (Prompts:
    # a tools list would also move the route table's revision, the other guard.)
    dispatcher, backends, _ = fleet
    for request_id in (1, 2):
        await answer(dispatcher, tools_list(request_id=request_id, method="prompts/list", x=1, y=2))
    await dispatcher.cache.invalidate_lists("alpha", ("prompts/list",))
    backends[0].handler.tools = ["a9"]
    _, status = await answer(dispatcher, tools_list(request_id=3, method="prompts/list", y=2, x=1))
    assert status == "miss"
    again, status = await answer(dispatcher, tools_list(request_id=4, method="prompts/list", x=1, y=2))
    assert status == "hit"
    assert [p["name"] for p in again["result"]["prompts"]] == ["alpha__a9", "beta__b1"]
    assert reused(dispatcher) == 0


async def test_a_change_in_who_serves_the_list_ends_the_reuse(fleet):
    dispatcher, backends, _ = fleet
    for request_id in (1, 2):
        await answer(dispatcher, tools_list(request_id=request_id))
    backends[1]._discovered = {"capabilities": {}}  # beta re-discovered without tools
    after, status = await answer(dispatcher, tools_list(request_id=3))
    assert status == "hit"
    assert [t["name"] for t in after["result"]["tools"]] == ["alpha__a1", "alpha__a2"]
    assert reused(dispatcher) == 0


async def test_kept_answers_are_bounded_and_the_oldest_goes_first():
    # Every distinct list request (here: its params) is kept separately; past MAX_ANSWERS the
    # oldest is dropped, so memory stays bounded however many distinct requests arrive.
    clock = ManualClock()
    backends = [listing_backend("alpha", ["a1"]), listing_backend("beta", ["b1"])]
    store = MemoryStore(max_entries=4 * MAX_ANSWERS, max_bytes=1 << 26, clock=clock)
    dispatcher = Dispatcher(RouteTable([Target(b, f"{b.name}__") for b in backends]),
                            cache=StoreCache(store, CacheSettings(), clock=clock))
    for page in range(MAX_ANSWERS + 1):
        for request_id in (1, 2):  # a miss, then a hit made only of fresh entries: kept
            await answer(dispatcher, tools_list(request_id=request_id, method="prompts/list", page=page))
    assert reused(dispatcher) == 0
    _, status = await answer(dispatcher, tools_list(request_id=3, method="prompts/list", page=MAX_ANSWERS))
    assert status == "hit" and reused(dispatcher) == 1
    _, status = await answer(dispatcher, tools_list(request_id=4, method="prompts/list", page=0))
    assert status == "hit" and reused(dispatcher) == 1  # its entries still hold; the kept answer is gone
