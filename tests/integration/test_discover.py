"""server/discover against a fleet with a hung member (gateway/backends/base.py `discover`,
gateway/dispatch.py `_discover`): backends are asked in parallel, each within its
list_timeout_seconds; a failure is remembered for a few seconds, so a dead backend costs one
deadline, not one per request; the last known result stands in when a refresh fails."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.backends.base import internal_call
from gateway.backends.modern import ModernHttpBackend
from gateway.dispatch import Dispatcher
from gateway.protocol import jsonrpc as rpc
from gateway.routing.table import RouteTable, Target
from gateway.settings import BackendSettings
from tests.support.asgi import read_body
from tests.support.oauth import serve


class Discoverable:
    """A modern backend that answers server/discover, or holds it until released, and counts."""

    def __init__(self, capability: str) -> None:
        self.capability = capability
        self.hang = False
        self.discovers = 0
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await read_body(receive)
        msg = orjson.loads(body)
        self.discovers += msg.get("method") == "server/discover"
        if self.hang:
            await self.release.wait()
        payload = orjson.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": {
            "resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {self.capability: {}},
            "ttlMs": 60_000, "cacheScope": "public"}})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture
async def fleet():
    good, hung = Discoverable("tools"), Discoverable("prompts")
    hung.hang = True
    async with serve(good) as good_app, serve(hung) as hung_app:
        backends = [
            ModernHttpBackend(BackendSettings(name="good", url=f"{good_app.base}/mcp")),
            # A read deadline far beyond the list deadline: only list_timeout_seconds can end it.
            ModernHttpBackend(BackendSettings(name="hung", url=f"{hung_app.base}/mcp", timeout_seconds=600,
                                              list_timeout_seconds=0.3, retries=0)),
        ]
        table = RouteTable([Target(backends[0], "good__"), Target(backends[1], "hung__")])
        try:
            yield Dispatcher(table), good, hung, backends
        finally:
            hung.release.set()
            for backend in backends:
                await backend.aclose()


async def discover(dispatcher: Dispatcher) -> dict[str, Any]:
    reply = await dispatcher.dispatch(internal_call("server/discover", request_id=7))
    assert reply.message is not None
    return reply.message["result"]


async def test_a_hung_backend_costs_one_deadline_and_is_then_remembered(fleet):
    dispatcher, good, hung, _ = fleet
    # Concurrent and then repeated discovers: the hung backend is asked once, the others wait
    # for (or reuse) that one bounded attempt.
    answers = await asyncio.gather(*(discover(dispatcher) for _ in range(3)))
    answers.append(await discover(dispatcher))
    for result in answers:
        assert result["capabilities"] == {"tools": {}}  # the good backend's, the hung one left out
    assert hung.discovers == 1
    assert good.discovers == 1


async def test_the_last_known_result_stands_in_when_a_refresh_fails(fleet):
    dispatcher, good, hung, backends = fleet
    hung.hang = False
    assert (await discover(dispatcher))["capabilities"] == {"tools": {}, "prompts": {}}
    hung.hang = True
    backends[1]._discovered_at -= 3600  # the cached result is now older than any max_age
    assert (await discover(dispatcher))["capabilities"] == {"tools": {}, "prompts": {}}
    assert hung.discovers == 2  # the refresh was tried (and failed within its deadline)
    assert backends[1].last_error is not None and "list_timeout_seconds" in backends[1].last_error
    # A caller that needs a live answer (readiness) still gets the failure.
    with pytest.raises(rpc.McpError) as info:
        await backends[1].discover(max_age=10.0)
    assert info.value.data == {"backend": "hung"}
