"""stdio backends that misbehave (gateway/backends/stdio_process.py, stdio.py, legacy/stdio.py): a command that cannot
start, garbage and oversized lines on stdout, a process that ignores its shutdown, and one
that keeps a call alive with progress for ever (max_call_seconds). Each
is a real subprocess (tests/fixtures/servers/raw_stdio.py) behind a real in-process gateway;
the client sees a gateway error that names the backend, and everything else keeps serving.

STDIO §Messages: stdout carries only valid MCP messages, so anything else is the server's
fault and is dropped, not fatal. §Shutdown: close stdin, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

import httpx
import pytest

from gateway.backends.base import internal_call
from gateway.backends.stdio_process import _LINE_LIMIT
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
    caplog.set_level(logging.WARNING, logger="gateway.backends.health")
    settings = {"backends": [
        {"name": "broken", "command": ["/nonexistent/mcp-server"], "connect_timeout_seconds": 0.5},
        _backend("ok"),
    ]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False) as http:
        assert _text(await _echo(http, gw.url, "ok", "still here")) == "still here"
        ready = (await http.get(f"{gw.base}/readyz")).json()
        assert ready["status"] == "ready" and ready["backends"]["ok"] == "ok"
        assert ready["backends"]["broken"] == "failing", ready  # the why goes to the log only
    assert any("cannot start '/nonexistent/mcp-server'" in r.getMessage() for r in caplog.records)
    assert any("broken: down" in r.getMessage() and "not running" in r.getMessage() for r in caplog.records)


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


# A bound on each wait, a safety net only: a call that is never cut off fails here, not by hanging.
_SAFETY = 20
_MAX_CALL = 0.5


async def _cancelled(http: httpx.AsyncClient, url: str) -> list[str]:
    """What the fixture saw cancelled. It reads its stdin in order, so a cancellation written
    before this call has been handled by the time it answers."""
    return json.loads(_text(await post(http, url, "tools/call", {"name": "raw_cancelled", "arguments": {}})))


async def test_a_call_kept_alive_by_progress_ends_at_max_call_seconds():
    """SHTTP: senders SHOULD enforce a maximum duration, however lively the stream. The
    fixture's `tick` sends progress every 50 ms and never answers: the progress is relayed,
    then the stream ends with -31002 naming the setting, the process is told with
    notifications/cancelled (STDIO §Cancellation), and the process goes on serving."""
    settings = {"backends": [_backend("raw", max_call_seconds=_MAX_CALL)]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=_SAFETY) as http:
        response = await asyncio.wait_for(post(
            http, gw.url, "tools/call", {"name": "raw_tick", "arguments": {"key": "t1"}},
            id="t1", meta={"progressToken": "p1"}), _SAFETY)
        assert response.status_code == 200, response.text
        *progress, last = sse_messages(response.text)
        assert progress, "the progress is relayed before the deadline"
        assert all(m["method"] == "notifications/progress" and m["params"]["progressToken"] == "p1"
                   for m in progress), progress
        assert last["id"] == "t1" and "result" not in last, last
        error = last["error"]
        assert error["code"] == -31002 and error["data"]["backend"] == "raw", error
        assert "backends[].max_call_seconds" in error["message"], error
        assert await _cancelled(http, gw.url) == ["t1"]
        assert _text(await _echo(http, gw.url, "raw", "still serving")) == "still serving"


async def test_a_listen_is_not_cut_by_max_call_seconds():
    """A listen lasts as long as its subscriber wants (max_call_seconds: "Not for listens"):
    the fixture's listen ticks every 50 ms, and ticks still arrive, with no error, from
    reads begun after the deadline a call would have had."""
    settings = {"backends": [_backend("raw", max_call_seconds=_MAX_CALL)]}
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=_SAFETY) as http:
        (backend,) = gw.runtime.backends
        listen = internal_call("subscriptions/listen", {"notifications": {"toolsListChanged": True}},
                               request_id="L1")
        reply = await backend.send(listen)
        assert reply.stream is not None
        try:
            ack = await asyncio.wait_for(anext(reply.stream), _SAFETY)
            assert ack["method"] == "notifications/subscriptions/acknowledged", ack
            # The listen was sent before now: a call's deadline would be behind us by then.
            past_deadline = time.monotonic() + _MAX_CALL
            late = 0
            while late < 2:  # the second late tick comes from a read begun past the deadline
                tick = await asyncio.wait_for(anext(reply.stream), _SAFETY)
                assert tick["method"] == "notifications/tools/list_changed", tick
                assert tick["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "L1"
                if time.monotonic() > past_deadline:
                    late += 1
        finally:
            await reply.aclose()
        assert await _cancelled(http, gw.url) == ["listen"]  # closing it tells the process
        assert _text(await _echo(http, gw.url, "raw", "still serving")) == "still serving"
