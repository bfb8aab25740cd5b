"""Views (virtual servers) end to end: real RS256 tokens verified against a JWKS on loopback,
the two scripted backends as real processes, the gateway on a real socket; raw HTTP where the
test must see statuses, and the SDK's `mcp.Client` in legacy mode on a view's path. Each view
is a complete MCP endpoint over the same fleet: discover, lists (paged through the gateway
cursor), calls, listen, initialize-era sessions and /sse; its own rules on top of the global
ones; its answers never served on another path or to another principal, in memory and in a
Redis shared by two replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.support import mcp_http
from tests.support.broadcast_backend import served
from tests.support.gateway import running_gateway
from tests.support.governance import all_tools, bearer, governed, sdk_tool_names
from tests.support.governance import call_tool as call
from tests.support.listen import ListenReader, eventually
from tests.support.scripted import Scripted

VIEWS = [
    {"path": "/mcp/finance", "backends": ["ledger", "reports"], "names": ["ledger__*", "reports__echo", "reports__slow"],
     "authorization": {"rules": [{"id": "no-slow-here", "effect": "deny", "names": ["*__slow"]}]}},
    {"path": "/mcp/reports", "backends": ["reports"]},
]

LEDGER = ["ledger__ask", "ledger__bare", "ledger__echo", "ledger__flaky_tool", "ledger__gated", "ledger__regional",
          "ledger__slow"]  # what finance may call of ledger (not ledger__fail; bad_header_tool is never listed)
REPORTS = ["reports__ask", "reports__bare", "reports__echo", "reports__flaky_tool", "reports__gated",
           "reports__regional", "reports__slow"]
# Who sees what, where: the global rules, the view's backends and names, the view's own rules.
EXPECTED = {
    "finance": {"/mcp": sorted([*LEDGER, "reports__echo"]),
                "/mcp/finance": sorted([*(n for n in LEDGER if n != "ledger__slow"), "reports__echo"]),
                "/mcp/reports": ["reports__echo"]},
    "engineer": {"/mcp": ["reports__echo"], "/mcp/finance": ["reports__echo"], "/mcp/reports": ["reports__echo"]},
    "writer": {"/mcp": REPORTS, "/mcp/finance": ["reports__echo"], "/mcp/reports": REPORTS},
}


def settings(ledger: Scripted, reports: Scripted, jwks_url: str, **extra: Any) -> dict[str, Any]:
    return governed(ledger, reports, jwks_url, views=VIEWS, **extra)


def tokens(issuer: Any) -> dict[str, str]:
    return {"finance": issuer.token("fiona", groups=["finance"]),
            "engineer": issuer.token("eric", groups=["engineering"]),
            "writer": issuer.token("wes", scope="reports.write")}


@pytest.fixture
async def gw(ledger, reports, jwks_url) -> AsyncIterator[Any]:
    async with running_gateway(settings(ledger, reports, jwks_url)) as gw:
        yield gw


async def test_each_principal_sees_exactly_its_tools_on_each_path(gw, issuer):
    async with httpx.AsyncClient() as http:
        for who, token in tokens(issuer).items():
            for path, expected in EXPECTED[who].items():
                seen, responses = await all_tools(http, gw.base + path, token)
                assert seen == expected, (who, path)
                assert all(r.json()["result"]["cacheScope"] == "private" for r in responses)


async def test_calls_outside_the_view_are_unknown_and_its_own_rules_refuse(gw, issuer):
    finance, writer = tokens(issuer)["finance"], tokens(issuer)["writer"]
    async with httpx.AsyncClient() as http:
        inside = await call(http, gw.base + "/mcp/finance", finance, "ledger__echo", text="hi")
        # Allowed by the global rules, but not among the view's names / backends: unknown.
        outside_names = await call(http, gw.base + "/mcp/finance", writer, "reports__ask", text="x")
        allowed_elsewhere = await call(http, gw.base + "/mcp/reports", writer, "reports__ask", text="x")
        outside_backends = await call(http, gw.base + "/mcp/reports", finance, "ledger__echo", text="hi")
        # In the view and allowed globally, refused by the view's own rule.
        view_rule = await call(http, gw.base + "/mcp/finance", finance, "ledger__slow", seconds=0)
        on_main = await call(http, gw.url, finance, "ledger__slow", seconds=0)
    assert inside.status_code == 200, inside.text
    assert inside.json()["result"]["content"][0]["text"].startswith("ledger")
    for response, name in ((outside_names, "reports__ask"), (outside_backends, "ledger__echo")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == -32602 and f"Unknown tool: {name!r}" in error["message"]
    assert allowed_elsewhere.status_code == 200, allowed_elsewhere.text
    assert view_rule.status_code == 403
    assert view_rule.json()["error"]["data"]["rule"] == "no-slow-here"
    assert view_rule.headers["www-authenticate"].startswith('Bearer error="insufficient_scope"')
    assert on_main.status_code == 200, on_main.text  # the view's rules bind the view only


async def test_discover_and_other_lists_are_the_views(gw, issuer):
    writer = tokens(issuer)["writer"]
    async with httpx.AsyncClient() as http:
        discover = await mcp_http.post(http, gw.base + "/mcp/reports", "server/discover", extra_headers=bearer(writer))
        prompts = await mcp_http.post(http, gw.base + "/mcp/reports", "prompts/list", extra_headers=bearer(writer))
        resources = await mcp_http.post(http, gw.base + "/mcp/reports", "resources/list",
                                        extra_headers=bearer(writer))
    assert discover.status_code == 200, discover.text
    assert "tools" in discover.json()["result"]["capabilities"]
    # Only the reports backend's items (global rules allow no prompt get / resource read here).
    assert prompts.status_code == 200 and resources.status_code == 200
    assert all(p["name"].startswith("reports__") for p in prompts.json()["result"]["prompts"])
    assert all("ledger" not in r["uri"] for r in resources.json()["result"]["resources"])


async def test_a_legacy_client_on_a_view(gw, issuer):
    for who, token in tokens(issuer).items():
        async with (
            httpx2.AsyncClient(headers=bearer(token)) as http,
            Client(streamable_http_client(gw.base + "/mcp/finance", http_client=http), mode="legacy",
                   cache=None) as client,
        ):
            assert await sdk_tool_names(client) == EXPECTED[who]["/mcp/finance"], who
            if who == "finance":
                result = await client.call_tool("ledger__echo", {"text": "hello"})
                assert not result.is_error and "hello" in result.content[0].text
            if who == "writer":
                # Allowed by the global rules, outside the view's names: unknown.
                with pytest.raises(MCPError) as unknown:
                    await client.call_tool("reports__ask", {"text": "x"})
                assert "Unknown tool" in str(unknown.value)


@pytest.mark.parametrize("sessions", ["memory", "fleet"])
async def test_a_views_legacy_session_means_nothing_on_another_path(ledger, reports, jwks_url, issuer, sessions,
                                                                     request):
    """In memory each path keeps its own sessions; shared by the fleet (security.secret +
    Redis) a view's session ids are sealed with a key of their own and kept under keys of
    their own, so a sealed id any replica would accept is still a stranger on another path."""
    extra: dict[str, Any] = {}
    if sessions == "fleet":
        extra = {"security": {"secret": "s" * 32}, "redis": {"url": request.getfixturevalue("redis_server").url}}
    async with running_gateway(settings(ledger, reports, jwks_url, **extra)) as gw:
        await _session_stays_on_its_path(gw, tokens(issuer)["finance"])


async def _session_stays_on_its_path(gw: Any, finance: str) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream", **bearer(finance)}
    async with httpx.AsyncClient() as http:
        opened = await http.post(gw.base + "/mcp/finance", json=init, headers=headers)
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        elsewhere = await http.post(gw.url, json=listing, headers={**headers, "mcp-session-id": session,
                                                                    "mcp-protocol-version": "2025-06-18"})
        here = await http.post(gw.base + "/mcp/finance", json=listing,
                               headers={**headers, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"})
    assert opened.status_code == 200, opened.text
    assert elsewhere.status_code == 404  # the main path never issued it
    assert here.status_code == 200, here.text


async def test_sse_transport_on_a_view(gw, issuer):
    """The HTTP+SSE transport (2024-11-05) on `<view>/sse`: the endpoint event names the view's
    own messages path, and what it lists is the view's."""
    finance = tokens(issuer)["finance"]
    async with httpx.AsyncClient(timeout=20) as http, \
            http.stream("GET", gw.base + "/mcp/finance/sse", headers=bearer(finance)) as stream:
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        endpoint = None
        async for line in lines:
            if line.startswith("data:"):
                endpoint = line.removeprefix("data:").strip()
                break
        assert endpoint is not None and endpoint.startswith("/mcp/finance/sse/messages?session_id=")
        post = gw.base + endpoint
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        assert (await http.post(post, json=init, headers=bearer(finance))).status_code == 202
        answers = []
        async for line in lines:
            if line.startswith("data:"):
                answers.append(mcp_http.orjson.loads(line.removeprefix("data:")))
                if len(answers) == 1:
                    await http.post(post, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                    headers=bearer(finance))
                    await http.post(post, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
                                    headers=bearer(finance))
                elif len(answers) == 2:
                    break
    names = sorted(t["name"] for t in answers[1]["result"]["tools"])
    # One page: an initialize-era client gets the whole list.
    assert set(names) <= set(EXPECTED["finance"]["/mcp/finance"]) and "ledger__slow" not in names
    assert "ledger__echo" in names


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_cached_answers_stay_on_their_path_and_principal(ledger, reports, jwks_url, issuer, store, request):
    cache: dict[str, Any] = {"store": store, "default_ttl_ms": 60_000}
    if store == "redis":
        cache["redis_url"] = request.getfixturevalue("redis_server").url
    config = settings(ledger, reports, jwks_url, cache=cache)
    who = tokens(issuer)
    async with running_gateway(config) as one, running_gateway(config) as two, httpx.AsyncClient() as http:
        replicas = (one, two) if store == "redis" else (one, one)
        # Each principal on each path, in an order that has every answer cached by another
        # principal or on another path (and, with Redis, on the other replica) first.
        hits = []
        for round_ in range(2):
            for path in ("/mcp/finance", "/mcp", "/mcp/reports"):
                for name in ("writer", "finance", "engineer"):
                    gw = replicas[round_]
                    seen, responses = await all_tools(http, gw.base + path, who[name])
                    assert seen == EXPECTED[name][path], (round_, path, name)
                    hits += [r.headers.get("x-cache") for r in responses]
    assert "hit" in hits  # answered from the cache, shared across paths and replicas, cut per caller


async def test_cursor_from_the_main_path_shows_only_the_views_backends(gw, issuer):
    writer = tokens(issuer)["writer"]
    async with httpx.AsyncClient() as http:
        first = await mcp_http.post(http, gw.url, "tools/list", extra_headers=bearer(writer))
        cursor = first.json()["result"]["nextCursor"]
        names: list[str] = []
        for _ in range(50):
            page = await mcp_http.post(http, gw.base + "/mcp/reports", "tools/list", {"cursor": cursor},
                                       extra_headers=bearer(writer))
            assert page.status_code == 200, page.text
            names += [t["name"] for t in page.json()["result"]["tools"]]
            cursor = page.json()["result"].get("nextCursor")
            if cursor is None:
                break
    assert names and all(n.startswith("reports__") for n in names)


# -- listen: a view hears its own backends' list changes only ----------------------------------

TOOLS = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"


leaky = served  # a BroadcastBackend on a loopback socket (tests/support/broadcast_backend.py)


async def test_listen_through_a_view_hears_only_its_backends():
    async with leaky("inside") as (inside, inside_url), leaky("outside") as (outside, outside_url):
        config = {"backends": [{"name": "inside", "url": inside_url, "era": "modern", "resource_prefixes": ["in://"]},
                               {"name": "outside", "url": outside_url, "era": "modern",
                                "resource_prefixes": ["out://"]}],
                  "views": [{"path": "/mcp/inside", "backends": ["inside"]}],
                  "subscriptions": {"linger_seconds": 0.2}}
        async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
            view = await ListenReader(http, gw.base + "/mcp/inside",
                                      {"toolsListChanged": True, "resourceSubscriptions": ["in://a", "out://a"]},
                                      id="view").open()
            main = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="main").open()
            assert view.status == 200 and main.status == 200
            # The view's listen asked no upstream listen of the backend outside it.
            assert all(f.get("resourceSubscriptions") != ["out://a"] for f in outside.filters)
            assert view.ack["params"]["notifications"].get("resourceSubscriptions") == ["in://a"]
            await eventually(lambda: inside.open_listens >= 1 and outside.open_listens >= 1)
            outside.broadcast(TOOLS)
            outside.broadcast(UPDATED, {"uri": "out://a"})
            await main.wait_count(2)  # the ack, then outside's list change: the main path hears it
            inside.broadcast(TOOLS)
            inside.broadcast(UPDATED, {"uri": "in://a"})
            await main.wait_count(3)
            await view.wait_count(3)
            # Another round from outside, heard on the main path, after the view's: had the
            # view been attached to outside's stream, it would have had both rounds by now.
            outside.broadcast(TOOLS)
            await main.wait_count(4)
            await view.close()
            await main.close()
    got = view.notifications
    assert [n["method"] for n in got] == [TOOLS, UPDATED]
    assert got[1]["params"]["uri"] == "in://a"


async def test_a_reload_never_extends_a_views_listen_beyond_its_backends():
    """A backend a reload adds: the main path's listen is attached to it and told its lists
    changed; a view's listen (not among its backends) hears neither that nor the new backend."""
    from gateway.reload.reloader import Reloader
    from gateway.settings import load_settings

    async with leaky("inside") as (inside, inside_url), leaky("added") as (added, added_url):
        def config(*extra: dict[str, Any]) -> Any:
            return load_settings(None, backends=[
                {"name": "inside", "url": inside_url, "era": "modern", "prefix": "in__"}, *extra],
                views=[{"path": "/mcp/inside", "backends": ["inside"]}], subscriptions={"linger_seconds": 0.2})

        first = config()
        source = {"next": first}
        async with running_gateway(first) as gw, httpx.AsyncClient(timeout=30) as http:
            reloader = Reloader(gw.runtime, lambda: source["next"])
            view = await ListenReader(http, gw.base + "/mcp/inside", {"toolsListChanged": True}, id="view").open()
            main = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="main").open()
            source["next"] = config({"name": "added", "url": added_url, "era": "modern", "prefix": "add__"})
            assert await reloader.reload("test") == "applied"
            await main.wait_count(2)  # told: the reload added a backend with tools
            await eventually(lambda: added.open_listens >= 1)
            added.broadcast(TOOLS)
            await main.wait_count(3)
            inside.broadcast(TOOLS)  # after the others: the view's first and only notification
            await main.wait_count(4)
            await view.wait_count(2)
            await view.close()
            await main.close()
            listed = await mcp_http.post(http, gw.base + "/mcp/inside", "tools/list")
    assert [n["method"] for n in view.notifications] == [TOOLS]
    assert [n["method"] for n in main.notifications] == [TOOLS, TOOLS, TOOLS]
    assert all(not t["name"].startswith("add__") for t in listed.json()["result"]["tools"])


async def test_mrtr_through_a_view(gw, issuer):
    """A multi-round-trip call on a view: input_required, then the retry with its inputs and
    the backend's requestState, both answered through the view; the same retry naming a tool
    outside the view is unknown."""
    finance = tokens(issuer)["finance"]
    view = gw.base + "/mcp/finance"
    async with httpx.AsyncClient() as http:
        first = await call(http, view, finance, "ledger__ask")
        asked = first.json()["result"]
        assert first.status_code == 200 and asked["resultType"] == "input_required", first.text
        retry = {"name": "ledger__ask", "arguments": {}, "requestState": asked["requestState"],
                 "inputResponses": {"answer": {"action": "accept", "content": {"value": "42"}}}}
        done = await mcp_http.post(http, view, "tools/call", retry, extra_headers=bearer(finance))
        outside = await mcp_http.post(http, gw.base + "/mcp/reports", "tools/call", retry,
                                      extra_headers=bearer(finance))
    assert done.status_code == 200, done.text
    assert done.json()["result"]["content"][0]["text"] == "ledger got 42"
    assert outside.status_code == 400 and outside.json()["error"]["code"] == -32602


async def test_a_view_is_behind_the_same_pipeline(ledger, reports, jwks_url, issuer):
    """Origin, authentication and rate limits guard a view as they guard the main path; its
    protected-resource metadata is served at the view's path-inserted form too."""
    limits = [{"id": "per-caller", "rate": "2/m", "burst": 2, "key": ["principal"], "methods": ["tools/call"]}]
    config = settings(ledger, reports, jwks_url, rate_limits=limits)
    finance = tokens(issuer)["finance"]
    view = "/mcp/finance"
    async with running_gateway(config) as gw, httpx.AsyncClient() as http:
        anonymous = await mcp_http.post(http, gw.base + view, "tools/list")
        foreign = await mcp_http.post(http, gw.base + view, "tools/list",
                                      extra_headers={**bearer(finance), "origin": "https://evil.example"})
        metadata = await http.get(gw.base + "/.well-known/oauth-protected-resource" + view)
        # One bucket for both paths: the limit counts calls, whichever door they came in by.
        answers = [await call(http, url, finance, "ledger__echo", text="x") for url in (gw.url, gw.base + view,
                                                                                          gw.base + view)]
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
    assert foreign.status_code == 403
    assert metadata.status_code == 200 and metadata.json()["resource"]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["error"]["data"]["limit"] == "per-caller" and "retry-after" in answers[2].headers
