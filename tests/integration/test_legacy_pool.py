"""The legacy session pool under hostile and busy load (gateway/backends/legacy/pool.py),
and the overall deadline of a legacy call: the real mcp==1.30.0 fixture behind an
in-process gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import legacy_venv, mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import Proc

ELICIT = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
ASK = {"name": "ask_user", "arguments": {"question": "colour?"}}


@pytest.fixture(scope="module")
def backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-pool").start()
    yield proc
    proc.stop()


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        return mcp_http.sse_messages(response.text)[-1]
    return response.json()


async def test_distinct_capability_objects_share_one_session(backend: Proc) -> None:
    # The reproduction: every distinct capability object used to open (and keep a lock for)
    # its own backend session, evicting real users' warm ones.
    async with running_gateway({"backends": [{"name": "old", "url": backend.url, "era": "legacy"}]}) as gw:
        (legacy,) = gw.runtime.backends
        before = {id(s) for s in legacy.pool.sessions()}
        async with httpx.AsyncClient(timeout=30) as http:
            answers = await asyncio.gather(*(
                mcp_http.post(http, gw.url, "tools/call", {"name": "echo", "arguments": {"text": str(i)}}, id=i,
                              meta={"io.modelcontextprotocol/clientCapabilities": {
                                  "sampling": {"nonce": i}, "elicitation": {"form": {}, "nonce": i}}})
                for i in range(60)))
        assert [_answer(a)["result"]["content"][0]["text"] for a in answers] == [str(i) for i in range(60)]
        opened = [s for s in legacy.pool.sessions() if id(s) not in before]
        assert len(opened) == 1
        assert opened[0].capabilities == {"sampling": {}, "elicitation": {"form": {}}}
        assert not legacy.pool._opening  # nothing per key outlives its handshake


async def test_the_pool_is_bounded_even_when_every_session_is_busy(backend: Proc) -> None:
    settings = {"backends": [{"name": "old", "url": backend.url, "era": "legacy", "session_pool_size": 1,
                              "connect_timeout_seconds": 0.5}]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient(timeout=30) as http:
        (legacy,) = gw.runtime.backends
        # A parked MRTR call keeps its session busy until the retry.
        first = _answer(await mcp_http.post(http, gw.url, "tools/call", ASK, id="p1", meta=ELICIT))["result"]
        assert first["resultType"] == "input_required"
        # Another capability set needs a second session: no room, none frees up in time.
        refused = await mcp_http.post(http, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}},
                                      id="p2")
        assert refused.status_code == 503
        error = _answer(refused)["error"]
        assert error["code"] == -31004 and error["data"]["backend"] == "old"
        assert "'old'" in error["message"] and "backends[].session_pool_size" in error["message"]
        assert len(legacy.pool.sessions()) == 1
        # The parked call completes; its session is then idle and makes room.
        ((key, _),) = first["inputRequests"].items()
        done = await mcp_http.post(http, gw.url, "tools/call",
                                   {**ASK, "inputResponses": {key: {"action": "decline"}},
                                    "requestState": first["requestState"]}, id="p3", meta=ELICIT)
        assert _answer(done)["result"]["content"][0]["text"] == "decline"
        echo = await mcp_http.post(http, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "y"}}, id="p4")
        assert _answer(echo)["result"]["content"][0]["text"] == "y"
        assert len(legacy.pool.sessions()) == 1


async def test_a_call_that_keeps_sending_progress_still_ends_at_max_call_seconds(backend: Proc) -> None:
    # Progress every 50 ms resets any per-message timeout; only an overall deadline ends it.
    settings = {"backends": [{"name": "old", "url": backend.url, "era": "legacy", "timeout_seconds": 30,
                              "max_call_seconds": 0.5}]}
    call = {"name": "slow_progress", "arguments": {"steps": 60, "delay": 0.05}, "_meta": {"progressToken": "t"}}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await mcp_http.post(http, gw.url, "tools/call", call, id="slow", meta={"progressToken": "t"})
        messages = mcp_http.sse_messages(response.text)
    assert any(m.get("method") == "notifications/progress" for m in messages)
    error = messages[-1]["error"]
    assert error["code"] == -31002 and error["data"]["backend"] == "old"
    assert "backends[].max_call_seconds" in error["message"] and "0.5s" in error["message"]
