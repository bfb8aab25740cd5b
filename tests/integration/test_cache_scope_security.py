"""The cache's scope rules, end to end (docs/cache.md "Keys", "Without authentication"; digest
§e `cacheScope`, §i): a `private` answer is never served to another principal, on any path.

Everything is real: the gateway over HTTP (tests/support/gateway.py), a backend on 127.0.0.1
that answers each caller for that caller (tests/support/per_caller.py), JWTs signed by a real
key and checked against a JWKS served over HTTP, a real redis-server shared by two replicas.
The backend records who reached it, so every test can tell an answer fetched for a caller
from one served out of the cache, and whose it was.

Waits for concurrency are on observed states (a request reached the backend, a caller joined
the fetch in flight), never on durations; nothing asserts how long anything took."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.cache import assembled
from gateway.cache.singleflight import SingleFlight
from tests.support import mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.oauth import serve
from tests.support.per_caller import IdentityProvider, PerCallerBackend, as_caller, identity_provider

# The three stores a private entry can live in: the embedded memory LRU, Redis alone, and
# Redis with the in-process local layer in front (a long local TTL: only the rules under test
# can make it forget).
STORES = {
    "memory": {"store": "memory"},
    "redis": {"store": "redis", "local_max_entries": 0},
    "layered": {"store": "redis", "local_ttl_ms": 60_000},
}
SHARED = ["redis", "layered"]


class Caller:
    """One client: the name the backend sees (clientInfo) and the headers it authenticates with."""

    def __init__(self, name: str, headers: dict[str, str] | None = None) -> None:
        self.name = name
        self.headers = headers or {}


class JoinSpy(SingleFlight[Any]):
    """The cache's in-process coalescing, counting callers that joined a fetch in flight. A
    caller counted here is already waiting on that fetch (nothing yields in between)."""

    def __init__(self) -> None:
        super().__init__()
        self.joins = 0

    async def run(self, key, work, adopt=None):  # type: ignore[no-untyped-def]
        if key in self._flights:
            self.joins += 1
        return await super().run(key, work, adopt)

    async def joined(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while self.joins < count:
            assert time.monotonic() < deadline, f"only {self.joins} caller(s) joined the fetch in flight"
            await asyncio.sleep(0.002)


@pytest.fixture
async def idp() -> AsyncIterator[IdentityProvider]:
    async with identity_provider() as provider:
        yield provider


@contextlib.asynccontextmanager
async def backends(*list_scopes: str) -> AsyncIterator[list[PerCallerBackend]]:
    """Per-caller backends on loopback, one per list scope given."""
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for scope in list_scopes:
            backend = PerCallerBackend(list_scope=scope)
            served = await stack.enter_async_context(serve(backend))
            backend.url = f"{served.base}/mcp"
            out.append(backend)
        yield out


@pytest.fixture
async def backend() -> AsyncIterator[PerCallerBackend]:
    async with backends("private") as (one,):
        yield one


def cache_settings(request: pytest.FixtureRequest, store: str, **cache: Any) -> dict[str, Any]:
    settings = {**STORES[store], "key_prefix": f"scope{uuid.uuid4().hex[:8]}", **cache}
    if settings["store"] == "redis":
        settings |= {"redis_url": request.getfixturevalue("redis_server").url, "redis_retry_seconds": 0.1}
    return settings


def gateway_config(fleet: list[PerCallerBackend], cache: dict[str, Any], idp: IdentityProvider | None
                   ) -> dict[str, Any]:
    names = ["alpha", "beta", "gamma"]
    config: dict[str, Any] = {
        "backends": [{"name": names[i], "url": b.url, "era": "modern"} for i, b in enumerate(fleet)],
        "cache": cache,
    }
    if idp is not None:
        config["auth"] = idp.auth_settings()
    return config


async def post(c: httpx.AsyncClient, gw: RunningGateway, who: Caller, method: str,
               params: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> httpx.Response:
    return await mcp_http.post(c, gw.url, method, params, meta={**as_caller(who.name), **(meta or {})},
                               extra_headers=who.headers)


async def read(c: httpx.AsyncClient, gw: RunningGateway, who: Caller, uri: str,
               meta: dict[str, Any] | None = None, **params: Any) -> tuple[dict[str, Any], str | None]:
    response = await post(c, gw, who, "resources/read", {"uri": uri, **params}, meta)
    assert response.status_code == 200, response.text
    return response.json()["result"], response.headers.get("x-cache")


async def tools(c: httpx.AsyncClient, gw: RunningGateway, who: Caller) -> tuple[list[str], str, str | None]:
    response = await post(c, gw, who, "tools/list")
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    return [t["name"] for t in result["tools"]], result["cacheScope"], response.headers.get("x-cache")


def text(result: dict[str, Any]) -> str:
    return result["contents"][0]["text"]


def for_whom(result: dict[str, Any]) -> str:
    """Whom the backend made this answer for ("anyone" for a public one)."""
    return text(result).split(" for ", 1)[1].split(" #", 1)[0]


def people(idp: IdentityProvider, *names: str) -> list[Caller]:
    return [Caller(n, idp.bearer(n)) for n in names]


# -- private entries are keyed by the principal, on every store -------------------------------


@pytest.mark.parametrize("store", list(STORES))
async def test_private_answers_are_keyed_by_the_tokens_principal_on_every_store(request, idp, backend, store):
    alice, bob = people(idp, "alice", "bob")
    uri = "who://private/60000/doc"
    config = gateway_config([backend], cache_settings(request, store), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        first, outcome = await read(c, gw, alice, uri)
        assert (outcome, text(first), first["cacheScope"]) == ("miss", f"{uri} for alice #1", "private")
        again, outcome = await read(c, gw, alice, uri)
        assert (outcome, text(again)) == ("hit", f"{uri} for alice #1")
        theirs, outcome = await read(c, gw, bob, uri)
        assert (outcome, text(theirs)) == ("miss", f"{uri} for bob #2")
        result, outcome = await read(c, gw, bob, uri)
        assert (outcome, text(result)) == ("hit", f"{uri} for bob #2")
        # Another token for the same subject is the same principal (issuer + subject)...
        other_token = Caller("alice", idp.bearer("alice", jti="second-token"))
        assert text((await read(c, gw, other_token, uri))[0]) == f"{uri} for alice #1"
        # ...and what the client says about itself in the body is no identity: Bob naming
        # himself alice still gets Bob's entry.
        impostor = Caller("alice", bob.headers)
        result, outcome = await read(c, gw, impostor, uri)
        assert (outcome, text(result)) == ("hit", f"{uri} for bob #2")
    assert backend.seen("resources/read", uri) == ["alice", "bob"]


@pytest.mark.parametrize("store", SHARED)
async def test_two_replicas_sharing_redis_never_cross_private_entries(request, idp, backend, store):
    alice, bob, carol = people(idp, "alice", "bob", "carol")
    uri = "who://private/60000/shared"
    config = gateway_config([backend], cache_settings(request, store), idp)
    async with running_gateway(config) as one, running_gateway(config) as two, httpx.AsyncClient() as c:
        result, outcome = await read(c, one, alice, uri)
        assert (outcome, text(result)) == ("miss", f"{uri} for alice #1")
        result, outcome = await read(c, two, alice, uri)
        assert (outcome, text(result)) == ("hit", f"{uri} for alice #1")  # replica one's entry
        result, outcome = await read(c, two, bob, uri)
        assert (outcome, text(result)) == ("miss", f"{uri} for bob #2")
        result, outcome = await read(c, one, bob, uri)
        assert (outcome, text(result)) == ("hit", f"{uri} for bob #2")  # replica two's entry
        result, outcome = await read(c, one, carol, uri)
        assert (outcome, text(result)) == ("miss", f"{uri} for carol #3")
        for gw in (one, two):
            for who in (alice, bob, carol):
                assert for_whom((await read(c, gw, who, uri))[0]) == who.name
    assert backend.seen("resources/read", uri) == ["alice", "bob", "carol"]


# -- single-flight: a private fetch in flight is never handed to another principal ------------


@pytest.mark.parametrize("store", ["memory", "layered"])
async def test_a_private_fetch_in_flight_is_never_handed_to_another_principal(request, idp, backend, store):
    alice, bob = people(idp, "alice", "bob")
    uri = "who://private/0/gated-flight"  # ttlMs 0: nothing is stored, only the flight is shared
    config = gateway_config([backend], cache_settings(request, store), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        spy = gw.runtime.cache._flights = JoinSpy()
        first = asyncio.create_task(read(c, gw, alice, uri))
        await backend.arrived("resources/read", uri, 1)
        other = asyncio.create_task(read(c, gw, bob, uri))
        await spy.joined(1)
        same = asyncio.create_task(read(c, gw, alice, uri))
        await spy.joined(2)
        assert backend.seen("resources/read", uri) == ["alice"]  # both are waiting on alice's fetch
        backend.release(uri)
        (a, a_outcome), (b, b_outcome), (a2, a2_outcome) = await asyncio.gather(first, other, same)
    assert (a_outcome, text(a)) == ("miss", f"{uri} for alice #1")
    assert (a2_outcome, text(a2)) == ("hit", f"{uri} for alice #1")  # same principal: shared
    assert (b_outcome, text(b)) == ("miss", f"{uri} for bob #2")  # fetched for bob himself
    assert backend.seen("resources/read", uri) == ["alice", "bob"]


async def test_a_replica_waiting_on_anothers_fetch_lock_never_takes_a_private_answer(request, idp, backend):
    alice, bob = people(idp, "alice", "bob")
    config = gateway_config([backend], cache_settings(request, "layered", lock_timeout_ms=10_000), idp)
    async with running_gateway(config) as one, running_gateway(config) as two, httpx.AsyncClient() as c:
        waiting: list[Any] = []
        wait_for_lock = two.runtime.cache._await_other_replica

        async def spy(keys: Any) -> Any:
            waiting.append(keys)
            return await wait_for_lock(keys)

        two.runtime.cache._await_other_replica = spy

        async def held_on_one_then_asked_on_two(uri: str, second: Caller) -> tuple[Any, Any]:
            first = asyncio.create_task(read(c, one, alice, uri))
            await backend.arrived("resources/read", uri, 1)  # replica one holds the fetch lock
            count = len(waiting)
            other = asyncio.create_task(read(c, two, second, uri))
            deadline = time.monotonic() + 10
            while len(waiting) == count:  # replica two found the lock taken and waits on it
                assert time.monotonic() < deadline, "replica two never waited on the fetch lock"
                await asyncio.sleep(0.002)
            backend.release(uri)
            return await first, await other

        # The same principal on the other replica is given the entry it waited for...
        uri = "who://private/60000/gated-same"
        (a, _), (again, outcome) = await held_on_one_then_asked_on_two(uri, alice)
        assert text(a) == text(again) == f"{uri} for alice #1" and outcome == "hit"
        assert backend.seen("resources/read", uri) == ["alice"]
        # ...another principal never: it fetches its own once the lock is gone.
        uri = "who://private/60000/gated-other"
        (a, _), (theirs, outcome) = await held_on_one_then_asked_on_two(uri, bob)
        assert text(a) == f"{uri} for alice #1"
        assert (outcome, text(theirs)) == ("miss", f"{uri} for bob #2")
        assert backend.seen("resources/read", uri) == ["alice", "bob"]


# -- kept aggregated list answers --------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "layered"])
async def test_a_kept_list_answer_with_one_private_page_is_never_reused_for_another_principal(request, idp,
                                                                                            store):
    alice, bob = people(idp, "alice", "bob")
    async with backends("public", "private") as (alpha, beta):
        config = gateway_config([alpha, beta], cache_settings(request, store), idp)
        async with running_gateway(config) as gw, httpx.AsyncClient() as c:
            answers = [await tools(c, gw, alice) for _ in range(3)]
            assert [o for _, _, o in answers] == ["miss", "hit", "hit"]
            assert gw.runtime.cache.assembled.reused == 1  # the third was the kept answer
            assert answers[2][:2] == (["alpha__public_tool", "beta__tool_for_alice"], "private")
            names, scope, outcome = await tools(c, gw, bob)
            assert (names, scope, outcome) == (
                ["alpha__public_tool", "beta__tool_for_bob"], "private", "miss")
            for _ in range(2):
                assert (await tools(c, gw, bob))[0] == ["alpha__public_tool", "beta__tool_for_bob"]
                assert (await tools(c, gw, alice))[0] == ["alpha__public_tool", "beta__tool_for_alice"]
    assert beta.seen("tools/list") == ["alice", "bob"]
    assert alpha.seen("tools/list") == ["alice"]  # the public page is everyone's


# -- a backend that answers public to one principal and private to another --------------------


@pytest.mark.parametrize("store", list(STORES))
async def test_an_answer_public_for_one_and_private_for_others_never_crosses(request, idp, backend, store):
    alice, bob, carol = people(idp, "alice", "bob", "carol")
    uri = "who://public-for-bob/60000/mixed"
    config = gateway_config([backend], cache_settings(request, store), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        result, outcome = await read(c, gw, alice, uri)
        assert (outcome, text(result), result["cacheScope"]) == ("miss", f"{uri} for alice #1", "private")
        result, outcome = await read(c, gw, bob, uri)  # not alice's private entry
        assert (outcome, text(result), result["cacheScope"]) == ("miss", f"{uri} for anyone #2", "public")
        result, outcome = await read(c, gw, carol, uri)  # bob's public answer is anyone's
        assert (outcome, text(result), result["cacheScope"]) == ("hit", f"{uri} for anyone #2", "public")
        result, outcome = await read(c, gw, alice, uri)  # her own entry first
        assert (outcome, text(result), result["cacheScope"]) == ("hit", f"{uri} for alice #1", "private")
    assert backend.seen("resources/read", uri) == ["alice", "bob"]


# -- stale-if-error --------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "layered"])
async def test_stale_if_error_serves_only_the_callers_own_expired_entry(request, idp, backend, store):
    alice, bob = people(idp, "alice", "bob")
    uri = "who://private/50/stale"
    config = gateway_config([backend], cache_settings(request, store, stale_if_error_ms=600_000), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        await read(c, gw, alice, uri)
        stored_by = int(time.time() * 1000)
        while int(time.time() * 1000) <= stored_by + 50:  # the entry's freshness runs out
            await asyncio.sleep(0.01)
        backend.failing.add(uri)
        response = await post(c, gw, bob, "resources/read", {"uri": uri})
        assert response.json()["error"]["message"] == f"{uri} failed for bob"  # not alice's stale entry
        response = await post(c, gw, alice, "resources/read", {"uri": uri})
        assert response.headers["x-cache"] == "stale"
        assert text(response.json()["result"]) == f"{uri} for alice #1"
        assert response.json()["result"]["ttlMs"] == 0
    assert backend.seen("resources/read", uri) == ["alice", "bob", "alice"]


# -- remembered errors ---------------------------------------------------------------------------


async def test_a_remembered_method_not_found_is_kept_per_principal(request, idp, backend):
    # An error carries no cacheScope: like any answer without an explicit "public", it is only
    # ever reused for the principal it answered (digest §e; docs/cache.md "What is cached").
    alice, bob = people(idp, "alice", "bob")
    backend.no_prompts_for = {"alice"}
    config = gateway_config([backend], cache_settings(request, "memory", negative_ttl_ms=60_000), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        for _ in range(2):
            refused = await post(c, gw, alice, "prompts/list")
            assert "no prompts for alice" in refused.json()["error"]["message"]
        assert backend.seen("prompts/list") == ["alice"]  # remembered for alice
        listed = await post(c, gw, bob, "prompts/list")
        assert listed.status_code == 200, listed.text
        assert [p["name"] for p in listed.json()["result"]["prompts"]] == ["prompt_for_bob"]
    assert backend.seen("prompts/list") == ["alice", "bob"]


# -- without authentication ----------------------------------------------------------------------


@pytest.mark.parametrize("store", list(STORES))
async def test_without_authentication_a_private_answer_is_never_stored(request, backend, store):
    # auth.mode: none cannot tell callers apart; an Authorization header it does not verify is
    # no identity either. Like an HTTP shared cache with `Cache-Control: private`, it must not
    # store the answer at all. Public answers are cached as usual.
    alice, bob = Caller("alice"), Caller("bob")
    made_up = {"authorization": "Bearer made-up"}
    claims = [Caller("carol", made_up), Caller("dave", made_up)]
    uri = "who://private/60000/anonymous"
    config = gateway_config([backend], cache_settings(request, store), None)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        for n, who in enumerate([alice, bob, alice, *claims], start=1):
            result, outcome = await read(c, gw, who, uri)
            assert (outcome, text(result)) == ("miss", f"{uri} for {who.name} #{n}")
            assert (result["cacheScope"], result["ttlMs"]) == ("private", 60_000)  # the client's own to keep
        public = "who://public/60000/anonymous"
        assert [(await read(c, gw, who, public))[1] for who in (alice, bob)] == ["miss", "hit"]
    assert backend.seen("resources/read", uri) == ["alice", "bob", "alice", "carol", "dave"]


async def test_without_authentication_a_private_fetch_in_flight_is_not_shared(request, backend):
    alice, bob = Caller("alice"), Caller("bob")
    uri = "who://private/60000/gated-anonymous"
    config = gateway_config([backend], cache_settings(request, "memory"), None)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        spy = gw.runtime.cache._flights = JoinSpy()
        first = asyncio.create_task(read(c, gw, alice, uri))
        await backend.arrived("resources/read", uri, 1)
        other = asyncio.create_task(read(c, gw, bob, uri))
        await spy.joined(1)
        backend.release(uri)
        (a, _), (b, b_outcome) = await asyncio.gather(first, other)
    assert text(a) == f"{uri} for alice #1"
    assert (b_outcome, text(b)) == ("miss", f"{uri} for bob #2")


@pytest.mark.parametrize("store", ["memory", "layered"])
async def test_without_authentication_a_list_with_a_private_page_is_never_reused(request, store):
    alice, bob = Caller("alice"), Caller("bob")
    async with backends("public", "private") as (alpha, beta):
        config = gateway_config([alpha, beta], cache_settings(request, store), None)
        async with running_gateway(config) as gw, httpx.AsyncClient() as c:
            for who in (alice, alice, bob, alice, bob):
                names, scope, _ = await tools(c, gw, who)
                assert (names, scope) == (["alpha__public_tool", f"beta__tool_for_{who.name}"], "private")
            assert gw.runtime.cache.assembled.reused == 0
    assert beta.seen("tools/list") == ["alice", "alice", "bob", "alice", "bob"]
    assert alpha.seen("tools/list") == ["alice"]


async def test_without_authentication_method_not_found_is_not_remembered(request, backend):
    alice, bob = Caller("alice"), Caller("bob")
    backend.no_prompts_for = {"alice"}
    config = gateway_config([backend], cache_settings(request, "memory", negative_ttl_ms=60_000), None)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        assert "no prompts for alice" in (await post(c, gw, alice, "prompts/list")).json()["error"]["message"]
        listed = await post(c, gw, bob, "prompts/list")
        assert [p["name"] for p in listed.json()["result"]["prompts"]] == ["prompt_for_bob"]
        assert "no prompts for alice" in (await post(c, gw, alice, "prompts/list")).json()["error"]["message"]
    assert backend.seen("prompts/list") == ["alice", "bob", "alice"]


# -- freshness: ttlMs exactly, and what is never stored -----------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.parametrize("window", [0, 600_000], ids=["no-stale-window", "stale-window"])
@pytest.mark.parametrize("store", ["memory", "layered"])
async def test_a_private_entry_is_served_with_its_remaining_ttl_and_never_past_it(
        request, idp, backend, store, window):
    # The local layer keeps copies up to 60 s, and a stale-if-error window keeps entries in
    # every store long after they expire: neither may serve one past its own freshness.
    (alice,) = people(idp, "alice")
    ttl = 1_000
    uri = f"who://private/{ttl}/freshness"
    config = gateway_config([backend], cache_settings(request, store, stale_if_error_ms=window), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        before = now_ms()
        first, outcome = await read(c, gw, alice, uri)
        stored_by = now_ms()  # the entry was stored between `before` and this
        assert (outcome, first["ttlMs"]) == ("miss", ttl)
        hits = 0
        while True:
            asked = now_ms()
            result, outcome = await read(c, gw, alice, uri)
            answered = now_ms()
            if outcome != "hit":
                break
            hits += 1
            assert text(result) == f"{uri} for alice #1"
            # Served only while fresh, and told exactly the freshness left (±1 ms of rounding).
            assert asked <= stored_by + ttl
            assert before + ttl - answered - 1 <= result["ttlMs"] <= stored_by + ttl - asked + 1
            assert result["ttlMs"] > 0
            await asyncio.sleep(0.05)
        assert outcome == "miss" and text(result) == f"{uri} for alice #2"
        assert answered >= before + ttl  # the miss came only once the entry could have expired
        assert hits >= 1


async def test_private_answers_that_must_not_be_stored_are_not(request, idp, backend):
    (alice,) = people(idp, "alice")
    config = gateway_config([backend], cache_settings(request, "memory"), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        # ttlMs 0, and no ttlMs at all (absent reads as 0, default_ttl_ms is 0): never stored.
        for uri in ("who://private/0/zero", "who://private/none/absent"):
            for n in (1, 2):
                result, outcome = await read(c, gw, alice, uri)
                assert (outcome, text(result), result["ttlMs"]) == ("miss", f"{uri} for alice #{n}", 0)
        # input_required is never stored, nor the answer to a retry carrying inputResponses or
        # requestState (spec: they depend on inputs outside the key).
        uri = "who://private/60000/ask"
        for _ in range(2):
            result, outcome = await read(c, gw, alice, uri)
            assert result["resultType"] == "input_required" and outcome != "hit"
            assert "ttlMs" not in result and "cacheScope" not in result
        for retry in ({"inputResponses": {"ok": {"action": "accept", "content": {"ok": True}}}},
                      {"requestState": "state-1"}):
            for _ in range(2):
                result, outcome = await read(c, gw, alice, uri, **retry)
                assert result["resultType"] == "complete" and outcome == "bypass"
        assert (await read(c, gw, alice, uri))[0]["resultType"] == "input_required"
        assert len(backend.seen("resources/read", uri)) == 7
        # An error answer is not stored (only a remembered -32601, when configured).
        for _ in range(2):
            missing = await post(c, gw, alice, "resources/read", {"uri": "who://nowhere"})
            assert missing.json()["error"]["code"] == -32602
        assert len(backend.seen("resources/read", "who://nowhere")) == 2


# -- the key: what shapes an answer is in it, what does not is not -------------------------------


async def test_the_key_holds_what_shapes_the_answer_and_not_what_does_not(request, idp, backend):
    (alice,) = people(idp, "alice")
    uri = "who://private/60000/key"
    config = gateway_config([backend], cache_settings(request, "memory"), idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        assert (await read(c, gw, alice, uri))[1] == "miss"
        # Volatile _meta (trace context, clientInfo) never shapes a result: the same entry.
        for meta in ({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                     {"io.modelcontextprotocol/clientInfo": {"name": "alice-laptop", "version": "2"}}):
            result, outcome = await read(c, gw, alice, uri, meta=meta)
            assert (outcome, text(result)) == ("hit", f"{uri} for alice #1")
        # Client capabilities, any other _meta key, another param: another request.
        variants = [
            ({"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}, {}),
            ({"com.example/tenant": "t1"}, {}),
            (None, {"extra": 1}),
        ]
        for n, (meta, params) in enumerate(variants, start=2):
            result, outcome = await read(c, gw, alice, uri, meta=meta, **params)
            assert (outcome, text(result)) == ("miss", f"{uri} for alice #{n}")
            assert (await read(c, gw, alice, uri, meta=meta, **params))[1] == "hit"


@pytest.mark.parametrize("store", ["memory", "layered"])
async def test_a_key_flood_stays_within_the_stores_bounds(request, idp, backend, store, monkeypatch):
    monkeypatch.setattr(assembled, "MAX_ANSWERS", 8)
    bound = {"max_entries": 16, "max_bytes": 8_192} if store == "memory" else {"local_max_entries": 16,
                                                                              "max_bytes": 8_192}
    (alice,) = people(idp, "alice")
    settings = cache_settings(request, store, **bound)
    config = gateway_config([backend], settings, idp)
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        cache = gw.runtime.cache
        local = cache.store if store == "memory" else cache.store.local
        # Every client-chosen part of the key: URIs, params, _meta keys, principals.
        for i in range(150):
            await read(c, gw, alice, f"who://public/60000/flood-{i}")
        for i in range(100):
            await read(c, gw, alice, "who://private/60000/flood", meta={"com.example/n": i})
        for i in range(30):
            await read(c, gw, Caller(f"user{i}", idp.bearer(f"user{i}")), "who://private/60000/flood")
        for i in range(40):  # each twice: the second is assembled from fresh entries, and kept
            for _ in range(2):
                await post(c, gw, alice, "tools/list", meta={"com.example/n": i})
        assert len(local) <= 16 and local.bytes <= 8_192
        assert len(local._tags) <= 1 + 16  # the backend's tag, plus one per live entry at most
        assert len(cache.assembled._answers) <= 8
        assert len(cache._flights) == 0
        # Still a working cache after the flood.
        after = "who://public/60000/after-the-flood"
        assert [(await read(c, gw, alice, after))[1] for _ in range(2)] == ["miss", "hit"]
        if store != "memory":
            # Redis holds the whole flood, but nothing the gateway wrote lives forever.
            admin = aioredis.from_url(settings["redis_url"])
            try:
                keys = [k async for k in admin.scan_iter(match="{" + f"{settings['key_prefix']}:cache:*")]
                assert len(keys) > 16
                assert all([await admin.pttl(k) > 0 for k in keys])
            finally:
                await admin.aclose()
