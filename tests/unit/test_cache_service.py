"""StoreCache (gateway/cache/service.py) over the memory store: hits, misses, scope,
coalescing, stale-if-error, invalidation. The loader stands in for the backend, so each test
counts exactly what would have gone upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends.base import internal_call
from gateway.cache.memory import MemoryStore
from gateway.cache.service import StoreCache
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import ANONYMOUS, Principal, credential_principal
from gateway.routing.table import Target
from gateway.settings import CacheSettings
from tests.support.clock import ManualClock
from tests.support.fake_backend import FakeBackend


def never_called(call):  # pragma: no cover - the cache must call the loader, not the backend
    raise AssertionError("the cache must call the loader, not the backend")


TARGET = Target(FakeBackend(never_called, name="alpha"), "")
# Authenticated (auth.mode jwt): only those key private entries (`Principal.cache_key`).
ALICE, BOB = Principal("alice", "https://idp", True), Principal("bob", "https://idp", True)


def make_cache(clock: ManualClock | None = None, **settings: Any) -> StoreCache:
    clock = clock or ManualClock()
    return StoreCache(
        MemoryStore(max_entries=100, max_bytes=1 << 20, clock=clock), CacheSettings(**settings), clock=clock
    )


def call(
    method: str = "resources/read", principal: Principal = ALICE, request_id: int = 7, **params: Any
):
    if method == "resources/read":
        params.setdefault("uri", "test://doc")
    c = internal_call(method, params, request_id=request_id)
    c.principal = principal
    return c


class Loader:
    def __init__(self, ttl: int | None = 60_000, scope: str = "public", **result: Any) -> None:
        self.calls = 0
        self.ttl, self.scope, self.result = ttl, scope, result
        self.gate: asyncio.Event | None = None
        self.fail: Exception | dict | None = None

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        n = self.calls  # which request to the backend this is, whenever it is answered
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.fail, Exception):
            raise self.fail
        if isinstance(self.fail, dict):
            return {"jsonrpc": "2.0", "id": 0, "error": self.fail}
        result: dict[str, Any] = {"resultType": "complete", "n": n, **self.result}
        if self.ttl is not None:
            result["ttlMs"] = self.ttl
        result["cacheScope"] = self.scope
        return {"jsonrpc": "2.0", "id": 0, "result": result}


async def test_second_request_is_a_hit_with_the_remaining_ttl_and_its_own_id():
    clock = ManualClock()
    cache, load = make_cache(clock), Loader(ttl=10_000)
    first, outcome = await cache.fetch(TARGET, call(request_id=1), load)
    assert outcome == "miss" and first["result"]["ttlMs"] == 10_000 and first["id"] == 1
    clock.now += 4_000
    second, outcome = await cache.fetch(TARGET, call(request_id=2), load)
    assert outcome == "hit" and load.calls == 1
    assert second["id"] == 2 and second["result"]["n"] == 1
    assert second["result"]["ttlMs"] == 6_000 and second["result"]["cacheScope"] == "public"
    clock.now += 6_000
    _, outcome = await cache.fetch(TARGET, call(), load)
    assert outcome == "miss" and load.calls == 2


async def test_private_answers_are_kept_per_principal():
    cache, load = make_cache(), Loader(scope="private")
    a1, _ = await cache.fetch(TARGET, call(principal=ALICE), load)
    b1, outcome = await cache.fetch(TARGET, call(principal=BOB), load)
    assert outcome == "miss" and b1["result"]["n"] == 2
    a2, outcome = await cache.fetch(TARGET, call(principal=ALICE), load)
    assert outcome == "hit" and a2["result"]["n"] == a1["result"]["n"] == 1
    # No principal at all: a private answer is never stored for "nobody".
    _, outcome = await cache.fetch(TARGET, call(principal=ANONYMOUS), load)
    _, outcome = await cache.fetch(TARGET, call(principal=ANONYMOUS), load)
    assert outcome == "miss" and load.calls == 4


async def test_an_unauthenticated_principal_keys_nothing_private():
    # auth.mode none: the anonymous caller, or a hash of an Authorization header nobody
    # verified. Neither is an identity: a private answer is not stored, not handed to a
    # coalesced caller, and a method-not-found is not remembered (docs/cache.md "Without
    # authentication"). Public answers are shared as usual.
    anonymous, claimed = credential_principal(None), credential_principal(b"Bearer made-up")
    cache, load = make_cache(negative_ttl_ms=5_000), Loader(scope="private")
    for who in (anonymous, anonymous, claimed, claimed):
        _, outcome = await cache.fetch(TARGET, call(principal=who), load)
        assert outcome == "miss"
    assert load.calls == 4 and len(cache.store) == 0

    load.gate = asyncio.Event()
    first = asyncio.create_task(cache.fetch(TARGET, call(principal=anonymous), load))
    while load.calls == 4:
        await asyncio.sleep(0.001)
    second = asyncio.create_task(cache.fetch(TARGET, call(principal=anonymous), load))
    await asyncio.sleep(0.01)  # it joined the fetch in flight
    load.gate.set()
    (a, _), (b, outcome) = await asyncio.gather(first, second)
    assert outcome == "miss" and a["result"]["n"] != b["result"]["n"]

    missing = Loader()
    missing.fail = {"code": rpc.METHOD_NOT_FOUND, "message": "no prompts here"}
    for _ in range(2):
        await cache.fetch(TARGET, call("prompts/list", principal=anonymous), missing)
    assert missing.calls == 2

    public = Loader(scope="public")
    await cache.fetch(TARGET, call(principal=anonymous), public)
    _, outcome = await cache.fetch(TARGET, call(principal=claimed), public)
    assert outcome == "hit" and public.calls == 1


async def test_a_remembered_method_not_found_is_private_to_its_principal():
    cache, load = make_cache(negative_ttl_ms=5_000), Loader()
    load.fail = {"code": rpc.METHOD_NOT_FOUND, "message": "no prompts for alice"}
    await cache.fetch(TARGET, call("prompts/list", principal=ALICE), load)
    _, outcome = await cache.fetch(TARGET, call("prompts/list", principal=ALICE), load)
    assert outcome == "hit" and load.calls == 1
    _, outcome = await cache.fetch(TARGET, call("prompts/list", principal=BOB), load)
    assert outcome == "miss" and load.calls == 2


async def test_public_answers_are_shared_between_principals():
    cache, load = make_cache(), Loader(scope="public")
    await cache.fetch(TARGET, call(principal=ALICE), load)
    _, outcome = await cache.fetch(TARGET, call(principal=BOB), load)
    assert outcome == "hit" and load.calls == 1


async def test_ttl_zero_input_required_and_mrtr_retries_are_not_stored():
    cache = make_cache()
    zero = Loader(ttl=0)
    for _ in range(2):
        answer, outcome = await cache.fetch(TARGET, call(uri="test://zero"), zero)
        assert outcome == "miss" and answer["result"]["ttlMs"] == 0
    assert zero.calls == 2

    async def input_required():
        input_required.calls += 1
        return {"jsonrpc": "2.0", "id": 0, "result": {"resultType": "input_required", "inputRequests": {}}}

    input_required.calls = 0
    for _ in range(2):
        answer, _ = await cache.fetch(TARGET, call(uri="test://ask"), input_required)
        assert "ttlMs" not in answer["result"] and "cacheScope" not in answer["result"]
    assert input_required.calls == 2

    retry = Loader()
    for _ in range(2):
        _, outcome = await cache.fetch(TARGET, call(uri="test://ask", inputResponses={"a": {}}), retry)
        assert outcome == "bypass"
    _, outcome = await cache.fetch(TARGET, call(uri="test://ask", requestState="s"), retry)
    assert outcome == "bypass" and retry.calls == 3


async def test_concurrent_misses_fetch_once():
    cache, load = make_cache(), Loader()
    load.gate = asyncio.Event()
    tasks = [asyncio.create_task(cache.fetch(TARGET, call(request_id=i), load)) for i in range(10)]
    await asyncio.sleep(0)
    while load.calls == 0:
        await asyncio.sleep(0.001)
    load.gate.set()
    answers = await asyncio.gather(*tasks)
    assert load.calls == 1
    assert sorted(a["id"] for a, _ in answers) == list(range(10))
    assert sorted(o for _, o in answers) == ["hit"] * 9 + ["miss"]


async def test_a_coalesced_private_answer_is_not_handed_to_another_principal():
    cache, load = make_cache(), Loader(scope="private")
    load.gate = asyncio.Event()
    alice = asyncio.create_task(cache.fetch(TARGET, call(principal=ALICE), load))
    while load.calls == 0:
        await asyncio.sleep(0.001)
    bob = asyncio.create_task(cache.fetch(TARGET, call(principal=BOB), load))
    await asyncio.sleep(0.01)
    load.gate.set()
    (a, _), (b, b_outcome) = await asyncio.gather(alice, bob)
    assert load.calls == 2 and b_outcome == "miss"
    assert a["result"]["n"] != b["result"]["n"]


async def test_cancelled_leader_does_not_fail_the_followers():
    cache, load = make_cache(), Loader()
    load.gate = asyncio.Event()
    leader = asyncio.create_task(cache.fetch(TARGET, call(), load))
    while load.calls == 0:
        await asyncio.sleep(0.001)
    follower = asyncio.create_task(cache.fetch(TARGET, call(), load))
    await asyncio.sleep(0.01)
    leader.cancel()
    await asyncio.sleep(0.01)
    load.gate.set()
    answer, outcome = await follower
    assert outcome == "miss" and answer["result"]["n"] == 2
    with pytest.raises(asyncio.CancelledError):
        await leader


@pytest.mark.parametrize(
    "failure",
    [
        rpc.backend_unavailable("alpha", "connection refused"),
        {"code": rpc.INTERNAL_ERROR, "message": "boom"},
    ],
)
async def test_stale_if_error_serves_an_expired_entry_within_the_window(failure):
    clock = ManualClock()
    cache, load = make_cache(clock, stale_if_error_ms=5_000), Loader(ttl=1_000)
    await cache.fetch(TARGET, call(), load)
    clock.now += 3_000
    load.fail = failure
    answer, outcome = await cache.fetch(TARGET, call(), load)
    assert outcome == "stale" and answer["result"]["n"] == 1 and answer["result"]["ttlMs"] == 0
    clock.now += 3_001  # past ttl + window
    if isinstance(failure, Exception):
        with pytest.raises(rpc.McpError):
            await cache.fetch(TARGET, call(), load)
    else:
        answer, outcome = await cache.fetch(TARGET, call(), load)
        assert outcome == "miss" and answer["error"]["code"] == rpc.INTERNAL_ERROR


async def test_without_stale_if_error_a_failure_is_the_answer():
    clock = ManualClock()
    cache, load = make_cache(clock), Loader(ttl=1_000)
    await cache.fetch(TARGET, call(), load)
    clock.now += 1_000
    load.fail = rpc.backend_unavailable("alpha", "connection refused")
    with pytest.raises(rpc.McpError):
        await cache.fetch(TARGET, call(), load)


async def test_method_not_found_is_remembered_when_configured():
    cache = make_cache(negative_ttl_ms=5_000)
    load = Loader()
    load.fail = {"code": rpc.METHOD_NOT_FOUND, "message": "no prompts here"}
    for request_id in (1, 2):
        answer, _ = await cache.fetch(TARGET, call("prompts/list", request_id=request_id), load)
        assert answer["error"]["code"] == rpc.METHOD_NOT_FOUND and answer["id"] == request_id
    assert load.calls == 1


async def test_invalidation_drops_lists_and_one_uri_for_every_principal():
    cache = make_cache()
    tools, doc, other = Loader(), Loader(scope="private"), Loader()
    await cache.fetch(TARGET, call("tools/list"), tools)
    await cache.fetch(TARGET, call("tools/list", cursor="p2"), tools)
    await cache.fetch(TARGET, call(uri="test://doc", principal=ALICE), doc)
    await cache.fetch(TARGET, call(uri="test://doc", principal=BOB), doc)
    await cache.fetch(TARGET, call(uri="test://other"), other)

    await cache.invalidate_lists("alpha", ("tools/list",))
    await cache.invalidate_resource("alpha", "test://doc")
    for c, loader in [
        (call("tools/list"), tools),
        (call("tools/list", cursor="p2"), tools),
        (call(uri="test://doc", principal=ALICE), doc),
        (call(uri="test://doc", principal=BOB), doc),
    ]:
        _, outcome = await cache.fetch(TARGET, c, loader)
        assert outcome == "miss"
    _, outcome = await cache.fetch(TARGET, call(uri="test://other"), other)
    assert outcome == "hit"
    await cache.invalidate_backend("alpha")
    _, outcome = await cache.fetch(TARGET, call(uri="test://other"), other)
    assert outcome == "miss"


async def test_a_config_change_for_the_route_starts_from_empty():
    store_clock = ManualClock()
    store = MemoryStore(max_entries=100, max_bytes=1 << 20, clock=store_clock)
    first = StoreCache(store, CacheSettings(), clock=store_clock)
    load = Loader()
    await first.fetch(TARGET, call(), load)
    moved = Target(FakeBackend(never_called, name="alpha", url="http://127.0.0.1:2/mcp"), "")
    second = StoreCache(store, CacheSettings(), clock=store_clock)
    _, outcome = await second.fetch(moved, call(), load)
    assert outcome == "miss"
    _, outcome = await second.fetch(TARGET, call(), load)
    assert outcome == "hit"


async def _three_coalesced_fetches_failing_with(failure: Exception) -> tuple[Loader, list[BaseException]]:
    """Requests 1, 2 and 3 miss together behind one held fetch, which then fails."""
    cache, load = make_cache(), Loader()
    load.gate = asyncio.Event()
    load.fail = failure
    tasks = [asyncio.create_task(cache.fetch(TARGET, call(request_id=i), load)) for i in (1, 2, 3)]
    while load.calls == 0:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # the other two join the flight
    load.gate.set()
    return load, await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_failed_coalesced_fetch_answers_each_waiter_with_its_own_id():
    # What a backend raises: an error already carrying the id of the call that was sent.
    load, failures = await _three_coalesced_fetches_failing_with(
        rpc.backend_unavailable("alpha", "connection refused", request_id=1))
    assert load.calls == 1
    assert all(isinstance(f, rpc.McpError) for f in failures)
    assert [f.request_id for f in failures] == [1, 2, 3]
    assert [f.to_message()["id"] for f in failures] == [1, 2, 3]
    assert {f.code for f in failures} == {rpc.BACKEND_UNAVAILABLE}


@pytest.mark.parametrize(
    "invalidate",
    [
        lambda cache: cache.invalidate_resource("alpha", "test://doc"),
        lambda cache: cache.invalidate_backend("alpha"),
    ],
)
async def test_an_invalidation_during_a_fetch_is_not_undone_by_its_fill(invalidate):
    cache, load = make_cache(), Loader()
    load.gate = asyncio.Event()
    before = asyncio.create_task(cache.fetch(TARGET, call(request_id=1), load))
    while load.calls == 0:
        await asyncio.sleep(0.001)
    await invalidate(cache)
    # A client refetching because of the notification must not join the old fetch.
    after = asyncio.create_task(cache.fetch(TARGET, call(request_id=2), load))
    await asyncio.sleep(0.01)  # it either joined the fetch in flight or started its own
    load.gate.set()
    (old, old_outcome), (new, new_outcome) = await asyncio.gather(before, after)
    assert old["result"]["n"] == 1 and old_outcome == "miss"
    assert new["result"]["n"] == 2 and new_outcome == "miss"
    # Whatever is stored now came from the fetch that started after the invalidation.
    again, outcome = await cache.fetch(TARGET, call(request_id=3), load)
    assert outcome == "hit" and again["result"]["n"] == 2 and load.calls == 2


async def test_a_fill_that_raced_an_invalidation_stores_nothing():
    cache, load = make_cache(), Loader()
    load.gate = asyncio.Event()
    racing = asyncio.create_task(cache.fetch(TARGET, call("tools/list"), load))
    while load.calls == 0:
        await asyncio.sleep(0.001)
    await cache.invalidate_lists("alpha", ("tools/list",))
    load.gate.set()
    await racing
    _, outcome = await cache.fetch(TARGET, call("tools/list"), load)
    assert outcome == "miss" and load.calls == 2


async def test_an_answer_larger_than_max_entry_bytes_is_served_but_not_stored():
    cache = make_cache(max_entry_bytes=512)
    big, small = Loader(text="x" * 1024), Loader(text="x" * 16)
    for n in (1, 2):
        answer, outcome = await cache.fetch(TARGET, call(uri="test://big"), big)
        assert outcome == "miss" and answer["result"]["n"] == n and answer["result"]["ttlMs"] == 60_000
    await cache.fetch(TARGET, call(uri="test://small"), small)
    _, outcome = await cache.fetch(TARGET, call(uri="test://small"), small)
    assert outcome == "hit" and small.calls == 1


@pytest.mark.parametrize(
    "answer",
    [
        {"resultType": "input_required", "inputRequests": {}},
        None,  # an error answer (not "method not found", so never remembered)
    ],
    ids=["input_required", "error"],
)
async def test_a_coalesced_answer_that_is_not_cacheable_is_not_handed_to_the_waiters(answer):
    # Such an answer belongs to the request that fetched it: each waiter asks for its own.
    calls = 0
    gate = asyncio.Event()

    async def load():
        nonlocal calls
        calls += 1
        n = calls
        await gate.wait()
        if answer is None:
            return {"jsonrpc": "2.0", "id": 0, "error": {"code": rpc.INVALID_PARAMS, "message": f"no #{n}"}}
        return {"jsonrpc": "2.0", "id": 0, "result": {**answer, "n": n}}

    cache = make_cache()
    tasks = [asyncio.create_task(cache.fetch(TARGET, call(request_id=i), load)) for i in (1, 2)]
    while calls == 0:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # the second request joined the first one's fetch
    assert calls == 1
    gate.set()
    answers = [a for a, _ in await asyncio.gather(*tasks)]
    assert calls == 2 and [a["id"] for a in answers] == [1, 2]
    if answer is None:
        assert sorted(a["error"]["message"] for a in answers) == ["no #1", "no #2"]
    else:
        assert sorted(a["result"]["n"] for a in answers) == [1, 2]
        assert all("ttlMs" not in a["result"] for a in answers)


async def test_an_unexpected_failure_of_a_coalesced_fetch_reaches_every_waiter():
    # Not a JSON-RPC error (a bug below the cache): every caller sees it; none hangs.
    load, failures = await _three_coalesced_fetches_failing_with(LookupError("not an McpError"))
    assert load.calls == 1 and [type(f) for f in failures] == [LookupError] * 3
