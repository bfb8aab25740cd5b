"""Which POSTs the legacy-client seam takes over before modern validation (digest §h.9)."""

from __future__ import annotations

import pytest

from gateway.dispatch import Dispatcher
from gateway.legacy_clients import LegacyClients
from gateway.routing.table import RouteTable

INIT = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'
LIST = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'


@pytest.fixture
def seam() -> LegacyClients:
    return LegacyClients(Dispatcher(RouteTable([])))


@pytest.mark.parametrize(
    ("body", "headers", "claimed"),
    [
        (LIST, {"mcp-protocol-version": "2026-07-28"}, False),  # modern fast path
        (INIT, {"mcp-protocol-version": "2026-07-28"}, False),  # modern initialize → -32601
        (
            LIST,
            {"mcp-protocol-version": "2026-07-28", "mcp-session-id": "x"},
            False,
        ),  # modern ignores sessions
        (LIST, {"mcp-protocol-version": "2025-11-25"}, True),
        (LIST, {"mcp-protocol-version": "2025-06-18"}, True),
        (LIST, {"mcp-session-id": "x"}, True),  # 2025-03-26: no version header
        (LIST, {"mcp-protocol-version": "1.0", "mcp-session-id": "x"}, True),  # legacy 400, not modern
        (INIT, {}, True),
        (LIST, {}, False),  # modern "missing header" 400
        (b'{"method": "initialize"', {}, False),  # unparsable: modern parse error
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"initialize"}}', {}, False),
    ],
)
def test_claims(seam, body, headers, claimed):
    assert seam.claims(body, headers) is claimed
