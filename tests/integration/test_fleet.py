"""Two real modern backends (mcp==2.3.0 MCPServer) behind one gateway, driven by the SDK's
own client: discover, merged and prefixed lists, calls routed to each backend."""

from __future__ import annotations

import pytest
from mcp import Client

from tests.support.gateway import running_gateway


@pytest.fixture
def fleet_settings(conformance_backend, second_backend):
    return {
        "backends": [
            {"name": "alpha", "url": conformance_backend.url},
            {"name": "beta", "url": second_backend.url},
        ]
    }


@pytest.mark.parametrize("mode", ["2026-07-28", "auto"])
async def test_sdk_client_sees_one_merged_server(fleet_settings, mode):
    async with running_gateway(fleet_settings) as gw:
        async with Client(gw.url, mode=mode) as client:
            tools = await client.list_tools()
            names = [t.name for t in tools.tools]
            assert "alpha__test_simple_text" in names and "beta__test_simple_text" in names
            # Deterministic order: the fleet's order, then each backend's own order.
            assert names.index("alpha__test_simple_text") < names.index("beta__test_simple_text")
            for backend in ("alpha", "beta"):
                result = await client.call_tool(f"{backend}__test_simple_text", {})
                assert result.content[0].text
                assert not result.is_error
