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
from tests.support.gateway import running_gateway
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


def _replicas(backend: Proc, tmp_path_factory: pytest.TempPathFactory, *, host: str = "127.0.0.1",
              advertise: bool = False, backend_settings: dict[str, Any] | None = None) -> list[Proc]:
    """Two gateway processes sharing a secret; with `advertise`, each gets its own URL from
    MCP_GATEWAY_SECURITY__ADVERTISE_URL, the way deploy/kubernetes/base/deployment.yaml sets it."""
    procs: list[Proc] = []
    try:
        for i in range(2):
            port = free_port()
            config = tmp_path_factory.mktemp(f"replica{i}") / "gateway.yaml"
            config.write_text(yaml.safe_dump({
                "server": {"host": host, "port": port},
                "backends": [{"name": "old", "url": backend.url, "era": "legacy", **(backend_settings or {})}],
                "security": {"secret": "shared-test-secret"},
            }))
            env = {"MCP_GATEWAY_SECURITY__ADVERTISE_URL": f"http://127.0.0.1:{port}/mcp"} if advertise else None
            procs.append(gateway_process(Path(config), port=port, env=env).start())
    except Exception:
        for proc in procs:
            proc.stop()
        raise
    return procs


@pytest.fixture(scope="module")
def replicas(backend: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    procs = _replicas(backend, tmp_path_factory)
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


async def test_a_forwarded_retry_keeps_its_mcp_param_headers(replicas: tuple[Proc, Proc]) -> None:
    # The owner validates the forwarded retry again, x-mcp-header parameters included: without
    # Mcp-Param-Region the retry failed there with -32020.
    first, second = replicas
    call = {"name": "ask_in_region", "arguments": {"region": "eu-west", "question": "colour?"}}
    region = {"mcp-param-region": "eu-west"}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await mcp_http.post(http, first.url, "tools/call", call, id="h1", meta=ELICIT,
                                       extra_headers=region)
        result = _answer(response)["result"]
        assert result["resultType"] == "input_required"
        ((key, _),) = result["inputRequests"].items()
        retry = {**call, "inputResponses": {key: {"action": "accept", "content": {"answer": "green"}}},
                 "requestState": result["requestState"]}
        response = await mcp_http.post(http, second.url, "tools/call", retry, id="h2", meta=ELICIT,
                                       extra_headers=region)
        final = _answer(response)
    assert final.get("error") is None, final
    assert final["result"]["content"][0]["text"] == "eu-west: green"


async def test_wildcard_bound_replicas_without_advertise_url_fail_clearly(
        backend: Proc, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Bound to 0.0.0.0 without security.advertise_url, every replica used to advertise
    # http://127.0.0.1:8080/mcp, think it owned every continuation and answer a foreign
    # retry with -32602. Now the start-up log says what is missing, and so does the retry.
    first, second = _replicas(backend, tmp_path_factory, host="0.0.0.0")
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            result = await _first_round(http, first.url)
            ((key, _),) = result["inputRequests"].items()
            retry = {**ASK, "inputResponses": {key: {"action": "accept", "content": {"answer": "x"}}},
                     "requestState": result["requestState"]}
            response = await mcp_http.post(http, second.url, "tools/call", retry, id="w2", meta=ELICIT)
        assert response.status_code == 502
        error = _answer(response)["error"]
        assert error["code"] == -31001 and error["data"] == {"backend": "old"}
        assert "security.advertise_url" in error["message"]
        assert "MCP_GATEWAY_SECURITY__ADVERTISE_URL" in first.output()
    finally:
        first.stop()
        second.stop()


async def test_wildcard_bound_replicas_with_advertise_url_from_the_environment(
        backend: Proc, tmp_path_factory: pytest.TempPathFactory) -> None:
    first, second = _replicas(backend, tmp_path_factory, host="0.0.0.0", advertise=True)
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            result = await _first_round(http, first.url)
            ((key, _),) = result["inputRequests"].items()
            retry = {**ASK, "inputResponses": {key: {"action": "accept", "content": {"answer": "teal"}}},
                     "requestState": result["requestState"]}
            response = await mcp_http.post(http, second.url, "tools/call", retry, id="e2", meta=ELICIT)
        assert _answer(response)["result"]["content"][0]["text"] == "accept: teal"
        assert "ADVERTISE_URL" not in first.output()
    finally:
        first.stop()
        second.stop()


async def test_parked_calls_are_capped_per_principal(backend: Proc) -> None:
    settings = {"backends": [{"name": "old", "url": backend.url, "era": "legacy",
                              "max_parked_calls_per_principal": 1}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=30) as http:
        first = await _first_round(http, gw.url)
        response = await mcp_http.post(http, gw.url, "tools/call", ASK, id="c2", meta=ELICIT)
        assert response.status_code == 429
        error = _answer(response)["error"]
        assert error["code"] == -31004
        assert "backends[].max_parked_calls_per_principal" in error["message"] and "'old'" in error["message"]
        (legacy,) = gw.runtime.backends
        assert len(legacy.continuations) == 1
        # The parked call is unaffected, and once it is resumed there is room again.
        ((key, _),) = first["inputRequests"].items()
        done = await mcp_http.post(http, gw.url, "tools/call",
                                   {**ASK, "inputResponses": {key: {"action": "decline"}},
                                    "requestState": first["requestState"]}, id="c3", meta=ELICIT)
        answer = _answer(done)
        assert answer.get("result", {}).get("content") == [{"type": "text", "text": "decline"}], answer
        again = await mcp_http.post(http, gw.url, "tools/call", ASK, id="c4", meta=ELICIT)
        assert _answer(again)["result"]["resultType"] == "input_required"
