"""Initialize-era clients of the HTTP+SSE transport (2024-11-05) through the gateway
(gateway/legacy_clients/sse_front.py): the official SDK's `sse_client` in mode="legacy", and
raw HTTP where every byte matters, against the gateway in front of a real modern backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.sse import sse_client

from tests.support.gateway import RunningGateway, running_gateway

pytestmark = pytest.mark.filterwarnings("ignore:.*(ping is removed|logging capability is deprecated).*")


@pytest.fixture
async def gateway(conformance_backend) -> AsyncIterator[RunningGateway]:
    async with running_gateway({"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}]}) as gw:
        yield gw


def sse_url(gw: RunningGateway) -> str:
    return gw.url.rsplit("/", 1)[0] + "/sse"


class RawSseClient:
    """The transport by hand: the GET stream, its endpoint, POSTs, messages read off the stream."""

    def __init__(self, http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> None:
        self.http, self.url, self.headers = http, url, headers or {}
        self.endpoint = ""

    async def __aenter__(self) -> RawSseClient:
        self._cm = self.http.stream("GET", self.url, headers={"accept": "text/event-stream", **self.headers})
        self.response = await self._cm.__aenter__()
        assert self.response.status_code == 200
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self._events = self._read_events()
        event, data = await anext(self._events)
        assert event == "endpoint"
        self.endpoint = str(httpx.URL(self.url).join(data))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._cm.__aexit__(*exc)

    async def _read_events(self) -> AsyncIterator[tuple[str, str]]:
        event, data = "message", []
        async for line in self.response.aiter_lines():
            if line == "":
                if data:
                    yield event, "\n".join(data)
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())

    async def post(self, message: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
        content = message if isinstance(message, bytes) else json.dumps(message)
        return await self.http.post(self.endpoint, content=content,
                                    headers={"content-type": "application/json", **self.headers, **headers})

    async def next_message(self, timeout: float = 10) -> dict[str, Any]:
        while True:
            event, data = await asyncio.wait_for(anext(self._events), timeout)
            if event == "message":
                return json.loads(data)

    async def initialize(self, version: str = "2024-11-05", capabilities: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
        accepted = await self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": capabilities or {},
            "clientInfo": {"name": "raw", "version": "0"}}})
        assert accepted.status_code == 202
        answer = await self.next_message()
        assert answer["id"] == 0
        assert (await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
        return answer["result"]


async def test_the_sdk_sse_client_is_served_from_the_fleet(gateway: RunningGateway) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with Client(sse_client(sse_url(gateway)), mode="legacy") as client:
        assert client.server_info is not None and client.server_info.name == "mcp-gateway"
        tools = await client.list_tools()
        assert "test_simple_text" in {t.name for t in tools.tools}
        result = await client.call_tool("test_simple_text", {})
        assert result.content[0].text == "This is a simple text response for testing."
        read = await client.read_resource("test://static-text")
        assert read.contents[0].text == "This is the content of the static text resource."
        progress = await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        assert not progress.is_error
    assert seen == [0, 50, 100]


async def test_input_required_becomes_requests_on_the_stream(gateway: RunningGateway) -> None:
    async def elicit(context, params):  # noqa: ANN001
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async with Client(sse_client(sse_url(gateway)), mode="legacy", elicitation_callback=elicit) as client:
        result = await client.call_tool("test_elicitation", {"message": "Who are you?"})
    assert result.content[0].text == (
        'User response: action=accept, content={"email": "ada@example.com", "username": "ada"}')


async def test_2024_11_05_is_negotiated_only_on_its_own_transport(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(timeout=10) as http, RawSseClient(http, sse_url(gateway)) as client:
        assert client.endpoint.startswith(sse_url(gateway) + "/messages?session_id=")
        result = await client.initialize("2024-11-05")
        assert result["protocolVersion"] == "2024-11-05"
        assert (await client.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).status_code == 202
        listed = await client.next_message()
        assert listed["id"] == 1 and "test_simple_text" in {t["name"] for t in listed["result"]["tools"]}
        # The same request on the Streamable HTTP endpoint gets that transport's revision.
        init = await http.post(gateway.url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
            headers={"accept": "application/json, text/event-stream"})
        assert init.json()["result"]["protocolVersion"] == "2025-11-25"


async def test_list_changes_arrive_on_the_one_stream(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient(timeout=10) as http, RawSseClient(http, sse_url(gateway)) as client:
        await client.initialize("2025-11-25")
        for attempt in range(2):  # add the fixture's dynamic tool, then remove it again
            await client.post({"jsonrpc": "2.0", "id": 10 + attempt, "method": "tools/call",
                               "params": {"name": "test_trigger_tool_change", "arguments": {}}})
            got: dict[int | str, dict[str, Any]] = {}
            while len(got) < 2:
                message = await client.next_message()
                got[message.get("id", message.get("method"))] = message
            assert got[10 + attempt]["result"]["content"][0]["text"] == "tool list changed"
            assert "notifications/tools/list_changed" in got


async def test_a_session_belongs_to_its_stream_and_its_principal(gateway: RunningGateway) -> None:
    sessions = gateway.app.legacy_clients.sessions
    async with httpx.AsyncClient(timeout=10) as http:
        async with RawSseClient(http, sse_url(gateway), {"authorization": "Bearer alice"}) as client:
            await client.initialize()
            assert len(sessions) == 1
            stranger = await http.post(client.endpoint, content=b"{}",
                                       headers={"content-type": "application/json", "authorization": "Bearer bob"})
            assert stranger.status_code == 404
            unknown = await http.post(client.endpoint.split("?")[0] + "?session_id=nope", content=b"{}",
                                      headers={"authorization": "Bearer alice"})
            assert unknown.status_code == 404
            garbage = await client.post(b"not json")
            assert garbage.status_code == 400 and garbage.json()["error"]["code"] == -32700
        # The client's stream ended: so did its gateway session.
        for _ in range(100):
            if len(sessions) == 0:
                break
            await asyncio.sleep(0.02)
        assert len(sessions) == 0
        gone = await http.post(client.endpoint, content=b"{}", headers={"authorization": "Bearer alice"})
        assert gone.status_code == 404


async def test_shutdown_ends_the_streams(gateway: RunningGateway) -> None:
    """The server's graceful drain must not wait for HTTP+SSE clients that never leave."""
    async with httpx.AsyncClient(timeout=10) as http, RawSseClient(http, sse_url(gateway)) as client:
        await client.initialize()
        await gateway.app.begin_shutdown()
        with pytest.raises(StopAsyncIteration):
            await client.next_message(timeout=5)


async def test_streams_beyond_the_limit_get_503_and_other_methods_405(conformance_backend) -> None:
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
              "server": {"legacy_max_sessions": 1}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        async with RawSseClient(http, sse_url(gw)):
            second = await http.get(sse_url(gw), headers={"accept": "text/event-stream"})
            assert second.status_code == 503
            assert "legacy_max_sessions" in second.json()["error"]["message"]
        assert (await http.post(sse_url(gw), content=b"{}")).status_code == 405
        assert (await http.get(sse_url(gw) + "/messages")).status_code == 405


async def test_off_when_legacy_clients_are_off(conformance_backend) -> None:
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
              "server": {"legacy_clients": False}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(sse_url(gw), headers={"accept": "text/event-stream"})).status_code == 404


async def test_a_quiet_stream_gets_keepalive_comments(conformance_backend) -> None:
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
              "server": {"keepalive_seconds": 0.2}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", sse_url(gw), headers={"accept": "text/event-stream"}) as stream:
            lines = stream.aiter_lines()
            seen = [await asyncio.wait_for(anext(lines), 5) for _ in range(4)]
    assert seen[0] == "event: endpoint" and ": keepalive" in seen


def _requests_total(text: str, method: str, era: str) -> float:
    """mcp_gateway_requests_total summed over status and code for one method and era."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("mcp_gateway_requests_total{") and f'method="{method}"' in line and f'era="{era}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_http_sse_messages_are_counted_by_their_own_method(gateway: RunningGateway) -> None:
    # The POSTs carry no Mcp-Method header: the telemetry step reads the method from the body
    # (docs/observability.md), so HTTP+SSE clients are counted like every other.
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        before = (await http.get(f"{gateway.base}/metrics")).text
        async with RawSseClient(http, sse_url(gateway)) as sse:
            await sse.initialize()
            accepted = await sse.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                       "params": {"name": "test_simple_text", "arguments": {}}})
            assert accepted.status_code == 202 and accepted.headers["x-request-id"]
            assert (await sse.next_message())["id"] == 1
        after = (await http.get(f"{gateway.base}/metrics")).text
    for method in ("initialize", "notifications/initialized", "tools/call"):
        assert _requests_total(after, method, "legacy") - _requests_total(before, method, "legacy") == 1, method
