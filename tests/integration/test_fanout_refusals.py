"""A fan-out whose every backend refuses the request as invalid answers the client's own -32602
with status 400, never 502 -31001 "no backend answered" (issue: errors blamed on whoever made
them). Two real scripted backends behind a gateway on loopback; the request is a page of
`tools/list` whose gateway cursor carries a cursor neither backend accepts (each answers
-32602 "Invalid cursor", PAGE: SHOULD)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import pytest_asyncio

from gateway.routing import cursor as gw_cursor
from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.scripted import Scripted

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Scripted, Scripted]]:
    with Scripted("north") as north, Scripted("south") as south:
        yield north, south


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(fleet):
    north, south = fleet
    async with running_gateway({"backends": [{"name": "north", "url": north.url},
                                             {"name": "south", "url": south.url}]}) as gw:
        yield gw


async def post_list(gw, params):
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        return await mcp_http.post(client, gw.url, "tools/list", params, id="page")


async def test_every_backend_refusing_the_page_as_invalid_is_the_clients_invalid_params(gw, fleet):
    cursor = gw_cursor.encode("tools/list", {"north": "forged", "south": "forged"})
    response = await post_list(gw, {"cursor": cursor})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["id"] == "page" and body["error"]["code"] == -32602
    assert body["error"]["data"] == {"backends": ["north", "south"]}
    message = body["error"]["message"]
    assert "north: Invalid cursor 'forged'" in message and "south: Invalid cursor 'forged'" in message
    for backend in fleet:  # each was asked, with its own cursor: the refusal is theirs, relayed
        assert [c["params"].get("cursor") for c in await backend.calls("tools/list")][-1:] == ["forged"]


async def test_one_backend_refusing_while_the_other_pages_is_a_partial_page(gw):
    first = await post_list(gw, {})
    assert first.status_code == 200
    pending = gw_cursor.decode("tools/list", first.json()["result"]["nextCursor"], None)
    cursor = gw_cursor.encode("tools/list", {"north": "forged", "south": pending["south"]})
    response = await post_list(gw, {"cursor": cursor})
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["tools"] and all(t["name"].startswith("south__") for t in result["tools"])
    assert result["ttlMs"] == 0  # partial: north was left out (and stays in the cursor as a retry)


async def test_the_fleet_still_serves_a_valid_list(gw):
    response = await post_list(gw, {})
    assert response.status_code == 200 and response.json()["result"]["tools"]
