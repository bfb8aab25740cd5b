"""A stdio backend's subprocess does not inherit the gateway's secrets (SBP: stdio-spawning
proxies SHOULD sandbox what they spawn)."""

from __future__ import annotations

import asyncio
import sys

from gateway.backends.stdio_process import StdioProcess, child_environment
from gateway.settings import BackendSettings

# A real subprocess that reports the names of its environment variables as one JSON line.
REPORT_ENV = "import json, os, sys; print(json.dumps({'env': sorted(os.environ)}), flush=True); sys.stdin.read()"


def settings(**extra) -> BackendSettings:
    return BackendSettings(name="tool", command=(sys.executable, "-c", REPORT_ENV), **extra)


async def test_the_subprocess_sees_only_the_base_environment_and_its_own(monkeypatch):
    monkeypatch.setenv("MCP_GATEWAY_SECURITY__SECRET", "s3cret")
    monkeypatch.setenv("MCP_GATEWAY_AUTH__HS256_SECRET", "also-secret")
    monkeypatch.setenv("SOME_API_KEY", "k")
    monkeypatch.setenv("WANTED_BY_TOOL", "yes")
    s = settings(env={"TOOL_MODE": "fast"}, inherit_env=("WANTED_BY_TOOL",))
    seen: asyncio.Future = asyncio.get_running_loop().create_future()
    process = StdioProcess("tool", s.command, child_environment(s), backoff=0.1,
                           on_message=lambda m: seen.done() or seen.set_result(m), on_exit=lambda reason: None)
    process.start()
    try:
        names = set((await asyncio.wait_for(seen, 20))["env"])
    finally:
        await process.aclose()
    assert "TOOL_MODE" in names and "WANTED_BY_TOOL" in names and "PATH" in names
    assert not {"MCP_GATEWAY_SECURITY__SECRET", "MCP_GATEWAY_AUTH__HS256_SECRET", "SOME_API_KEY"} & names
