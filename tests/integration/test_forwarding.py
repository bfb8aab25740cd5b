"""Forwarding over real HTTP (digest §c, §f, §a.4): JSON relayed, SSE relayed event by event as
it arrives, a client disconnect cancels the backend's work, MRTR round trips stay on one
backend, gateway-made errors name the backend, per-backend timeouts, retries only for
idempotent reads and only before any byte reached the client, and a backend killed mid-test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import refused_url
from tests.support.scripted import Scripted


@pytest.fixture
async def gw(alpha, beta):
    settings = {"backends": [{"name": "alpha", "url": alpha.url, "timeout_seconds": 1.0,
                              "resource_prefixes": ["scripted://alpha/"]},
                             {"name": "beta", "url": beta.url}]}
    async with running_gateway(settings) as gw:
        yield gw


@pytest.fixture
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=15) as c:
        yield c


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """JSON-RPC messages of an SSE response, yielded as each event completes."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            data = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
            if data:
                yield orjson.loads(b"\n".join(data))


async def eventually(predicate, what: str) -> None:
    """Wait (bounded) for something the backend records asynchronously."""
    for _ in range(200):
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def stream_request(client: httpx.AsyncClient, gw: Any, tool: str, arguments: dict[str, Any], *, id: Any,
                   token: Any = None):
    meta = {"progressToken": token} if token is not None else None
    return client.stream("POST", gw.url, content=orjson.dumps(
        mcp_http.body("tools/call", {"name": tool, "arguments": arguments}, id=id, meta=meta)),
        headers=mcp_http.headers("tools/call", tool))


# -- JSON and SSE relay ---------------------------------------------------------------------


async def test_json_answer_passes_through(gw, client):
    response = await mcp_http.post(client, gw.url, "tools/call", {"name": "alpha__echo", "arguments": {"text": "j"}},
                                   id="json-1")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"jsonrpc": "2.0", "id": "json-1", "result": {
        "resultType": "complete", "content": [{"type": "text", "text": "alpha: j"}], "isError": False}}


async def test_sse_is_relayed_event_by_event_as_it_arrives(gw, client, alpha):
    async with stream_request(client, gw, "alpha__gated", {"key": "relay"}, id="sse-1", token="tok-1") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        events = sse_events(response)
        first = await anext(events)
        # The first progress event reached us while the backend is still holding the result:
        # it cannot have sent the final response before the test releases it.
        assert first["method"] == "notifications/progress"
        assert first["params"] == {"progressToken": "tok-1", "progress": 1, "message": "relay: waiting"}
        assert "relay" not in (await alpha.state())["finished"]
        await alpha.release("relay")
        rest = [message async for message in events]
    assert [m.get("method") for m in rest] == ["notifications/progress", None]
    assert rest[0]["params"]["progress"] == 2
    assert rest[1] == {"jsonrpc": "2.0", "id": "sse-1", "result": {
        "resultType": "complete", "content": [{"type": "text", "text": "alpha: relay released"}], "isError": False}}
    assert "relay" in (await alpha.state())["finished"]


async def test_closing_the_stream_cancels_the_upstream_request(gw, client, alpha):
    async with stream_request(client, gw, "alpha__gated", {"key": "walk-away"}, id="sse-2", token=7) as response:
        first = await anext(sse_events(response))
        assert first["method"] == "notifications/progress"
    # The client closed its stream: the backend must see its own request go away.

    async def cancelled() -> bool:
        return "walk-away" in (await alpha.state())["cancelled"]

    await eventually(cancelled, "the backend saw the gated call cancelled")
    assert "walk-away" not in (await alpha.state())["finished"]


async def test_closing_a_json_request_cancels_the_upstream_request(gw, client, beta):
    body = mcp_http.body("tools/call", {"name": "beta__slow", "arguments": {"seconds": 30}}, id="slow-walk")
    task = asyncio.ensure_future(client.post(gw.url, content=orjson.dumps(body),
                                             headers=mcp_http.headers("tools/call", "beta__slow")))

    async def started() -> bool:
        return any(c["id"] == "slow-walk" for c in await beta.calls("tools/call"))

    await eventually(started, "the slow call reached the backend")
    task.cancel()  # the client gives up and closes its connection
    with pytest.raises(asyncio.CancelledError):
        await task

    async def cancelled() -> bool:
        return "slow-slow-walk" in (await beta.state())["cancelled"]

    await eventually(cancelled, "the backend saw the slow call cancelled")


# -- results and errors ---------------------------------------------------------------------


async def test_results_always_carry_result_type(gw, client):
    response = await mcp_http.post(client, gw.url, "tools/call", {"name": "beta__bare"})
    assert response.json()["result"] == {"content": [], "resultType": "complete"}


async def test_input_required_round_trip_stays_on_one_backend(gw, client, alpha, beta):
    first = await mcp_http.post(client, gw.url, "tools/call", {"name": "alpha__ask"}, id="mrtr-1")
    result = first.json()["result"]
    assert result["resultType"] == "input_required"
    assert result["inputRequests"]["answer"]["method"] == "elicitation/create"
    assert result["requestState"] == "alpha-state"
    retry = await mcp_http.post(client, gw.url, "tools/call", {
        "name": "alpha__ask",
        "inputResponses": {"answer": {"action": "accept", "content": {"value": "42"}}},
        "requestState": result["requestState"],
    }, id="mrtr-2")
    assert retry.json()["result"]["content"][0]["text"] == "alpha got 42"
    seen = [c for c in await alpha.calls("tools/call") if c["id"] == "mrtr-2"]
    assert seen and seen[0]["params"]["requestState"] == "alpha-state"  # forwarded unchanged
    assert not [c for c in await beta.calls("tools/call") if c["id"] in ("mrtr-1", "mrtr-2")]


async def test_backend_errors_keep_their_code(gw, client):
    for code in (-32603, -32602, 12345):
        response = await mcp_http.post(client, gw.url, "tools/call",
                                       {"name": "alpha__fail", "arguments": {"code": code, "message": "own"}})
        assert response.json()["error"] == {"code": code, "message": "own"}


async def test_unreachable_backend_is_a_gateway_error_naming_it(alpha, client):
    dead = refused_url()
    settings = {"backends": [{"name": "alpha", "url": alpha.url}, {"name": "nowhere", "url": dead}]}
    async with running_gateway(settings, discover=False) as gw:
        response = await mcp_http.post(client, gw.url, "tools/call", {"name": "nowhere__echo"}, id="dead-1")
        assert response.status_code == 502
        body = response.json()
        assert body["id"] == "dead-1"
        assert body["error"]["code"] == -31001
        assert body["error"]["data"] == {"backend": "nowhere"}
        assert "'nowhere'" in body["error"]["message"]


async def test_timeouts_are_per_backend(gw, client):
    # alpha allows 1 s; beta keeps the default. The same slow call fails on one only.
    late = await mcp_http.post(client, gw.url, "tools/call", {"name": "alpha__slow", "arguments": {"seconds": 3}},
                               id="late")
    assert late.status_code == 504
    error = late.json()["error"]
    # The attempt's read timeout or the call's budget (both 1 s here), whichever fires first.
    assert error["code"] == -31002 and error["data"]["backend"] == "alpha"
    assert "1s" in error["message"]  # says which deadline was missed
    on_time = await mcp_http.post(client, gw.url, "tools/call", {"name": "beta__slow", "arguments": {"seconds": 1.5}})
    assert on_time.json()["result"]["content"][0]["text"] == "beta: slept"


async def test_idempotent_read_is_retried_before_any_byte_reached_the_client(gw, client, alpha):
    response = await mcp_http.post(client, gw.url, "resources/read", {"uri": "scripted://alpha/flaky/r1"})
    assert response.status_code == 200, response.text
    assert response.json()["result"]["contents"][0]["text"] == "alpha: flaky/r1"
    assert (await alpha.state())["attempts"]["flaky/r1"] == 2  # failed once, retried once


async def test_tool_calls_are_never_retried(gw, client, alpha):
    response = await mcp_http.post(client, gw.url, "tools/call", {"name": "alpha__flaky_tool",
                                                                  "arguments": {"key": "t1"}})
    assert response.json()["error"]["code"] == -31001
    assert (await alpha.state())["attempts"]["t1"] == 1


async def test_a_read_is_not_retried_once_bytes_reached_the_client(gw, client, alpha):
    uri = "scripted://alpha/broken/b1"
    body = mcp_http.body("resources/read", {"uri": uri}, id="broken-1", meta={"progressToken": "b"})
    async with client.stream("POST", gw.url, content=orjson.dumps(body),
                             headers=mcp_http.headers("resources/read", uri)) as response:
        messages = [m async for m in sse_events(response)]
    assert messages[0]["method"] == "notifications/progress"
    # The stream broke after an event was relayed: the answer is an error naming the backend,
    # not a second attempt whose events would be spliced onto the first.
    final = messages[-1]
    assert final["id"] == "broken-1"
    assert final["error"]["code"] in (-31001, -31003)
    assert final["error"]["data"] == {"backend": "alpha"}
    assert len(messages) == 2
    assert (await alpha.state())["attempts"]["broken/b1"] == 1


# -- a backend killed mid-test -------------------------------------------------------------


async def test_killed_backend_fails_alone_and_by_name(client):
    steady, doomed = Scripted("steady").start(), Scripted("doomed").start()
    try:
        settings = {"backends": [{"name": "steady", "url": steady.url}, {"name": "doomed", "url": doomed.url}]}
        async with running_gateway(settings) as gw:
            before = await mcp_http.post(client, gw.url, "tools/call", {"name": "doomed__echo",
                                                                        "arguments": {"text": "x"}})
            assert before.json()["result"]["content"][0]["text"] == "doomed: x"
            doomed.kill()
            dead = await mcp_http.post(client, gw.url, "tools/call", {"name": "doomed__echo",
                                                                      "arguments": {"text": "x"}})
            assert dead.status_code == 502
            assert dead.json()["error"]["code"] == -31001
            assert dead.json()["error"]["data"] == {"backend": "doomed"}
            alive = await mcp_http.post(client, gw.url, "tools/call", {"name": "steady__echo",
                                                                       "arguments": {"text": "y"}})
            assert alive.json()["result"]["content"][0]["text"] == "steady: y"
            listed = await mcp_http.post(client, gw.url, "prompts/list")
            assert listed.status_code == 200
            assert {p["name"].split("__")[0] for p in listed.json()["result"]["prompts"]} == {"steady"}
    finally:
        steady.stop()
        doomed.stop()
