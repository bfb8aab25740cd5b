"""The official SDK client (mcp==2.3.0) against a gateway in front of two paging scripted
backends, pinned to 2026-07-28 and in "auto" mode: discover, merged and paginated lists,
calls on each backend, a progress-streaming call, an input-required round trip, a read."""

from __future__ import annotations

import asyncio

import pytest
from mcp import Client
import mcp_types as types
from mcp_types import ElicitResult

from tests.fixtures.servers.scripted_modern import PROMPTS, TOOLS
from tests.support.gateway import running_gateway

MODES = ["2026-07-28", "auto"]
OFFERED_TOOLS = [t["name"] for t in TOOLS if t["name"] != "bad_header_tool"]


@pytest.fixture
async def gw(alpha, beta):
    settings = {"backends": [{"name": "alpha", "url": alpha.url, "resource_prefixes": ["scripted://alpha/"]},
                             {"name": "beta", "url": beta.url, "resource_prefixes": ["scripted://beta/"]}]}
    async with running_gateway(settings) as gw:
        yield gw


@pytest.mark.parametrize("mode", MODES)
async def test_discover_lists_and_calls(gw, mode):
    async with Client(gw.url, mode=mode, cache=None) as client:
        if mode == "auto":  # the SDK probed server/discover on connect and adopted the answer
            assert client.server_info is not None and client.server_info.name == "mcp-gateway"
        # A pinned client synthesizes its DiscoverResult; ask the gateway explicitly.
        discovered = types.DiscoverResult.model_validate(await client.session.send_discover("2026-07-28"))
        assert discovered.supported_versions == ["2026-07-28"]
        assert (discovered.meta or {})["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-gateway"
        assert discovered.capabilities.tools is not None and discovered.capabilities.prompts is not None

        names: list[str] = []
        cursor = None
        pages = 0
        while True:
            page = await client.list_tools(cursor=cursor)
            pages += 1
            names += [t.name for t in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert pages > 1  # the SDK followed the gateway cursor
        assert sorted(names) == sorted([f"{b}__{n}" for b in ("alpha", "beta") for n in OFFERED_TOOLS])

        prompts = await client.list_prompts()
        assert {p.name for p in prompts.prompts} >= {f"alpha__{PROMPTS[0]['name']}", f"beta__{PROMPTS[0]['name']}"}

        for backend in ("alpha", "beta"):
            result = await client.call_tool(f"{backend}__echo", {"text": mode})
            assert not result.is_error
            assert result.content[0].text == f"{backend}: {mode}"
            prompt = await client.get_prompt(f"{backend}__greet")
            assert prompt.messages[0].content.text == f"{backend}: greet"


@pytest.mark.parametrize("mode", MODES)
async def test_progress_reaches_the_callback_before_the_result(gw, alpha, mode):
    key = f"sdk-progress-{mode}"
    progress: list[tuple[float, str | None]] = []
    first = asyncio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))
        first.set()

    async with Client(gw.url, mode=mode, cache=None) as client:
        call = asyncio.ensure_future(client.call_tool("alpha__gated", {"key": key}, progress_callback=on_progress))
        await asyncio.wait_for(first.wait(), 15)
        # The backend is still holding the result: this event was relayed as it arrived.
        assert not call.done()
        assert progress == [(1, f"{key}: waiting")]
        await alpha.release(key)
        result = await asyncio.wait_for(call, 15)
    assert result.content[0].text == f"alpha: {key} released"
    assert progress == [(1, f"{key}: waiting"), (2, f"{key}: released")]


@pytest.mark.parametrize("mode", MODES)
async def test_input_required_round_trip(gw, alpha, mode):
    asked: list[str] = []

    async def on_elicit(context, params) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"value": f"via-{mode}"})

    async with Client(gw.url, mode=mode, cache=None, elicitation_callback=on_elicit) as client:
        result = await client.call_tool("alpha__ask", {})
    assert asked == ["Value?"]
    assert result.content[0].text == f"alpha got via-{mode}"


@pytest.mark.parametrize("mode", MODES)
async def test_resource_read_on_each_backend(gw, mode):
    async with Client(gw.url, mode=mode, cache=None) as client:
        listed = await client.list_resources()
        assert {str(r.uri) for r in listed.resources} >= {"scripted://alpha/doc-0", "scripted://beta/doc-0"}
        for backend in ("alpha", "beta"):
            read = await client.read_resource(f"scripted://{backend}/doc-1")
            assert read.contents[0].text == f"{backend}: doc-1"
