"""MRTR in front of a legacy backend, on the wire: the sealed requestState, its checks, and a
retry that lands on another gateway replica (two gateway processes, one shared secret)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import legacy_venv, mcp_http
from tests.support.procs import Proc, free_port, gateway_process

ELICIT = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
ASK = {"name": "ask_user", "arguments": {"question": "colour?"}}


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        return mcp_http.sse_messages(response.text)[-1]
    return response.json()


@pytest.fixture(scope="module")
def backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-mrtr").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def replicas(backend: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    procs = []
    for i in range(2):
        port = free_port()
        config = tmp_path_factory.mktemp(f"replica{i}") / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "server": {"port": port},
            "backends": [{"name": "old", "url": backend.url, "era": "legacy"}],
            "security": {"secret": "shared-test-secret"},
        }))
        procs.append(gateway_process(Path(config), port=port).start())
    yield procs[0], procs[1]
    for proc in procs:
        proc.stop()


async def _first_round(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    response = await mcp_http.post(http, url, "tools/call", ASK, id="c1", meta=ELICIT)
    result = _answer(response)["result"]
    assert result["resultType"] == "input_required"
    return result


async def test_retry_on_another_replica_completes_the_call(replicas: tuple[Proc, Proc]) -> None:
    first, second = replicas
    async with httpx.AsyncClient(timeout=30) as http:
        result = await _first_round(http, first.url)
        ((key, request),) = result["inputRequests"].items()
        assert request["method"] == "elicitation/create"
        assert request["params"]["message"] == "colour?"
        retry = {**ASK, "inputResponses": {key: {"action": "accept", "content": {"answer": "blue"}}},
                 "requestState": result["requestState"]}
        response = await mcp_http.post(http, second.url, "tools/call", retry, id="c2", meta=ELICIT)
        final = _answer(response)
    assert final["id"] == "c2"
    assert final["result"]["content"][0]["text"] == "accept: blue"
    assert final["result"]["resultType"] == "complete"


async def test_tampered_or_replayed_state_is_invalid_params(replicas: tuple[Proc, Proc]) -> None:
    first, _ = replicas
    async with httpx.AsyncClient(timeout=30) as http:
        result = await _first_round(http, first.url)
        ((key, _),) = result["inputRequests"].items()
        answer = {key: {"action": "accept", "content": {"answer": "red"}}}
        state = result["requestState"]
        tampered = state[:-2] + ("AA" if not state.endswith("AA") else "BB")
        bad = await mcp_http.post(http, first.url, "tools/call",
                                  {**ASK, "inputResponses": answer, "requestState": tampered}, id="c2", meta=ELICIT)
        assert _answer(bad)["error"]["code"] == -32602
        other_request = {"name": "ask_user", "arguments": {"question": "something else?"}}
        mismatched = await mcp_http.post(http, first.url, "tools/call",
                                         {**other_request, "inputResponses": answer, "requestState": state},
                                         id="c3", meta=ELICIT)
        assert _answer(mismatched)["error"]["code"] == -32602
        good = await mcp_http.post(http, first.url, "tools/call",
                                   {**ASK, "inputResponses": answer, "requestState": state}, id="c4", meta=ELICIT)
        assert _answer(good)["result"]["content"][0]["text"] == "accept: red"
        replay = await mcp_http.post(http, first.url, "tools/call",
                                     {**ASK, "inputResponses": answer, "requestState": state}, id="c5", meta=ELICIT)
        assert _answer(replay)["error"]["code"] == -32602


async def test_retry_without_the_answer_asks_again(replicas: tuple[Proc, Proc]) -> None:
    first, _ = replicas
    async with httpx.AsyncClient(timeout=30) as http:
        result = await _first_round(http, first.url)
        again = await mcp_http.post(http, first.url, "tools/call",
                                    {**ASK, "inputResponses": {}, "requestState": result["requestState"]},
                                    id="c2", meta=ELICIT)
        second = _answer(again)["result"]
        assert second["resultType"] == "input_required"
        assert second["inputRequests"] == result["inputRequests"]
        ((key, _),) = second["inputRequests"].items()
        done = await mcp_http.post(http, first.url, "tools/call",
                                   {**ASK, "inputResponses": {key: {"action": "decline"}},
                                    "requestState": second["requestState"]}, id="c3", meta=ELICIT)
        assert _answer(done)["result"]["content"][0]["text"] == "decline"
