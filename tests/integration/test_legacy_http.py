"""Modern clients through the gateway to initialize-era HTTP backends (mcp==1.30.0 FastMCP in
its own venv, and the legacy leg of mcp==2.3.0), driven by the official client in
2026-07-28 mode. Everything is real: subprocess servers on loopback, the gateway in process
on a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import mcp
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CreateMessageResult, ElicitResult, ListRootsResult, Root, TextContent

from gateway.backends.base import internal_call
from tests.support import mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support import legacy_venv
from tests.support.procs import Proc, python_server

MODERN = "2026-07-28"


@pytest.fixture(scope="session")
def legacy_python() -> str:
    return legacy_venv.legacy_python()


def _start(legacy_python: str, *args: str, name: str) -> Proc:
    return legacy_venv.legacy_server(*args, name=name).start()


@pytest.fixture(scope="module")
def stateful_backend(legacy_python: str) -> Iterator[Proc]:
    proc = _start(legacy_python, name="legacy-stateful")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def stateless_backend(legacy_python: str) -> Iterator[Proc]:
    proc = _start(legacy_python, "--stateless", "--json", name="legacy-stateless")
    yield proc
    proc.stop()


@pytest.fixture(params=["stateful", "stateless"])
def backend(request: pytest.FixtureRequest) -> Proc:
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
async def gateway(backend: Proc) -> AsyncIterator[RunningGateway]:
    async with running_gateway({"backends": [{"name": "old", "url": backend.url}]}) as gw:
        yield gw


@pytest.fixture
async def stateful_gateway(stateful_backend: Proc) -> AsyncIterator[RunningGateway]:
    """For what only a streaming (SSE) legacy backend can do: progress, logs, requests."""
    async with running_gateway({"backends": [{"name": "old", "url": stateful_backend.url}]}) as gw:
        yield gw


async def test_era_is_detected_as_legacy(gateway: RunningGateway) -> None:
    (backend,) = gateway.runtime.backends
    assert backend.era == "legacy"


async def test_discover_lists_and_reads(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient() as http:
        response = await mcp_http.post(http, gateway.url, "server/discover")
    discovered = response.json()["result"]
    assert "tools" in discovered["capabilities"] and discovered["resultType"] == "complete"
    async with mcp.Client(gateway.url, mode=MODERN) as client:
        tools = await client.list_tools()
        assert {"echo", "add", "ask_user"} <= {t.name for t in tools.tools}
        assert tools.result_type == "complete"
        assert tools.ttl_ms == 0 and tools.cache_scope == "private"
        resources = await client.list_resources()
        assert "demo://greeting" in {str(r.uri) for r in resources.resources}
        templates = await client.list_resource_templates()
        assert templates.resource_templates[0].uri_template == "demo://items/{id}"
        read = await client.read_resource("demo://items/7")
        assert '"item 7"' in read.contents[0].text
        prompts = await client.list_prompts()
        assert [p.name for p in prompts.prompts] == ["greet"]
        prompt = await client.get_prompt("greet", {"name": "Ada"})
        assert "Ada" in prompt.messages[0].content.text
        result = await client.call_tool("add", {"a": 2, "b": 3})
        assert result.structured_content == {"result": 5.0}
        failed = await client.call_tool("fail", {"message": "boom"})
        assert failed.is_error and "boom" in failed.content[0].text


async def test_unknown_resource_is_invalid_params(gateway: RunningGateway) -> None:
    async with mcp.Client(gateway.url, mode=MODERN) as client:
        with pytest.raises(MCPError) as info:
            await client.read_resource("demo://nothing-here")
        assert info.value.error.code != -32002


async def test_progress_is_mapped_to_the_clients_token(stateful_gateway: RunningGateway) -> None:
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async with mcp.Client(stateful_gateway.url, mode=MODERN) as client:
        result = await client.call_tool("slow_progress", {"steps": 3, "delay": 0.01}, progress_callback=progress)
    assert result.content[0].text == "done after 3 steps"
    assert seen == [1, 2, 3]


async def test_logs_only_when_asked_and_at_or_above_the_level(stateful_gateway: RunningGateway) -> None:
    gateway = stateful_gateway
    quiet: list[str] = []
    loud: list[str] = []

    async def collect_quiet(params) -> None:  # noqa: ANN001
        quiet.append(params.level)

    async def collect_loud(params) -> None:  # noqa: ANN001
        loud.append(params.level)

    async with mcp.Client(gateway.url, mode=MODERN, logging_callback=collect_quiet) as client:
        await client.call_tool("log_at_levels", {})
    async with mcp.Client(gateway.url, mode=MODERN, logging_callback=collect_loud, log_level="error") as client:
        await client.call_tool("log_at_levels", {})
    assert quiet == []
    assert loud == ["error", "critical", "alert", "emergency"]


async def test_elicitation_and_sampling_become_mrtr_rounds(stateful_gateway: RunningGateway) -> None:
    gateway = stateful_gateway
    asked: list[str] = []

    async def elicit(context, params):  # noqa: ANN001
        asked.append(params.message)
        return ElicitResult(action="accept", content={"answer": "forty-two"})

    async def sample(context, params):  # noqa: ANN001
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="sampled!"), model="m")

    async def roots(context):  # noqa: ANN001
        return ListRootsResult(roots=[Root(uri="file:///tmp/x", name="x")])

    async with mcp.Client(gateway.url, mode=MODERN, elicitation_callback=elicit, sampling_callback=sample,
                          list_roots_callback=roots) as client:
        answer = await client.call_tool("ask_user", {"question": "meaning?"})
        assert answer.content[0].text == "accept: forty-two"
        assert asked == ["meaning?"]
        sampled = await client.call_tool("ask_llm", {"prompt": "hi"})
        assert sampled.content[0].text == "m: sampled!"
        listed = await client.call_tool("list_client_roots", {})
        assert "file:///tmp/x" in listed.content[0].text


async def test_missing_capability_is_32021_not_a_hang(stateful_gateway: RunningGateway) -> None:
    gateway = stateful_gateway
    async with mcp.Client(gateway.url, mode=MODERN) as client:
        with pytest.raises(MCPError) as info:
            await client.call_tool("ask_user", {"question": "?"})
    assert info.value.error.code == -32021
    assert info.value.error.data["requiredCapabilities"] == {"elicitation": {}}


async def test_listen_delivers_resource_updates(stateful_backend: Proc) -> None:
    async with running_gateway({"backends": [{"name": "old", "url": stateful_backend.url}]}) as gw:
        (backend,) = gw.runtime.backends
        listen = internal_call("subscriptions/listen", {"notifications": {
            "toolsListChanged": True, "resourceSubscriptions": ["demo://greeting"]}}, request_id="L1")
        reply = await backend.send(listen)
        assert reply.stream is not None
        ack = await anext(reply.stream)
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["notifications"] == {"toolsListChanged": True,
                                                  "resourceSubscriptions": ["demo://greeting"]}
        # A client without input capabilities shares the listen session (same capability
        # set), whose subscription makes the backend send the update on its GET stream.
        async with mcp.Client(gw.url, mode=MODERN) as client:
            touched = await client.call_tool("touch_resource", {"uri": "demo://greeting"})
        assert touched.content[0].text == "updated: demo://greeting"
        update = await asyncio.wait_for(anext(reply.stream), 10)
        assert update["method"] == "notifications/resources/updated"
        assert update["params"]["uri"] == "demo://greeting"
        assert update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
        await reply.aclose()
        # The last listener left: the URI is unsubscribed upstream.
        async with mcp.Client(gw.url, mode=MODERN) as client:
            for _ in range(100):
                touched = await client.call_tool("touch_resource", {"uri": "demo://greeting"})
                if touched.content[0].text.startswith("not subscribed"):
                    break
                await asyncio.sleep(0.05)
        assert touched.content[0].text == "not subscribed: demo://greeting"


async def test_session_expiry_reinitializes_and_replays(legacy_python: str) -> None:
    proc = _start(legacy_python, name="legacy-restarting")
    try:
        async with running_gateway({"backends": [{"name": "old", "url": proc.url}]}) as gw:
            async with mcp.Client(gw.url, mode=MODERN) as client:
                assert (await client.call_tool("echo", {"text": "one"})).content[0].text == "one"
                proc.restart()  # the new process knows no session: it answers 404
                assert (await client.call_tool("echo", {"text": "two"})).content[0].text == "two"
    finally:
        proc.stop()


async def test_warm_call_costs_one_upstream_post(stateful_backend: Proc) -> None:
    # The fixture counts the requests that reach its MCP endpoint (GET /requests).
    counts = f"http://127.0.0.1:{stateful_backend.port}/requests"
    async with running_gateway({"backends": [{"name": "old", "url": stateful_backend.url}]}) as gw, \
            httpx.AsyncClient() as http:
        async with mcp.Client(gw.url, mode=MODERN) as client:
            await client.call_tool("echo", {"text": "warm-up"})
            before = (await http.get(counts)).json()
            await client.call_tool("echo", {"text": "warm"})
            after = (await http.get(counts)).json()
        assert {method: after[method] - before.get(method, 0) for method in after
                if after[method] != before.get(method, 0)} == {"POST": 1}


async def test_sdk2_legacy_leg_pinned(tmp_path: Path) -> None:
    """mcp==2.3.0's MCPServer answers initialize too; pinned `era: legacy` uses only that."""
    server = python_server("conformance_modern.py", name="sdk2-legacy-leg").start()
    try:
        async with running_gateway({"backends": [{"name": "dual", "url": server.url, "era": "legacy"}]}) as gw:
            async with mcp.Client(gw.url, mode=MODERN) as client:
                result = await client.call_tool("test_simple_text", {})
                assert result.result_type == "complete"
                assert result.content[0].type == "text"
                read = await client.read_resource("test://static-text")
                assert read.contents
    finally:
        server.stop()
