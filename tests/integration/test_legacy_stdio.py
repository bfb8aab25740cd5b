"""stdio backends of both eras through the gateway: a legacy FastMCP (mcp==1.30.0) process and
a modern MCPServer (mcp==2.3.0) process, each detected with `era: auto`, multiplexed, and
restarted when they die."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import mcp
import pytest
from mcp_types import ElicitResult

from gateway.backends.base import internal_call
from gateway.observability import metrics
from tests.support import legacy_venv
from tests.support.gateway import running_gateway
from tests.support.procs import FIXTURE_SERVERS

MODERN = "2026-07-28"


def _legacy_command() -> list[str]:
    return [legacy_venv.legacy_python(), str(FIXTURE_SERVERS / "legacy_everything.py"), "--stdio"]


def _modern_command() -> list[str]:
    return [sys.executable, str(FIXTURE_SERVERS / "modern_stdio.py")]


async def _wait_for_restart(backend, old_pid: int) -> None:  # noqa: ANN001
    for _ in range(200):
        if backend.process.pid not in (None, old_pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the stdio backend was not restarted")


async def test_legacy_stdio_backend_end_to_end() -> None:
    async def elicit(context, params):  # noqa: ANN001
        return ElicitResult(action="accept", content={"answer": "stdio"})

    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    settings = {"backends": [{"name": "files", "command": _legacy_command()}]}
    async with running_gateway(settings) as gw:
        (auto,) = gw.runtime.backends
        assert auto.era == "legacy"
        async with mcp.Client(gw.url, mode=MODERN, elicitation_callback=elicit) as client:
            tools = await client.list_tools()
            assert "ask_user" in {t.name for t in tools.tools}
            results = await asyncio.gather(*(client.call_tool("echo", {"text": f"m{i}"}) for i in range(5)))
            assert [r.content[0].text for r in results] == [f"m{i}" for i in range(5)]
            done = await client.call_tool("slow_progress", {"steps": 2, "delay": 0.01}, progress_callback=on_progress)
            assert done.content[0].text == "done after 2 steps"
            assert progress == [1, 2]
            answered = await client.call_tool("ask_user", {"question": "over stdio?"})
            assert answered.content[0].text == "accept: stdio"

            backend = auto._delegates["legacy"]
            old_pid = backend.process.pid
            restarts = metrics.STDIO_RESTARTS.labels("files")
            before = restarts._value.get()
            os.kill(old_pid, signal.SIGKILL)
            await _wait_for_restart(backend, old_pid)
            again = await client.call_tool("echo", {"text": "after restart"})
            assert again.content[0].text == "after restart"
            assert restarts._value.get() - before == 1  # mcp_gateway_stdio_restarts_total


async def test_a_dead_process_ends_its_listens() -> None:
    """The subscriptions died with the process: the listen streams end, and the hub listens
    again on the restarted one (a stream left open would stay silent for good)."""
    settings = {"backends": [{"name": "files", "command": _legacy_command(), "era": "legacy"}]}
    async with running_gateway(settings) as gw:
        (backend,) = gw.runtime.backends
        listen = internal_call("subscriptions/listen", {"notifications": {
            "resourceSubscriptions": ["demo://greeting"]}}, request_id="L1")
        reply = await backend.send(listen)
        assert reply.stream is not None
        ack = await anext(reply.stream)
        assert ack["params"]["notifications"] == {"resourceSubscriptions": ["demo://greeting"]}
        old_pid = backend.process.pid
        os.kill(old_pid, signal.SIGKILL)
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(reply.stream), 10)
        await _wait_for_restart(backend, old_pid)
        again = await backend.send(listen)
        assert again.stream is not None
        ack = await anext(again.stream)
        assert ack["params"]["notifications"] == {"resourceSubscriptions": ["demo://greeting"]}
        await again.aclose()


async def test_modern_stdio_backend_end_to_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.backends.stdio")
    settings = {"backends": [{"name": "tools", "command": _modern_command()}]}
    async with running_gateway(settings) as gw:
        (auto,) = gw.runtime.backends
        assert auto.era == "modern"
        async with mcp.Client(gw.url, mode=MODERN) as client:
            slow, fast = await asyncio.gather(client.call_tool("slow_echo", {"text": "slow", "delay": 0.3}),
                                              client.call_tool("echo", {"text": "fast"}))
            assert (slow.content[0].text, fast.content[0].text) == ("slow", "fast")
            read = await client.read_resource("demo://hello")
            assert read.contents[0].text == "hello over stdio"
            backend = auto._delegates["modern"]
            old_pid = backend.process.pid
            with pytest.raises(mcp.shared.exceptions.MCPError) as info:
                await client.call_tool("crash", {})
            assert "tools" in info.value.error.message
            await _wait_for_restart(backend, old_pid)
            assert (await client.call_tool("echo", {"text": "back"})).content[0].text == "back"
    # The process's stderr reached the gateway's log.
    assert any("modern_stdio fixture starting" in r.getMessage() for r in caplog.records)
