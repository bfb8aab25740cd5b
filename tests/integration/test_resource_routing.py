"""Resource routing over real HTTP (gateway/dispatch.py `_resolve_relisted`): a URI the route
table does not hold (never listed, or evicted from its bounded index) is found by reading the
fleet's resources/list once, not answered "not found"."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.scripted import Scripted


@contextlib.contextmanager
def scripted_pair() -> Iterator[tuple[Scripted, Scripted]]:
    alpha, beta = Scripted("alpha").start(), Scripted("beta").start()
    try:
        yield alpha, beta
    finally:
        alpha.stop()
        beta.stop()


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Scripted, Scripted]]:
    with scripted_pair() as both:
        yield both


async def test_an_unknown_uri_is_found_by_re_listing(pair):
    alpha, beta = pair
    settings = {"backends": [{"name": "alpha", "url": alpha.url}, {"name": "beta", "url": beta.url}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        # No client listed anything; the re-list reads every page (doc-2 is on beta's second).
        for uri in ("scripted://beta/doc-2", "scripted://alpha/doc-0"):
            response = await mcp_http.post(client, gw.url, "resources/read", {"uri": uri})
            assert response.status_code == 200, response.text
            assert response.json()["result"]["contents"][0]["uri"] == uri
        unknown = await mcp_http.post(client, gw.url, "resources/read", {"uri": "scripted://nobody/x"})
        assert unknown.status_code == 400 and "no backend serves this URI" in unknown.json()["error"]["message"]


async def test_concurrent_misses_share_one_re_listing(pair):
    # Reads that arrive while the re-list runs wait for it instead of being told "not found".
    import asyncio

    alpha, beta = pair
    settings = {"backends": [{"name": "alpha", "url": alpha.url}, {"name": "beta", "url": beta.url}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        uris = ["scripted://beta/doc-2", "scripted://alpha/doc-0", "scripted://beta/doc-0", "scripted://alpha/doc-1"]
        responses = await asyncio.gather(*(mcp_http.post(client, gw.url, "resources/read", {"uri": u}, id=n)
                                           for n, u in enumerate(uris)))
        for uri, response in zip(uris, responses):
            assert response.status_code == 200, (uri, response.text)
            assert response.json()["result"]["contents"][0]["uri"] == uri


@pytest.fixture
def fresh_pair() -> Iterator[tuple[Scripted, Scripted]]:
    """Backends of this test alone: it changes what they list."""
    with scripted_pair() as both:
        yield both


async def test_a_template_the_backend_stopped_listing_stops_routing_to_it(fresh_pair):
    # routing/table.py `learn_templates`: a complete listing replaces what the backend listed
    # before. Cache off, so that the second listing reaches the backends.
    alpha, beta = fresh_pair
    settings = {"backends": [{"name": "alpha", "url": alpha.url}, {"name": "beta", "url": beta.url}],
                "cache": {"store": "none"}}

    async def read(client: httpx.AsyncClient, uri: str) -> httpx.Response:
        return await mcp_http.post(client, gw.url, "resources/read", {"uri": uri})

    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        listed = await mcp_http.post(client, gw.url, "resources/templates/list")
        assert [t["uriTemplate"] for t in listed.json()["result"]["resourceTemplates"]] == [
            "scripted://alpha/items/{id}", "scripted://beta/items/{id}"]
        assert (await read(client, "scripted://alpha/items/7")).json()["result"]["contents"][0]["text"] == \
            "alpha: items/7"

        await alpha.set_templates(["scripted://alpha/things/{id}"])
        relisted = await mcp_http.post(client, gw.url, "resources/templates/list")
        assert [t["uriTemplate"] for t in relisted.json()["result"]["resourceTemplates"]] == [
            "scripted://alpha/things/{id}", "scripted://beta/items/{id}"]
        assert (await read(client, "scripted://alpha/things/3")).json()["result"]["contents"][0]["text"] == \
            "alpha: things/3"
        # The dropped template no longer claims its URIs: nobody serves them now.
        gone = await read(client, "scripted://alpha/items/7")
        assert gone.status_code == 400 and "no backend serves this URI" in gone.json()["error"]["message"]
        assert (await read(client, "scripted://beta/items/1")).status_code == 200
