"""Initialize-era clients through the gateway: the official SDK client (mcp==2.3.0) in
mode="legacy" against the gateway in front of real modern backends (digest §h.9)."""

from __future__ import annotations

import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.support.gateway import running_gateway


@pytest.fixture
def one_backend(conformance_backend):
    return {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}]}


@pytest.fixture
def fleet(conformance_backend, second_backend):
    return {
        "backends": [
            {"name": "alpha", "url": conformance_backend.url, "era": "modern"},
            {"name": "beta", "url": second_backend.url, "era": "modern"},
        ]
    }


pytestmark = pytest.mark.filterwarnings("ignore:.*(ping is removed|logging capability is deprecated).*")


async def test_handshake_negotiates_a_legacy_version_and_serves_the_fleet_capabilities(one_backend):
    async with running_gateway(one_backend) as gw, Client(gw.url, mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        assert client.server_info is not None and client.server_info.name == "mcp-gateway"
        caps = client.server_capabilities
        assert caps.tools is not None and caps.prompts is not None and caps.resources is not None
        assert caps.logging is not None  # the gateway itself honours logging/setLevel
        assert caps.completions is not None
        await client.send_ping()


async def test_lists_reads_prompts_and_completion_come_back_in_legacy_shape(one_backend):
    async with running_gateway(one_backend) as gw, Client(gw.url, mode="legacy") as client:
        tools = await client.list_tools()
        assert "test_simple_text" in {t.name for t in tools.tools}
        read = await client.read_resource("test://static-text")
        assert read.contents[0].text == "This is the content of the static text resource."
        prompt = await client.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
        assert "arg1='a'" in prompt.messages[0].content.text
        completion = await client.complete(
            types.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
            {"name": "arg1", "value": "par"},
        )
        assert completion.completion.values == ["paris", "park", "party"]


async def test_tool_call_relays_progress_to_the_legacy_client(one_backend):
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with running_gateway(one_backend) as gw, Client(gw.url, mode="legacy") as client:
        result = await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        assert not result.is_error
        assert seen == [0, 50, 100]


async def test_log_level_set_once_applies_to_later_calls(one_backend):
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async with (
        running_gateway(one_backend) as gw,
        Client(gw.url, mode="legacy", logging_callback=on_log) as client,
    ):
        await client.call_tool("test_logging_tool", {})
        assert logs == []  # no level set: modern backends send no logs (digest §h.8)
        await client.set_logging_level("warning")
        await client.call_tool("test_logging_tool", {})
        assert [entry.level for entry in logs] == ["warning"]


async def test_input_required_becomes_elicitation_and_sampling_requests(one_backend):
    asked: list[str] = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async def sample(context, params):
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="Paris"),
            model="test-model",
            stop_reason="endTurn",
        )

    async with (
        running_gateway(one_backend) as gw,
        Client(gw.url, mode="legacy", elicitation_callback=elicit, sampling_callback=sample) as client,
    ):
        result = await client.call_tool("test_elicitation", {"message": "Who are you?"})
        assert (
            result.content[0].text
            == 'User response: action=accept, content={"email": "ada@example.com", "username": "ada"}'
        )
        result = await client.call_tool("test_sampling", {"prompt": "Capital of France?"})
        assert result.content[0].text == "LLM response: Paris"
    assert asked == ["Who are you?", "Capital of France?"]


async def test_multi_round_input_keeps_the_backend_request_state(one_backend):
    answers = iter([{"name": "Ada"}, {"color": "green"}])
    asked: list[str] = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content=next(answers))

    async with (
        running_gateway(one_backend) as gw,
        Client(gw.url, mode="legacy", elicitation_callback=elicit) as client,
    ):
        result = await client.call_tool("test_input_required_result_multi_round", {})
    assert result.content[0].text == "Hello Ada, your favorite color is green."
    assert asked == ["Step 1: What is your name?", "Step 2: What is your favorite color?"]


async def test_client_without_the_capability_gets_the_backends_refusal(one_backend):
    async with running_gateway(one_backend) as gw, Client(gw.url, mode="legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("test_missing_capability", {})
    # The modern backend saw the session's (empty) capabilities and refused with -32021.
    assert refused.value.error.code == -32021
    assert refused.value.error.data == {"requiredCapabilities": {"sampling": {}}}


async def test_a_legacy_client_is_served_from_every_backend_of_a_fleet(fleet):
    async with running_gateway(fleet) as gw, Client(gw.url, mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"alpha__test_simple_text", "beta__test_simple_text"} <= names
        for backend in ("alpha", "beta"):
            result = await client.call_tool(f"{backend}__test_simple_text", {})
            assert result.content[0].text == "This is a simple text response for testing."


async def test_legacy_and_modern_clients_share_one_gateway(fleet):
    async with (
        running_gateway(fleet) as gw,
        Client(gw.url, mode="legacy") as legacy,
        Client(gw.url, mode="2026-07-28") as modern,
    ):
        assert legacy.protocol_version == "2025-11-25"
        assert modern.protocol_version == "2026-07-28"
        for client in (legacy, modern):
            result = await client.call_tool("beta__test_simple_text", {})
            assert result.content[0].text == "This is a simple text response for testing."


async def test_custom_header_tools_work_for_legacy_clients(one_backend):
    # test_custom_headers mirrors `region` into Mcp-Param-Region (SEP-2243); a legacy client
    # sends no such header, so the gateway synthesizes it from the arguments.
    async with running_gateway(one_backend) as gw, Client(gw.url, mode="legacy") as client:
        result = await client.call_tool("test_custom_headers", {"region": "eu-wést", "query": "q"})
    assert not result.is_error
    assert result.content[0].text == "region=eu-wést query=q"
