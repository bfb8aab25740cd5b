"""The embedded default (no `cache:` section: the memory store) through a running gateway:
X-Cache on the answer, remaining ttlMs, and aggregated lists merged from cached parts."""

from __future__ import annotations

import httpx

from tests.support import mcp_http
from tests.support.gateway import running_gateway


async def test_default_memory_cache_answers_repeated_reads(counting_backend):
    uri = "count://public/memory-default"
    async with (
        running_gateway({"backends": [{"name": "counted", "url": counting_backend.url}]}) as gw,
        httpx.AsyncClient() as c,
    ):
        first = await mcp_http.post(c, gw.url, "resources/read", {"uri": uri}, id="a")
        second = await mcp_http.post(c, gw.url, "resources/read", {"uri": uri}, id="b")
        assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
        assert second.json()["id"] == "b"
        assert second.json()["result"]["contents"] == first.json()["result"]["contents"]
        assert 0 < second.json()["result"]["ttlMs"] <= first.json()["result"]["ttlMs"] == 60_000
        counts = (await c.get(f"http://127.0.0.1:{counting_backend.port}/counts")).json()
        assert counts[f"resources/read {uri}"] == 1


async def test_aggregated_list_from_cached_parts(counting_backend):
    # The same server under two names: two parts, each its own cache entry.
    config = {
        "backends": [
            {"name": "alpha", "url": counting_backend.url},
            {"name": "beta", "url": counting_backend.url},
        ]
    }
    async with running_gateway(config) as gw, httpx.AsyncClient() as c:
        first = await mcp_http.post(c, gw.url, "tools/list")
        assert first.headers["x-cache"] == "miss"
        again = await mcp_http.post(c, gw.url, "tools/list")
        assert again.headers["x-cache"] == "hit"
        result = again.json()["result"]
        assert [t["name"] for t in result["tools"]] == [
            "alpha__counted_a",
            "alpha__counted_b",
            "beta__counted_a",
            "beta__counted_b",
        ]
        assert 0 < result["ttlMs"] <= 60_000 and result["cacheScope"] == "public"
        # The merged cursor leads to each backend's own (cached separately) second page.
        page_two = await mcp_http.post(c, gw.url, "tools/list", {"cursor": result["nextCursor"]})
        assert [t["name"] for t in page_two.json()["result"]["tools"]] == [
            "alpha__counted_c",
            "beta__counted_c",
        ]
