"""Initialize-era backends that ask for roots outside a client request get the configured ones
(`backends[].roots`, default none) instead of -32601, which such servers log as "Failed to
request initial roots from client"; asked during a client's call, the question still goes to
that client as MRTR.

Real processes: the mcp==1.30.0 fixture `legacy_roots_at_startup.py` over stdio (it asks
`roots/list` as soon as it is initialized, as `@modelcontextprotocol/server-filesystem` does),
and, when npm can install it, `@modelcontextprotocol/server-filesystem` itself
(scripts/server-filesystem.sh), whose allowed directories follow the roots it is given.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support import legacy_venv, mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import FIXTURE_SERVERS

CAPS = "io.modelcontextprotocol/clientCapabilities"
PROJECT = {"uri": "file:///srv/project", "name": "project"}


def _command() -> list[str]:
    return [legacy_venv.legacy_python(), str(FIXTURE_SERVERS / "legacy_roots_at_startup.py")]


async def call(gw: Any, tool: str, arguments: dict[str, Any] | None = None, *,
               caps: dict[str, Any] | None = None) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
        response = await mcp_http.post(client, gw.url, "tools/call", {"name": tool, "arguments": arguments or {}},
                                       meta={CAPS: caps or {}})
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        return mcp_http.sse_messages(response.text)[-1]
    return response.json()


async def startup_roots(gw: Any) -> dict[str, Any]:
    """What the backend's start-up roots/list got, once it has its answer."""
    for _ in range(100):
        seen = orjson.loads((await call(gw, "startup_roots"))["result"]["content"][0]["text"])
        if "pending" not in seen:
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError("the backend's start-up roots/list never got an answer")


async def test_start_up_roots_list_is_answered_with_the_configured_roots():
    settings = {"backends": [{"name": "files", "command": _command(), "roots": [PROJECT, {"uri": "file:///tmp"}]}]}
    async with running_gateway(settings) as gw:
        assert await startup_roots(gw) == {"roots": [PROJECT, {"uri": "file:///tmp"}]}


async def test_no_configured_roots_is_an_empty_list_not_an_error():
    async with running_gateway({"backends": [{"name": "files", "command": _command()}]}) as gw:
        assert await startup_roots(gw) == {"roots": []}


async def test_inside_a_call_roots_list_stays_the_clients_question():
    settings = {"backends": [{"name": "files", "command": _command(), "roots": [PROJECT]}]}
    async with running_gateway(settings) as gw:
        await startup_roots(gw)
        # A client that declares roots is asked (MRTR), not answered from the configuration.
        asked = await call(gw, "ask_roots", caps={"roots": {}})
        result = asked["result"]
        assert result["resultType"] == "input_required", result
        (request,) = result["inputRequests"].values()
        assert request["method"] == "roots/list"
        mine = {"roots": [{"uri": "file:///home/me", "name": "mine"}]}
        key = next(iter(result["inputRequests"]))
        async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
            retry = await mcp_http.post(client, gw.url, "tools/call", {
                "name": "ask_roots", "arguments": {}, "inputResponses": {key: mine},
                "requestState": result["requestState"]}, meta={CAPS: {"roots": {}}})
        final = retry.json() if retry.headers["content-type"].startswith("application/json") else \
            mcp_http.sse_messages(retry.text)[-1]
        assert orjson.loads(final["result"]["content"][0]["text"]) == mine["roots"]
        # A client that declares none: the stdio session declared roots on its own (one session
        # for every client), so the gateway answers with the configured roots, not -32021.
        answered = await call(gw, "ask_roots")
        assert orjson.loads(answered["result"]["content"][0]["text"]) == [PROJECT]


def test_roots_must_be_file_uris():
    from gateway.settings import ConfigError, load_settings

    with pytest.raises(ConfigError, match=r"backends\.0\.roots\.0\.uri: .*not a file:// URI"):
        load_settings(None, backends=[{"name": "files", "command": ["x"], "roots": [{"uri": "https://x"}]}])


# -- @modelcontextprotocol/server-filesystem --------------------------------------------------


def _server_filesystem() -> str:
    entry = os.environ.get("MCPGW_SERVER_FILESYSTEM", "")
    node = os.environ.get("MCPGW_NODE22_BIN", "")
    if not entry or not Path(entry).is_file() or not node:
        pytest.skip("@modelcontextprotocol/server-filesystem is not installed (scripts/server-filesystem.sh, run "
                    "by scripts/test.sh, installs it from npm; set MCPGW_SERVER_FILESYSTEM and MCPGW_NODE22_BIN)")
    return entry


async def test_server_filesystem_gets_its_roots_and_logs_no_failure(tmp_path, caplog):
    entry = _server_filesystem()
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "hello.txt").write_text("hello from a root")
    started_with = tmp_path / "argv"
    started_with.mkdir()
    command = [str(Path(os.environ["MCPGW_NODE22_BIN"]) / "node"), entry, str(started_with)]
    settings = {"backends": [{"name": "fs", "command": command, "era": "legacy",
                              "roots": [{"uri": allowed.as_uri(), "name": "allowed"}]}]}
    caplog.set_level("INFO", logger="gateway.backends.stdio")
    async with running_gateway(settings) as gw:
        # The server replaces its allowed directories with the roots it was given at start-up.
        for _ in range(100):
            listed = await call(gw, "list_allowed_directories")
            text = listed["result"]["content"][0]["text"]
            if str(allowed) in text:
                break
            await asyncio.sleep(0.1)
        assert str(allowed) in text, text
        read = await call(gw, "read_text_file", {"path": str(allowed / "hello.txt")})
        assert "hello from a root" in read["result"]["content"][0]["text"]
    stderr = "\n".join(r.getMessage() for r in caplog.records if "stderr" in r.getMessage())
    assert "Failed to request initial roots" not in stderr, stderr
