"""subscriptions/listen end to end onto a legacy backend (digest §h.6): the SDK's modern client
→ the gateway's subscription hub → LegacyBackend's listen (GET stream + resources/subscribe)
→ a real mcp==1.30.0 server (tests/fixtures/servers/legacy_everything.py, stateful SSE)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

from tests.support import legacy_venv
from tests.support.gateway import running_gateway
from tests.support.procs import Proc


@pytest.fixture(scope="module")
def backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-listen").start()
    yield proc
    proc.stop()


def settings(backend: Proc, **options: object) -> dict[str, object]:
    return {"backends": [{"name": "old", "url": backend.url, "era": "legacy", **options}],
            "subscriptions": {"linger_seconds": 0.2}}


async def test_resource_updates_and_tool_list_changes_reach_a_modern_listener(backend: Proc) -> None:
    async with running_gateway(settings(backend)) as gw, Client(gw.url, mode="2026-07-28") as client:
        async with client.listen(tools_list_changed=True,
                                 resource_subscriptions=["demo://greeting", "demo://items/7"]) as sub:
            assert sub.honored.tools_list_changed is True
            assert sub.honored.resource_subscriptions == ["demo://greeting", "demo://items/7"]
            events = aiter(sub)

            # The backend only sends resources/updated for URIs its session subscribed to, so
            # this arriving proves the gateway's resources/subscribe; it comes on the GET stream.
            touched = await client.call_tool("touch_resource", {"uri": "demo://items/7"})
            assert touched.content[0].text == "updated: demo://items/7"
            assert await anext(events) == ResourceUpdated(uri="demo://items/7")

            added = (await client.call_tool("bump_tools", {})).content[0].text
            assert await anext(events) == ToolsListChanged()
            # The change is real, and the list the client refetches has it.
            assert added in [tool.name for tool in (await client.list_tools()).tools]

            # Sent on the calling request's POST stream instead of the GET stream: a legacy
            # server never broadcasts, so the gateway must take it from there too.
            await client.call_tool("touch_resource", {"uri": "demo://greeting", "on_request_stream": True})
            assert await anext(events) == ResourceUpdated(uri="demo://greeting")


async def test_ack_promises_only_what_the_backend_can_deliver(backend: Proc) -> None:
    async with running_gateway(settings(backend)) as gw, Client(gw.url, mode="2026-07-28") as client:
        async with client.listen(prompts_list_changed=True, resources_list_changed=True,
                                 resource_subscriptions=["demo://greeting"]) as sub:
            # legacy_everything advertises listChanged everywhere and resources.subscribe.
            assert sub.honored.prompts_list_changed is True
            assert sub.honored.resources_list_changed is True
            assert not sub.honored.tools_list_changed  # not asked for, not promised
            assert sub.honored.resource_subscriptions == ["demo://greeting"]
            # Not asked for: a tool-list change must not reach this listener, while the
            # resource update that follows it must.
            await client.call_tool("bump_tools", {})
            await client.call_tool("touch_resource", {"uri": "demo://greeting"})
            assert await anext(aiter(sub)) == ResourceUpdated(uri="demo://greeting")


async def test_ack_is_empty_when_the_backend_has_no_channel(tmp_path) -> None:
    """A stateless backend has no session, so nothing can be subscribed and no notification
    can be relied on: the ack must promise nothing (SUB: the ack is the honoured subset). With
    the polling fallback off: on, the gateway polls instead (test_listen_polling.py)."""
    proc = legacy_venv.legacy_server("--stateless", "--json", name="legacy-listen-stateless").start()
    try:
        config = settings(proc)
        config["subscriptions"] = {**config.get("subscriptions", {}), "poll_fallback": False}
        async with running_gateway(config) as gw, Client(gw.url, mode="2026-07-28") as client:
            async with client.listen(tools_list_changed=True, resource_subscriptions=["demo://greeting"]) as sub:
                assert not sub.honored.tools_list_changed
                assert not sub.honored.resource_subscriptions
    finally:
        proc.stop()
