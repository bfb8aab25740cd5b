"""A legacy -32042 URLElicitationRequiredError through the gateway (digest §h.5, §h.7): never
emitted to a modern client; an InputRequiredResult with URL-mode elicitations when the client
declared `elicitation.url`, -32021 naming that capability otherwise. The backend is a real
mcp==1.30.0 server whose `connect_account` tool raises the error until its URL was visited."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support import legacy_venv, mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import Proc

URL_CAPABLE = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}, "url": {}}}}
FORM_ONLY = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}


@pytest.fixture(scope="module")
def backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-url-elicitation").start()
    yield proc
    proc.stop()


def settings(backend: Proc) -> dict[str, object]:
    return {"backends": [{"name": "old", "url": backend.url, "era": "legacy"}]}


async def test_url_elicitation_becomes_input_required_and_the_retry_reissues_the_call(backend: Proc) -> None:
    call = {"name": "connect_account", "arguments": {"account": "alice"}}
    async with running_gateway(settings(backend)) as gw, httpx.AsyncClient(timeout=30) as http:
        first = await mcp_http.post(http, gw.url, "tools/call", call, meta=URL_CAPABLE)
        assert first.status_code == 200
        result = first.json()["result"]
        assert result["resultType"] == "input_required"
        [(key, request)] = result["inputRequests"].items()
        assert request["method"] == "elicitation/create"
        params = request["params"]
        assert params["mode"] == "url" and params["message"] == "Authorize access to alice"
        assert "elicitationId" not in params  # legacy-only (CL minor 11)

        # The user opens the URL (here: the backend's own /authorize), then the client retries.
        assert (await http.get(params["url"])).status_code == 200
        retry = await mcp_http.post(http, gw.url, "tools/call",
                                    {**call, "inputResponses": {key: {"action": "accept"}},
                                     "requestState": result["requestState"]}, id=2, meta=URL_CAPABLE)
        done = retry.json()
        assert done["id"] == 2
        assert done["result"]["resultType"] == "complete"
        assert done["result"]["content"][0]["text"] == "connected: alice"


async def test_the_state_is_bound_to_the_original_request(backend: Proc) -> None:
    async with running_gateway(settings(backend)) as gw, httpx.AsyncClient(timeout=30) as http:
        first = await mcp_http.post(http, gw.url, "tools/call",
                                    {"name": "connect_account", "arguments": {"account": "bob"}}, meta=URL_CAPABLE)
        state = first.json()["result"]["requestState"]
        other = await mcp_http.post(http, gw.url, "tools/call",
                                    {"name": "connect_account", "arguments": {"account": "mallory"},
                                     "inputResponses": {}, "requestState": state}, id=2, meta=URL_CAPABLE)
        assert other.status_code == 400
        assert other.json()["error"]["code"] == -32602
        assert "different request" in other.json()["error"]["message"]


async def test_a_client_without_url_elicitation_learns_what_it_lacks(backend: Proc) -> None:
    async with running_gateway(settings(backend)) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await mcp_http.post(http, gw.url, "tools/call",
                                       {"name": "connect_account", "arguments": {"account": "carol"}},
                                       meta=FORM_ONLY)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == -32021
        assert error["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}
        assert "'old'" in error["message"] and "URL elicitation" in error["message"]
