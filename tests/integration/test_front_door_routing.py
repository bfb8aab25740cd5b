"""Routing and aggregation over real HTTP: several scripted backends that page their lists two
items at a time, behind one gateway on loopback (digest §j "Aggregating", §g, PAGE)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import refused_url
from tests.support.scripted import Scripted
from tests.fixtures.servers.scripted_modern import PROMPTS, TOOLS

# What the gateway should offer of a scripted backend's tools: the invalid annotation is dropped.
OFFERED_TOOLS = [t["name"] for t in TOOLS if t["name"] != "bad_header_tool"]


@pytest.fixture(scope="module")
def beta() -> Iterator[Scripted]:
    server = Scripted("beta", page_size=3).start()
    yield server
    server.stop()


@pytest.fixture
def fleet(alpha, beta) -> dict[str, Any]:
    return {"backends": [{"name": "alpha", "url": alpha.url}, {"name": "beta", "url": beta.url}]}


@pytest.fixture
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=15) as c:
        yield c


async def walk(client: httpx.AsyncClient, url: str, method: str, key: str) -> tuple[list[Any], list[dict]]:
    """Every item of an aggregated list, following the gateway cursor; also the pages."""
    items: list[Any] = []
    pages: list[dict] = []
    cursor = None
    for _ in range(50):
        response = await mcp_http.post(client, url, method, {"cursor": cursor} if cursor else {})
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        pages.append(result)
        items += result[key]
        cursor = result.get("nextCursor")
        if cursor is None:
            return items, pages
    raise AssertionError("the gateway cursor never ran out")


# -- aggregation -----------------------------------------------------------------------------


async def test_tools_list_merges_every_page_of_every_backend_prefixed(fleet, client):
    async with running_gateway(fleet) as gw:
        tools, pages = await walk(client, gw.url, "tools/list", "tools")
        names = [t["name"] for t in tools]
        assert sorted(names) == sorted([f"alpha__{n}" for n in OFFERED_TOOLS] + [f"beta__{n}" for n in OFFERED_TOOLS])
        assert len(names) == len(set(names))
        # Each gateway page holds one page per backend still paging (alpha pages by 2, beta by 3),
        # in fleet order; a backend that ran out is no longer asked.
        first = [t["name"] for t in pages[0]["tools"]]
        assert first == ["alpha__echo", "alpha__gated", "beta__echo", "beta__gated", "beta__slow"]
        for page in pages:
            assert page["resultType"] == "complete"
            assert page["cacheScope"] in ("public", "private") and page["ttlMs"] >= 0
        # Deterministic: the same walk gives the same order.
        again, _ = await walk(client, gw.url, "tools/list", "tools")
        assert [t["name"] for t in again] == names


async def test_gateway_cursor_carries_each_backends_own_cursor(fleet, client, alpha, beta):
    async with running_gateway(fleet) as gw:
        response = await mcp_http.post(client, gw.url, "tools/list")
        cursor = response.json()["result"]["nextCursor"]
        decoded = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        assert decoded["p"] == {"alpha": "tools:2", "beta": "tools:3"}
        # And the backends receive their own cursors back, unchanged.
        await mcp_http.post(client, gw.url, "tools/list", {"cursor": cursor}, id="page-2")
        for backend, own in ((alpha, "tools:2"), (beta, "tools:3")):
            (seen,) = [c for c in await backend.calls("tools/list") if c["id"] == "page-2"]
            assert seen["params"] == {"cursor": own}


async def test_prompts_resources_and_templates_are_merged(fleet, client):
    async with running_gateway(fleet) as gw:
        prompts, _ = await walk(client, gw.url, "prompts/list", "prompts")
        assert [p["name"] for p in prompts if p["name"].startswith("alpha__")] == [
            f"alpha__{p['name']}" for p in PROMPTS]
        assert len(prompts) == 2 * len(PROMPTS)
        resources, _ = await walk(client, gw.url, "resources/list", "resources")
        # URIs are not renamed: they already say where they live.
        assert sorted(r["uri"] for r in resources) == sorted(
            f"scripted://{b}/doc-{i}" for b in ("alpha", "beta") for i in range(3))
        templates, _ = await walk(client, gw.url, "resources/templates/list", "resourceTemplates")
        assert sorted(t["uriTemplate"] for t in templates) == [
            "scripted://alpha/items/{id}", "scripted://beta/items/{id}"]


@pytest.mark.parametrize("cursor", ["not-a-cursor!", "", "eyJ2Ijo5OX0", 42])
async def test_invalid_cursor_is_invalid_params(fleet, client, cursor):
    async with running_gateway(fleet) as gw:
        response = await mcp_http.post(client, gw.url, "tools/list", {"cursor": cursor})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == -32602


async def test_cursor_of_another_list_is_refused(fleet, client):
    async with running_gateway(fleet) as gw:
        prompts = await mcp_http.post(client, gw.url, "prompts/list")
        cursor = prompts.json()["result"]["nextCursor"]
        response = await mcp_http.post(client, gw.url, "tools/list", {"cursor": cursor})
        assert response.json()["error"]["code"] == -32602


async def test_a_dead_backend_is_left_out_of_lists(alpha, client):
    dead = refused_url()
    settings = {"backends": [{"name": "alpha", "url": alpha.url}, {"name": "gone", "url": dead, "retries": 0}]}
    async with running_gateway(settings) as gw:
        tools, _ = await walk(client, gw.url, "tools/list", "tools")
        assert sorted(t["name"] for t in tools) == sorted(f"alpha__{n}" for n in OFFERED_TOOLS)
        discover = (await mcp_http.post(client, gw.url, "server/discover")).json()["result"]
        assert "tools" in discover["capabilities"]


async def test_a_late_backend_is_left_out_of_lists(alpha, client):
    slow = Scripted("slow", list_delay=30).start()
    try:
        settings = {"backends": [{"name": "alpha", "url": alpha.url},
                                 {"name": "slow", "url": slow.url, "list_timeout_seconds": 0.3}]}
        async with running_gateway(settings, discover=False) as gw:
            response = await mcp_http.post(client, gw.url, "prompts/list")
            assert response.status_code == 200, response.text
            names = [p["name"] for p in response.json()["result"]["prompts"]]
            assert names and all(n.startswith("alpha__") for n in names)
    finally:
        slow.stop()


async def test_every_backend_failing_is_an_error_naming_them(client):
    settings = {"backends": [{"name": "one", "url": refused_url(), "retries": 0},
                             {"name": "two", "url": refused_url(), "retries": 0}]}
    async with running_gateway(settings) as gw:
        response = await mcp_http.post(client, gw.url, "tools/list")
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == -31001  # gateway-made: outside the reserved range
        assert error["data"]["backends"] == ["one", "two"]
        assert "one" in error["message"] and "two" in error["message"]


async def test_discover_is_answered_by_the_gateway_with_merged_capabilities(fleet, client):
    async with running_gateway(fleet) as gw:
        response = await mcp_http.post(client, gw.url, "server/discover")
        result = response.json()["result"]
        assert result["supportedVersions"] == ["2026-07-28"]
        assert result["resultType"] == "complete"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-gateway"
        assert {"tools", "prompts", "resources", "completions"} <= result["capabilities"].keys()
        assert "alpha instructions" in result["instructions"] and "beta instructions" in result["instructions"]
        assert result["cacheScope"] in ("public", "private") and result["ttlMs"] >= 0


# -- routing ---------------------------------------------------------------------------------


async def test_tool_calls_go_to_the_owner_of_the_prefixed_name(fleet, client, alpha, beta):
    async with running_gateway(fleet) as gw:
        for backend in ("alpha", "beta"):
            response = await mcp_http.post(client, gw.url, "tools/call",
                                           {"name": f"{backend}__echo", "arguments": {"text": "hi"}},
                                           id=f"route-{backend}")
            assert response.json()["result"]["content"][0]["text"] == f"{backend}: hi"
        (seen,) = [c for c in await alpha.calls("tools/call") if c["id"] == "route-alpha"]
        # The backend sees its own name, in the body and in Mcp-Name (a modern backend checks).
        assert seen["name"] == "echo" and seen["mcp-name"] == "echo"
        assert not [c for c in await beta.calls("tools/call") if c["id"] == "route-alpha"]


async def test_prompts_get_goes_to_the_owner(fleet, client):
    async with running_gateway(fleet) as gw:
        response = await mcp_http.post(client, gw.url, "prompts/get", {"name": "beta__greet"})
        assert response.json()["result"]["messages"][0]["content"]["text"] == "beta: greet"


async def test_param_headers_are_checked_against_the_backend_tool_and_relayed(fleet, client, beta):
    async with running_gateway(fleet) as gw:
        params = {"name": "beta__regional", "arguments": {"region": "ap-south1"}}
        missing = await mcp_http.post(client, gw.url, "tools/call", params)
        assert missing.status_code == 400 and missing.json()["error"]["code"] == -32020
        ok = await mcp_http.post(client, gw.url, "tools/call", params, id="regional-ok",
                                 extra_headers={"mcp-param-region": "ap-south1"})
        assert ok.json()["result"]["content"][0]["text"] == "beta: region header 'ap-south1'"


async def test_resources_read_goes_to_the_backend_that_listed_the_uri(fleet, client):
    async with running_gateway(fleet) as gw:
        await walk(client, gw.url, "resources/list", "resources")
        await walk(client, gw.url, "resources/templates/list", "resourceTemplates")
        for backend, uri in (("alpha", "scripted://alpha/doc-1"), ("beta", "scripted://beta/doc-2"),
                             ("beta", "scripted://beta/items/77")):
            response = await mcp_http.post(client, gw.url, "resources/read", {"uri": uri})
            assert response.status_code == 200, response.text
            assert response.json()["result"]["contents"][0]["text"].startswith(f"{backend}: ")


async def test_resources_read_by_configured_prefix_without_any_listing(alpha, beta, client):
    settings = {"backends": [{"name": "alpha", "url": alpha.url},
                             {"name": "beta", "url": beta.url, "resource_prefixes": ["scripted://beta/"]}]}
    async with running_gateway(settings, discover=False) as gw:
        response = await mcp_http.post(client, gw.url, "resources/read", {"uri": "scripted://beta/items/5"})
        assert response.json()["result"]["contents"][0]["text"] == "beta: items/5"


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": "gamma__echo"}),
        ("tools/call", {"name": "echo"}),  # unprefixed, in a fleet
        ("prompts/get", {"name": "nobody__greet"}),
        ("resources/read", {"uri": "scripted://nobody/doc-0"}),
    ],
)
async def test_a_name_no_backend_owns_is_invalid_params(fleet, client, method, params):
    async with running_gateway(fleet) as gw:
        response = await mcp_http.post(client, gw.url, method, params)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == -32602
        assert "no backend" in error["message"]


async def test_backend_error_codes_pass_through(fleet, client):
    async with running_gateway(fleet) as gw:
        unknown = await mcp_http.post(client, gw.url, "tools/call", {"name": "alpha__no_such_tool"})
        assert unknown.json()["error"]["code"] == -32602  # the backend's own answer
        custom = await mcp_http.post(client, gw.url, "tools/call",
                                     {"name": "beta__fail", "arguments": {"code": -1234, "message": "nope"}})
        assert custom.json()["error"] == {"code": -1234, "message": "nope"}
