"""Curation per backend end to end: two real scripted backends behind the gateway, one
curated (include/exclude, a rename, a new description, its prompts hidden, one resource
hidden); lists show exactly what is configured, hidden and renamed-away names are unknown
(-32602) when called, a renamed tool reaches the backend under its own name. Raw HTTP and
the SDK client in legacy mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from mcp import Client, MCPError

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.governance import sdk_tool_names

CURATED = {
    "tools": {"include": ["echo", "slow", "fail", "gat*"], "exclude": ["gated"], "rename": {"echo": "say"},
              "descriptions": {"slow": "Waits a while"}},
    "prompts": {"exclude": ["*"]},
    "resources": {"exclude": ["scripted://ledger/doc-2"]},
}


@pytest.fixture
async def gw(ledger, reports) -> AsyncIterator[Any]:
    config = {"backends": [
        {"name": "ledger", "url": ledger.url, "era": "modern", "resource_prefixes": ["scripted://ledger/"], **CURATED},
        {"name": "reports", "url": reports.url, "era": "modern", "resource_prefixes": ["scripted://reports/"]},
    ]}
    async with running_gateway(config) as gw:
        yield gw


async def listed(http: httpx.AsyncClient, url: str, method: str, key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(50):
        response = await mcp_http.post(http, url, method, {"cursor": cursor} if cursor else None)
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        items += result[key]
        cursor = result.get("nextCursor")
        if cursor is None:
            return items
    raise AssertionError("the list did not end")


async def test_lists_show_what_is_configured(gw):
    async with httpx.AsyncClient() as http:
        tools = {t["name"]: t for t in await listed(http, gw.url, "tools/list", "tools")}
        prompts = [p["name"] for p in await listed(http, gw.url, "prompts/list", "prompts")]
        resources = [r["uri"] for r in await listed(http, gw.url, "resources/list", "resources")]
    assert sorted(n for n in tools if n.startswith("ledger__")) == ["ledger__fail", "ledger__say", "ledger__slow"]
    assert tools["ledger__slow"]["description"] == "Waits a while"
    assert "reports__gated" in tools and "reports__echo" in tools  # the other backend is untouched
    assert prompts and all(p.startswith("reports__") for p in prompts)
    assert "scripted://ledger/doc-2" not in resources and "scripted://ledger/doc-1" in resources


@pytest.mark.parametrize(("method", "params", "what"), [
    ("tools/call", {"name": "ledger__gated", "arguments": {"key": "k"}}, "Unknown tool"),  # excluded
    ("tools/call", {"name": "ledger__ask", "arguments": {}}, "Unknown tool"),  # not included
    ("tools/call", {"name": "ledger__echo", "arguments": {"text": "x"}}, "Unknown tool"),  # renamed away
    ("prompts/get", {"name": "ledger__greet"}, "Unknown prompt"),
    ("resources/read", {"uri": "scripted://ledger/doc-2"}, "Resource not found"),
])
async def test_hidden_names_are_unknown(gw, ledger, method, params, what):
    async with httpx.AsyncClient() as http:
        response = await mcp_http.post(http, gw.url, method, params)
    assert response.status_code in (200, 400), response.text
    error = response.json()["error"]
    assert error["code"] == -32602 and what in error["message"]


async def test_a_renamed_tool_reaches_the_backend_under_its_own_name(gw):
    async with httpx.AsyncClient() as http:
        response = await mcp_http.post(http, gw.url, "tools/call", {"name": "ledger__say", "arguments": {"text": "hi"}})
    assert response.status_code == 200, response.text
    assert response.json()["result"]["content"][0]["text"] == "ledger: hi"


async def test_a_legacy_client_sees_the_same_curation(gw):
    async with Client(gw.url, mode="legacy", cache=None) as client:
        names = await sdk_tool_names(client)
        assert sorted(n for n in names if n.startswith("ledger__")) == ["ledger__fail", "ledger__say", "ledger__slow"]
        result = await client.call_tool("ledger__say", {"text": "legacy"})
        assert result.content[0].text == "ledger: legacy"
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("ledger__gated", {"key": "k"})
