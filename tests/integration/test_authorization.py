"""Authorization rules end to end: real RS256 tokens verified against a JWKS served on
loopback, two real scripted backends, the gateway on a real socket, raw HTTP where the test
must see statuses and headers, and the SDK's `mcp.Client` in modern and legacy mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import orjson
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.governance import all_tools, bearer, governed, sdk_tool_names
from tests.support.governance import call_tool as call
from tests.support.scripted import Scripted

PRM_URL = "https://mcp.test/.well-known/oauth-protected-resource/mcp"



def settings(ledger: Scripted, reports: Scripted, jwks_url: str, **extra: Any) -> dict[str, Any]:
    return governed(ledger, reports, jwks_url, **extra)


@pytest.fixture
async def gw(ledger, reports, jwks_url) -> AsyncIterator[Any]:
    async with running_gateway(settings(ledger, reports, jwks_url)) as gw:
        yield gw


async def test_claims_decide_who_may_call_a_backends_tools(gw, issuer):
    finance = issuer.token("fiona", groups=["finance", "staff"])
    engineer = issuer.token("eric", groups=["engineering"])
    async with httpx.AsyncClient() as http:
        allowed = await call(http, gw.url, finance, "ledger__echo", text="hi")
        denied = await call(http, gw.url, engineer, "ledger__echo", text="hi")
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["result"]["content"][0]["text"].startswith("ledger")
    assert denied.status_code == 403
    assert denied.headers["www-authenticate"] == f'Bearer error="insufficient_scope", resource_metadata="{PRM_URL}"'
    error = denied.json()["error"]
    assert error["data"]["rule"] == "default" and error["data"]["name"] == "ledger__echo"
    assert "ledger__echo" in error["message"] and "authorization.default: deny" in error["message"]


async def test_a_deny_rule_is_named_and_first_match_wins(gw, issuer):
    finance = issuer.token("fiona", groups="finance")  # a string claim holds as well as a list
    async with httpx.AsyncClient() as http:
        # no-failing comes before finance-ledger: the deny wins.
        response = await call(http, gw.url, finance, "ledger__fail", code=1, message="x")
    assert response.status_code == 403
    assert response.json()["error"]["data"]["rule"] == "no-failing"
    assert "authorization rule no-failing denies it" in response.json()["error"]["message"]


async def test_the_challenge_names_the_scope_that_would_help(gw, issuer):
    async with httpx.AsyncClient() as http:
        without = await call(http, gw.url, issuer.token("ann"), "reports__slow", seconds=0)
        with_scope = await call(http, gw.url, issuer.token("ann", scope="reports.write"), "reports__slow", seconds=0)
        open_to_all = await call(http, gw.url, issuer.token("ann"), "reports__echo", text="x")
    assert without.status_code == 403
    assert without.headers["www-authenticate"] == (
        f'Bearer error="insufficient_scope", scope="reports.write", resource_metadata="{PRM_URL}"')
    assert without.json()["error"]["data"]["scopes"] == ["reports.write"]
    assert with_scope.status_code == 200, with_scope.text
    assert open_to_all.status_code == 200, open_to_all.text


async def test_decided_from_the_headers_before_the_body_is_read(gw, issuer):
    engineer = issuer.token("eric", groups=["engineering"])
    async with httpx.AsyncClient() as http:
        # A body that is not even JSON: the header phase refuses before anything parses it.
        response = await http.post(gw.url, content=b"{not json", headers={
            **mcp_http.headers("tools/call", "ledger__echo"), **bearer(engineer)})
        # The same body with an allowed name reaches the body phase, which answers its 400.
        parsed = await http.post(gw.url, content=b"{not json", headers={
            **mcp_http.headers("tools/call", "reports__echo"), **bearer(engineer)})
    assert response.status_code == 403
    assert response.json()["error"]["data"]["rule"] == "default"
    assert parsed.status_code == 400


async def test_a_header_that_lies_about_the_name_is_caught_by_the_body(gw, issuer):
    engineer = issuer.token("eric", groups=["engineering"])
    body = mcp_http.body("tools/call", {"name": "ledger__echo", "arguments": {"text": "x"}})
    async with httpx.AsyncClient() as http:
        response = await http.post(gw.url, content=orjson.dumps(body), headers={
            **mcp_http.headers("tools/call", "reports__echo"), **bearer(engineer)})
    # The header phase let the allowed header name through; the body phase holds the header to
    # the body (SHTTP §Server Validation) and refuses, so the denied tool is never called.
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020


async def test_repeated_name_headers_never_reach_a_denied_tool(gw, issuer, ledger):
    """Two Mcp-Name lines (an allowed name and a denied one, either order), whichever name the
    body carries: refused, and the denied backend is never called. The header phase decides
    on the lines combined, the value the body is then held to (SHTTP §Server Validation)."""
    engineer = issuer.token("eric", groups=["engineering"])
    before = len(await ledger.calls("tools/call"))
    async with httpx.AsyncClient() as http:
        for lines in (["reports__echo", "ledger__echo"], ["ledger__echo", "reports__echo"]):
            for body_name in (*lines, ", ".join(lines)):
                body = mcp_http.body("tools/call", {"name": body_name, "arguments": {"text": "x"}})
                headers = [*mcp_http.headers("tools/call").items(), *(("mcp-name", n) for n in lines),
                           *bearer(engineer).items()]
                response = await http.post(gw.url, content=orjson.dumps(body), headers=headers)
                assert response.status_code in (400, 403), (lines, body_name, response.text)
    assert len(await ledger.calls("tools/call")) == before


async def test_resources_are_decided_by_uri(ledger, reports, jwks_url, issuer):
    rules = {"default": "allow", "rules": [
        {"id": "private-docs", "effect": "deny", "uris": ["scripted://ledger/doc-*"],
         "when": {"claims": {"groups": "guests"}}}]}
    config = settings(ledger, reports, jwks_url, authorization=rules)
    config["backends"][0]["resource_prefixes"] = ["scripted://ledger/"]
    guest, staff = issuer.token("g", groups=["guests"]), issuer.token("s", groups=["staff"])
    async with running_gateway(config) as gw, httpx.AsyncClient() as http:
        denied = await mcp_http.post(http, gw.url, "resources/read", {"uri": "scripted://ledger/doc-1"},
                                     extra_headers=bearer(guest))
        allowed = await mcp_http.post(http, gw.url, "resources/read", {"uri": "scripted://ledger/doc-1"},
                                      extra_headers=bearer(staff))
    assert denied.status_code == 403 and denied.json()["error"]["data"]["rule"] == "private-docs"
    assert allowed.status_code == 200, allowed.text


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_sdk_clients_modern_and_legacy(gw, issuer, mode):
    finance = issuer.token("fiona", groups=["finance"])
    engineer = issuer.token("eric", groups=["engineering"])
    async with (
        httpx2.AsyncClient(headers=bearer(finance)) as http,
        Client(streamable_http_client(gw.url, http_client=http), mode=mode, cache=None) as client,
    ):
        result = await client.call_tool("ledger__echo", {"text": "hello"})
        assert not result.is_error and "hello" in result.content[0].text
    async with (
        httpx2.AsyncClient(headers=bearer(engineer)) as http,
        Client(streamable_http_client(gw.url, http_client=http), mode=mode, cache=None) as client,
    ):
        with pytest.raises(MCPError) as refused:
            await client.call_tool("ledger__echo", {"text": "hello"})
        if mode == "legacy":
            # A legacy session answers in the JSON-RPC body (its transport keeps 4xx for itself);
            # the modern SDK reports the 403 without reading its body (the raw tests above do).
            assert "Forbidden" in str(refused.value) and "ledger__echo" in str(refused.value)
        result = await client.call_tool("reports__echo", {"text": "ok"})
        assert not result.is_error


# -- lists show what you may use -------------------------------------------------------------

LEDGER_VISIBLE = ["ledger__ask", "ledger__bare", "ledger__echo", "ledger__flaky_tool", "ledger__gated",
                  "ledger__regional", "ledger__slow"]  # not ledger__fail (no-failing), bad_header_tool never
WRITER_VISIBLE = ["reports__ask", "reports__bare", "reports__echo", "reports__flaky_tool", "reports__gated",
                  "reports__regional", "reports__slow"]


async def test_each_principal_sees_exactly_its_tools(gw, issuer):
    async with httpx.AsyncClient() as http:
        finance, responses = await all_tools(http, gw.url, issuer.token("fiona", groups=["finance"]))
        engineer, _ = await all_tools(http, gw.url, issuer.token("eric", groups=["engineering"]))
        writer, _ = await all_tools(http, gw.url, issuer.token("wes", scope="reports.write"))
    assert finance == sorted([*LEDGER_VISIBLE, "reports__echo"])
    assert engineer == ["reports__echo"]
    assert writer == WRITER_VISIBLE
    assert all(r.json()["result"]["cacheScope"] == "private" for r in responses)


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_sdk_clients_list_only_what_they_may_call(gw, issuer, mode):
    for token, expected in ((issuer.token("fiona", groups=["finance"]), sorted([*LEDGER_VISIBLE, "reports__echo"])),
                            (issuer.token("eric", groups=["engineering"]), ["reports__echo"])):
        async with (
            httpx2.AsyncClient(headers=bearer(token)) as http,
            Client(streamable_http_client(gw.url, http_client=http), mode=mode, cache=None) as client,
        ):
            assert await sdk_tool_names(client) == expected


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_a_cached_list_is_never_handed_to_a_principal_whose_rules_differ(ledger, reports, jwks_url, issuer,
                                                                               store, request):
    cache: dict[str, Any] = {"store": store, "default_ttl_ms": 60_000}
    if store == "redis":
        cache["redis_url"] = request.getfixturevalue("redis_server").url
    config = settings(ledger, reports, jwks_url, cache=cache)
    finance, engineer = issuer.token("fiona", groups=["finance"]), issuer.token("eric", groups=["engineering"])
    async with running_gateway(config) as one, running_gateway(config) as two, httpx.AsyncClient() as http:
        # Finance fills the cache on replica one; the engineer reads it on both, then finance again.
        first, _ = await all_tools(http, one.url, finance)
        for url in (one.url, two.url):
            seen, responses = await all_tools(http, url, engineer)
            assert seen == ["reports__echo"]
        again, responses = await all_tools(http, two.url, finance)
    assert first == again == sorted([*LEDGER_VISIBLE, "reports__echo"])
    assert any(r.headers.get("x-cache") == "hit" for r in responses)  # served from the shared cache


async def test_changed_rules_apply_to_an_answer_already_cached(ledger, reports, jwks_url, issuer, redis_server):
    cache = {"store": "redis", "redis_url": redis_server.url, "default_ttl_ms": 60_000}
    finance = issuer.token("fiona", groups=["finance"])
    async with running_gateway(settings(ledger, reports, jwks_url, cache=cache)) as gw, httpx.AsyncClient() as http:
        before, _ = await all_tools(http, gw.url, finance)
    tightened = {"default": "deny", "rules": [{"effect": "allow", "names": ["ledger__echo"]}]}
    async with running_gateway(settings(ledger, reports, jwks_url, cache=cache, authorization=tightened)) as gw, \
            httpx.AsyncClient() as http:
        after, responses = await all_tools(http, gw.url, finance)
    assert "ledger__slow" in before and after == ["ledger__echo"]
    assert any(r.headers.get("x-cache") == "hit" for r in responses)
