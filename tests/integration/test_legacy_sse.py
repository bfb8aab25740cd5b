"""Modern clients through the gateway to HTTP+SSE (2024-11-05 transport) backends: the
mcp==1.30.0 fixture served with FastMCP's `sse_app` (a GET stream that names a POST
endpoint), driven by the official client in 2026-07-28 mode. Real subprocess servers on
loopback, the gateway in process on a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import mcp
import pytest
from mcp_types import CreateMessageResult, ElicitResult, TextContent

from gateway.backends.base import internal_call
from gateway.backends.legacy.sse import LegacySseBackend
from tests.support import legacy_venv, mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.procs import Proc

MODERN = "2026-07-28"


@pytest.fixture(scope="module")
def sse_backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server("--sse", name="legacy-sse").start()
    yield proc
    proc.stop()


@pytest.fixture
async def gateway(sse_backend: Proc) -> AsyncIterator[RunningGateway]:
    async with running_gateway({"backends": [{"name": "old", "url": sse_backend.url}]}) as gw:
        yield gw


def _sse_delegate(gw: RunningGateway) -> LegacySseBackend:
    (backend,) = gw.runtime.backends
    delegate = getattr(backend, "_delegates", {}).get("legacy-sse", backend)
    assert isinstance(delegate, LegacySseBackend)
    return delegate


async def test_auto_detects_the_old_transport_and_serves_everything(gateway: RunningGateway) -> None:
    async with mcp.Client(gateway.url, mode=MODERN) as client:
        tools = await client.list_tools()
        assert {"echo", "add", "ask_user"} <= {t.name for t in tools.tools}
        assert tools.result_type == "complete"
        result = await client.call_tool("add", {"a": 2, "b": 3})
        assert result.structured_content == {"result": 5.0}
        read = await client.read_resource("demo://items/7")
        assert '"item 7"' in read.contents[0].text
        prompt = await client.get_prompt("greet", {"name": "Ada"})
        assert "Ada" in prompt.messages[0].content.text
        failed = await client.call_tool("fail", {"message": "boom"})
        assert failed.is_error and "boom" in failed.content[0].text
    (backend,) = gateway.runtime.backends
    assert backend.era == "legacy-sse"
    _sse_delegate(gateway)


async def test_pinned_transport_needs_no_probe(sse_backend: Proc) -> None:
    config = {"backends": [{"name": "old", "url": sse_backend.url, "era": "legacy", "transport": "sse"}]}
    async with running_gateway(config) as gw:
        assert isinstance(gw.runtime.backends[0], LegacySseBackend)
        async with mcp.Client(gw.url, mode=MODERN) as client:
            assert (await client.call_tool("echo", {"text": "pinned"})).content[0].text == "pinned"


async def test_discover_is_answered_from_the_initialize_result(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient() as http:
        response = await mcp_http.post(http, gateway.url, "server/discover")
    discovered = response.json()["result"]
    assert discovered["resultType"] == "complete"
    assert {"tools", "resources", "prompts"} <= set(discovered["capabilities"])


async def test_progress_and_logs_come_back_over_the_one_stream(gateway: RunningGateway) -> None:
    seen: list[float] = []
    levels: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async def collect(params) -> None:  # noqa: ANN001
        levels.append(params.level)

    async with mcp.Client(gateway.url, mode=MODERN, logging_callback=collect, log_level="error") as client:
        result = await client.call_tool("slow_progress", {"steps": 3, "delay": 0.01}, progress_callback=progress)
        assert result.content[0].text == "done after 3 steps"
        await client.call_tool("log_at_levels", {})
    assert seen == [1, 2, 3]
    assert levels == ["error", "critical", "alert", "emergency"]


async def test_backend_requests_become_mrtr_rounds(gateway: RunningGateway) -> None:
    async def elicit(context, params):  # noqa: ANN001
        return ElicitResult(action="accept", content={"answer": "forty-two"})

    async def sample(context, params):  # noqa: ANN001
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled!"), model="m")

    async with mcp.Client(gateway.url, mode=MODERN, elicitation_callback=elicit, sampling_callback=sample) as client:
        answer = await client.call_tool("ask_user", {"question": "meaning?"})
        assert answer.content[0].text == "accept: forty-two"
        sampled = await client.call_tool("ask_llm", {"prompt": "hi"})
        assert sampled.content[0].text == "m: sampled!"


async def test_a_restarted_backend_gets_a_new_session_and_listens_resume() -> None:
    proc = legacy_venv.legacy_server("--sse", name="legacy-sse-restarting").start()
    try:
        config = {"backends": [{"name": "old", "url": proc.url, "transport": "sse"}]}
        async with running_gateway(config) as gw:
            backend = gw.runtime.backends[0]
            listen = internal_call("subscriptions/listen", {"notifications": {
                "toolsListChanged": True, "resourceSubscriptions": ["demo://greeting"]}}, request_id="L1")
            reply = await backend.send(listen)
            assert reply.stream is not None
            ack = await anext(reply.stream)
            assert ack["params"]["notifications"] == {"toolsListChanged": True,
                                                      "resourceSubscriptions": ["demo://greeting"]}
            async with mcp.Client(gw.url, mode=MODERN) as client:
                await client.call_tool("touch_resource", {"uri": "demo://greeting"})
                update = await asyncio.wait_for(anext(reply.stream), 10)
                assert update["method"] == "notifications/resources/updated"

                proc.restart()  # the stream ends: that session, and its subscription, are gone
                # The listeners hear that lists may have changed while nobody was listening...
                changed = await asyncio.wait_for(anext(reply.stream), 10)
                assert changed["method"] == "notifications/tools/list_changed"
                assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
                # ...calls work on a fresh session, and the subscription was made again on it.
                assert (await client.call_tool("echo", {"text": "again"})).content[0].text == "again"
                touched = await client.call_tool("touch_resource", {"uri": "demo://greeting"})
                assert touched.content[0].text == "updated: demo://greeting"
                update = await asyncio.wait_for(anext(reply.stream), 10)
                assert update["method"] == "notifications/resources/updated"
            await reply.aclose()
    finally:
        proc.stop()


async def test_a_dead_backend_fails_the_call_by_name() -> None:
    proc = legacy_venv.legacy_server("--sse", name="legacy-sse-dying").start()
    try:
        config = {"backends": [{"name": "old", "url": proc.url, "transport": "sse",
                                "connect_timeout_seconds": 2}]}
        async with running_gateway(config) as gw:
            async with mcp.Client(gw.url, mode=MODERN) as client:
                assert (await client.call_tool("echo", {"text": "alive"})).content[0].text == "alive"
                proc.stop()
                with pytest.raises(mcp.shared.exceptions.MCPError) as info:
                    await client.call_tool("echo", {"text": "dead"})
            assert info.value.error.code == -31001
            assert "old" in info.value.error.message
    finally:
        proc.stop()


async def test_a_call_parked_for_input_does_not_blur_the_next_ones_origin(gateway: RunningGateway) -> None:
    """One stream carries every call's messages: a backend request is credited to the one call
    that can have sent it. A call parked for its MRTR retry (its backend call blocked on the
    gateway's answer) is not a candidate, so the next call's question still reaches its client."""
    elicitation = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}
    async with httpx.AsyncClient() as http:
        first = await mcp_http.post(http, gateway.url, "tools/call", {"name": "ask_user",
                                    "arguments": {"question": "first?"}}, meta=elicitation)
        parked = first.json()["result"]
        assert parked["resultType"] == "input_required"
        # The first call stays parked (never retried here) while a second one asks.
        second = await mcp_http.post(http, gateway.url, "tools/call", {"name": "ask_user",
                                     "arguments": {"question": "second?"}}, id=2, meta=elicitation)
        asked = second.json()["result"]
        assert asked["resultType"] == "input_required"
        (request,) = asked["inputRequests"].values()
        assert request["params"]["message"] == "second?"
        # Both complete, each with its own answer.
        for state, key, text in ((asked, "second", "two"), (parked, "first", "one")):
            (input_key,) = state["inputRequests"]
            done = await mcp_http.post(http, gateway.url, "tools/call", {
                "name": "ask_user", "arguments": {"question": f"{key}?"},
                "inputResponses": {input_key: {"action": "accept", "content": {"answer": text}}},
                "requestState": state["requestState"]}, meta=elicitation)
            assert done.json()["result"]["content"][0]["text"] == f"accept: {text}"


async def test_listens_end_when_their_session_cannot_be_replaced() -> None:
    """The stream ended and the backend stays down: the listen streams end too, so that the
    hub listens again later (a silent stream would never carry anything again)."""
    proc = legacy_venv.legacy_server("--sse", name="legacy-sse-gone").start()
    try:
        config = {"backends": [{"name": "old", "url": proc.url, "transport": "sse", "connect_timeout_seconds": 2}]}
        async with running_gateway(config) as gw:
            listen = internal_call("subscriptions/listen", {"notifications": {
                "resourceSubscriptions": ["demo://greeting"]}}, request_id="L1")
            reply = await gw.runtime.backends[0].send(listen)
            assert reply.stream is not None
            await anext(reply.stream)  # the acknowledgement
            proc.stop()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(reply.stream), 15)
    finally:
        proc.stop()
