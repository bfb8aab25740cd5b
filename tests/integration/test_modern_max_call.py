"""`backends[].max_call_seconds` on a modern backend's SSE answer (gateway/backends/modern.py):
the scripted fixture holds a call open after its first progress event."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.scripted import Scripted


@pytest.fixture(scope="module")
def held() -> Iterator[Scripted]:
    backend = Scripted("held").start()
    yield backend
    backend.stop()


async def test_a_held_stream_ends_at_max_call_seconds_and_the_backend_sees_it_go(held: Scripted) -> None:
    settings = {"backends": [{"name": "held", "url": held.url, "era": "modern", "timeout_seconds": 30,
                              "max_call_seconds": 0.5}]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await mcp_http.post(http, gw.url, "tools/call", {"name": "gated", "arguments": {"key": "k1"}},
                                       id="g1", meta={"progressToken": "p"})
        messages = mcp_http.sse_messages(response.text)
        assert messages[0]["method"] == "notifications/progress"
        error = messages[-1]["error"]
        assert messages[-1]["id"] == "g1"
        assert error["code"] == -31002 and error["data"]["backend"] == "held"
        assert "backends[].max_call_seconds" in error["message"]
        for _ in range(100):  # the upstream stream was closed: the backend records the cancel
            if "k1" in (await held.state())["cancelled"]:
                break
        assert "k1" in (await held.state())["cancelled"]
