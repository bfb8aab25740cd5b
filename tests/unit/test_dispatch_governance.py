"""The dispatcher's governance seams that need no network: a listen stream loses the
`resources/updated` notifications its caller may not read, and nothing else."""

from __future__ import annotations

from typing import Any

from gateway.dispatch import _VisibleNotifications


class Stream:
    cancel_safe_next = True

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self.closed = False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self.messages:
            raise StopAsyncIteration
        return self.messages.pop(0)

    async def aclose(self) -> None:
        self.closed = True


def updated(uri: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}


async def test_updates_for_unreadable_uris_are_not_delivered():
    listed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {}}
    inner = Stream([updated("x://public/a"), updated("x://secret/b"), listed, updated("x://public/c"),
                    {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {}}])
    visible = _VisibleNotifications(inner, lambda uri: isinstance(uri, str) and "secret" not in uri)
    seen = [m async for m in visible]
    assert seen == [updated("x://public/a"), listed, updated("x://public/c")]
    assert visible.cancel_safe_next
    await visible.aclose()
    assert inner.closed


# -- fuzz: whatever the rules, a denied name is never listed nor callable, and a cached list is
# -- never handed to a principal whose rules differ --------------------------------------------

import asyncio  # noqa: E402

import orjson  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gateway.cache.factory import build_cache  # noqa: E402
from gateway.dispatch import Dispatcher  # noqa: E402
from gateway.policies.authorization import RuleSet  # noqa: E402
from gateway.protocol import jsonrpc as rpc  # noqa: E402
from gateway.protocol.principal import Principal  # noqa: E402
from gateway.protocol.request import parse_call  # noqa: E402
from gateway.routing.table import RouteTable, Target  # noqa: E402
from gateway.routing.views import views_of  # noqa: E402
from gateway.settings import CacheSettings, ConfigError, load_settings  # noqa: E402
from tests.support.fake_backend import FakeBackend, answers, discover_result  # noqa: E402

TOOL_NAMES = ["get_a", "get_b", "delete_c", "search", "x"]
GLOBS = ["*", "a__*", "b__*", "*__get_*", "*__delete_*", "a__x", "b__sea?ch", "*_[ab]"]
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
JWT = {"mode": "jwt", "issuer": "https://idp.test", "audience": "https://mcp.test/mcp", "hs256_secret": "x" * 32,
       "authorization_servers": ["https://idp.test"], "claims": ["groups"]}
rules = st.lists(st.fixed_dictionaries(
    {"effect": st.sampled_from(["allow", "deny"])},
    optional={"names": st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2),
              "backends": st.sampled_from([["a"], ["b"], ["a", "b"]]),
              "when": st.fixed_dictionaries({}, optional={
                  "claims": st.fixed_dictionaries({"groups": st.sampled_from(["fin", "eng"])}),
                  "scopes": st.lists(st.sampled_from(["s1", "s2"]), min_size=1, max_size=1)})}), max_size=5)
principals = st.lists(st.builds(
    lambda sub, g, s: Principal(sub, "https://idp.test", authenticated=True, scopes=frozenset(s),
                                claims={"groups": g} if g else {}),
    st.sampled_from(["p1", "p2", "p3"]), st.sampled_from([None, "fin", "eng", ["fin", "eng"]]),
    st.lists(st.sampled_from(["s1", "s2"]), max_size=2)), min_size=2, max_size=4)


def request(method: str, principal: Principal, **params: Any) -> Any:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 5, "method": method, "params": {**params, "_meta": META}})
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    return parse_call(body, headers, principal)


def backend(name: str) -> FakeBackend:
    return FakeBackend(answers({
        "server/discover": discover_result({"tools": {}}),
        "tools/list": {"tools": [{"name": t, "inputSchema": {"type": "object"}} for t in TOOL_NAMES],
                       "resultType": "complete", "ttlMs": 60_000, "cacheScope": "public"},
        "tools/call": lambda call: {"content": [{"type": "text", "text": "ok"}], "resultType": "complete"},
    }), name=name)


async def fleet_and_cache() -> tuple[FakeBackend, FakeBackend, Any]:
    """Backends a and b, discovered, and a started memory cache."""
    a, b = backend("a"), backend("b")
    for fake in (a, b):
        await fake.discover()
    cache = build_cache(CacheSettings(store="memory"))
    await cache.start()
    return a, b, cache


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(section=rules, default=st.sampled_from(["allow", "deny"]), callers=principals)
def test_fuzz_denied_names_are_never_listed_or_callable_and_cuts_never_cross(section, default, callers):
    try:
        config = load_settings(None, auth=JWT, authorization={"default": default, "rules": section},
                               backends=[{"name": "a", "url": "http://127.0.0.1:1/a"},
                                         {"name": "b", "url": "http://127.0.0.1:1/b"}])
    except ConfigError:
        assume(False)  # check-config refuses rules that can never match (tested elsewhere)
    ruleset = RuleSet.from_settings(config)

    async def run() -> None:
        a, b, cache = await fleet_and_cache()
        dispatcher = Dispatcher(RouteTable([Target(a, "a__"), Target(b, "b__")]), cache=cache, rules=ruleset)
        every = [f"{p}__{t}" for p in ("a", "b") for t in TOOL_NAMES]
        for principal in callers * 2:  # twice: the second round is served from the cache
            listed = {t["name"] for t in (await dispatcher.dispatch(request("tools/list", principal))
                                          ).message["result"]["tools"]}
            allowed = {n for n in every if ruleset is None or ruleset.allows(
                principal, "tools/call", name=n, backend=n.split("__")[0])}
            assert listed == allowed, (principal, listed, allowed)
            for name in every:
                if name in allowed:
                    reply = await dispatcher.dispatch(request("tools/call", principal, name=name, arguments={}))
                    assert "result" in reply.message
                else:
                    with pytest.raises(rpc.McpError) as refused:
                        await dispatcher.dispatch(request("tools/call", principal, name=name, arguments={}))
                    assert refused.value.status == 403
        assert len(a.methods) - a.methods.count("tools/call") <= 3  # discover + pages: the cache served
        await cache.aclose()

    asyncio.run(run())


views = st.fixed_dictionaries({}, optional={
    "backends": st.sampled_from([["a"], ["b"], ["a", "b"]]),
    "names": st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2),
    "authorization": st.fixed_dictionaries({"rules": rules}, optional={"default": st.sampled_from(["allow", "deny"])}),
})


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(section=rules, default=st.sampled_from(["allow", "deny"]), view=views, callers=principals)
def test_fuzz_views_show_and_call_only_their_names_and_cuts_never_cross_paths(section, default, view, callers):
    """Whatever the global rules and the view (backends, names, its own rules), through the view a
    name outside it or denied by either rule set is never listed and never callable; the main
    path, sharing the cache and its kept answers, still shows exactly what the global rules allow."""
    try:
        config = load_settings(None, auth=JWT, authorization={"default": default, "rules": section},
                               backends=[{"name": "a", "url": "http://127.0.0.1:1/a"},
                                         {"name": "b", "url": "http://127.0.0.1:1/b"}],
                               views=[{"path": "/v", **view}])
    except ConfigError:
        assume(False)  # check-config refuses what can never match (tested in test_routing_views.py)
    ruleset = RuleSet.from_settings(config)
    (compiled,) = views_of(config)

    def allowed_by(rule_set: RuleSet | None, principal: Principal, name: str) -> bool:
        return rule_set is None or rule_set.allows(principal, "tools/call", name=name, backend=name.split("__")[0])

    async def run() -> None:
        a, b, cache = await fleet_and_cache()
        table = RouteTable([Target(a, "a__"), Target(b, "b__")])
        main = Dispatcher(table, cache=cache, rules=ruleset)
        through_view = Dispatcher(table, cache=cache, rules=ruleset, view=compiled)
        every = [f"{p}__{t}" for p in ("a", "b") for t in TOOL_NAMES]
        for principal in callers * 2:  # twice: the second round is served from the cache
            globally = {n for n in every if allowed_by(ruleset, principal, n)}
            in_view = {n for n in every if compiled.shows_backend(n.split("__")[0]) and compiled.shows_name(n)}
            expected = {n for n in globally & in_view if allowed_by(compiled.rules, principal, n)}
            for dispatcher, allowed in ((through_view, expected), (main, globally)):
                listed = {t["name"] for t in (await dispatcher.dispatch(request("tools/list", principal))
                                              ).message["result"]["tools"]}
                assert listed == allowed, (dispatcher is main, principal, listed, allowed)
            for name in every:
                call = request("tools/call", principal, name=name, arguments={})
                if name in expected:
                    assert "result" in (await through_view.dispatch(call)).message
                    continue
                with pytest.raises(rpc.McpError) as refused:
                    await through_view.dispatch(call)
                # Outside the view: unknown (-32602), unless a rule refused it first (403).
                assert (refused.value.status, refused.value.code) in ((403, rpc.INVALID_REQUEST),
                                                                      (400, rpc.INVALID_PARAMS))
                if name in globally and name not in in_view:
                    assert refused.value.code == rpc.INVALID_PARAMS  # never refused by the view's rules
        await cache.aclose()

    asyncio.run(run())


# -- the request's record (observability/record.py) notes what governance decided -------------

from gateway.observability.record import CURRENT, RequestRecord  # noqa: E402
from gateway.policies.ratelimit import RateLimits  # noqa: E402


async def test_the_request_record_notes_a_refusal_decided_in_the_dispatcher():
    config = load_settings(None, auth=JWT, backends=[{"name": "a", "url": "http://127.0.0.1:1/a"}],
                           authorization={"rules": [{"effect": "deny", "names": ["a__delete_*"]}]},
                           rate_limits=[{"rate": "1/h", "burst": 1, "key": ["principal"], "methods": ["tools/call"]}])
    a = backend("a")
    await a.discover()
    dispatcher = Dispatcher(RouteTable([Target(a, "a__")]), rules=RuleSet.from_settings(config),
                            rate_limits=RateLimits.from_settings(config))
    alice = Principal("alice", "https://idp.test", authenticated=True)
    await dispatcher.dispatch(request("tools/list", alice))  # the route table learns the tools

    async def dispatched(name: str) -> tuple[RequestRecord, Any]:
        record = RequestRecord("rid", 0.0, "modern", {})
        token = CURRENT.set(record)
        try:
            return record, await dispatcher.dispatch(request("tools/call", alice, name=name, arguments={}))
        except rpc.McpError as exc:
            return record, exc
        finally:
            CURRENT.reset(token)

    record, denied = await dispatched("a__delete_c")
    assert isinstance(denied, rpc.McpError) and denied.status == 403
    assert (record.method, record.name, record.code) == ("tools/call", "a__delete_c", denied.code)
    assert record.backend is None and a.methods.count("tools/call") == 0  # never reached the backend

    record, reply = await dispatched("a__get_a")
    assert "result" in reply.message
    assert (record.backend, record.tool_label, record.code) == ("a", "a__get_a", None)

    record, limited = await dispatched("a__get_b")  # the one call an hour was spent
    assert isinstance(limited, rpc.McpError) and limited.status == 429
    assert record.code == limited.code and a.methods.count("tools/call") == 1
