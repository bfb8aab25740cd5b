"""stdio backends that misbehave (gateway/backends/legacy/stdio.py): a command that cannot
start, garbage and oversized lines on stdout, and a process that ignores its shutdown. Each
is a real subprocess (tests/fixtures/servers/raw_stdio.py) behind a real in-process gateway;
the client sees a gateway error that names the backend, and everything else keeps serving.

STDIO §Messages: stdout carries only valid MCP messages, so anything else is the server's
fault and is dropped, not fatal. §Shutdown: close stdin, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import httpx
import pytest

from gateway.backends.legacy.stdio import _LINE_LIMIT
from tests.support.gateway import running_gateway
from tests.support.mcp_http import post, sse_messages
from tests.support.procs import FIXTURE_SERVERS

RAW = [sys.executable, str(FIXTURE_SERVERS / "raw_stdio.py")]


def _backend(name: str, *extra: str, **settings: object) -> dict[str, object]:
    return {"name": name, "command": [*RAW, *extra], "prefix": f"{name}_", "era": "modern", **settings}


async def _echo(http: httpx.AsyncClient, url: str, backend: str, text: str) -> httpx.Response:
    return await post(http, url, "tools/call", {"name": f"{backend}_echo", "arguments": {"text": text}})


def _answer(response: httpx.Response) -> dict:
    """The JSON-RPC answer, relayed as JSON or (stdio answers are streams) as SSE."""
    if response.headers["content-type"].startswith("text/event-stream"):
        return sse_messages(response.text)[-1]
    return response.json()


def _text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return _answer(response)["result"]["content"][0]["text"]


async def test_a_command_that_cannot_start_is_reported_and_spares_the_fleet(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.ERROR, logger="gateway.backends.stdio")
    settings = {"backends": [
        {"name": "broken", "command": ["/nonexistent/mcp-server"], "connect_timeout_seconds": 0.5},
        _backend("ok"),
    ]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False) as http:
        assert _text(await _echo(http, gw.url, "ok", "still here")) == "still here"
        ready = (await http.get(f"{gw.base}/readyz")).json()
        assert ready["status"] == "ready" and ready["backends"]["ok"] == "ok"
        assert "not running" in ready["backends"]["broken"], ready
    assert any("cannot start '/nonexistent/mcp-server'" in r.getMessage() for r in caplog.records)


async def test_garbage_on_stdout_is_dropped_and_the_call_still_answered(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="gateway.backends.stdio")
    async with running_gateway({"backends": [_backend("raw")]}) as gw, httpx.AsyncClient(trust_env=False) as http:
        pid = gw.runtime.backends[0].process.pid
        response = await post(http, gw.url, "tools/call", {"name": "raw_noisy", "arguments": {"text": "through"}})
        assert _text(response) == "through"
        assert gw.runtime.backends[0].process.pid == pid, "noise must not cost the process its life"
        assert _text(await _echo(http, gw.url, "raw", "next")) == "next"
    assert any("non-JSON line on stdout dropped" in r.getMessage() for r in caplog.records)


async def test_an_oversized_line_stops_the_process_and_a_new_one_serves(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.ERROR, logger="gateway.backends.stdio")
    settings = {"backends": [_backend("raw", restart_backoff_seconds=0.05)]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=30) as http:
        process = gw.runtime.backends[0].process
        first = process.pid
        response = await post(http, gw.url, "tools/call",
                              {"name": "raw_huge", "arguments": {"bytes": _LINE_LIMIT + 1}})
        error = _answer(response)["error"]
        assert error["code"] == -31001 and error["data"]["backend"] == "raw"
        assert "exited" in error["message"], error
        for _ in range(200):
            if process.pid not in (None, first):
                break
            await asyncio.sleep(0.05)
        assert _text(await _echo(http, gw.url, "raw", "new process")) == "new process"
        assert process.pid != first
    assert any("exceeded" in r.getMessage() for r in caplog.records)


async def test_a_process_that_ignores_shutdown_is_killed():
    """stdin closed and SIGTERM both ignored: the gateway's shutdown still completes, and the
    process is gone (SIGKILL), not left behind as an orphan."""
    async with running_gateway({"backends": [_backend("wedged", "--stubborn")]}) as gw, \
            httpx.AsyncClient(trust_env=False) as http:
        assert _text(await _echo(http, gw.url, "wedged", "up")) == "up"
        pid = gw.runtime.backends[0].process.pid
        assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not merely signalled
