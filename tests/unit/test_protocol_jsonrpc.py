"""The one mapping from JSON-RPC error code to HTTP status (gateway/protocol/jsonrpc.py)."""

from __future__ import annotations

import orjson
import pytest

from gateway.protocol import jsonrpc as rpc

RAISED = [
    rpc.parse_error("x"),
    rpc.invalid_request("x"),
    rpc.header_mismatch("x"),
    rpc.unsupported_version("1999-01-01", ["2026-07-28"]),
    rpc.invalid_params("x"),
    rpc.method_not_found("x/y"),
    rpc.missing_capability({"sampling": {}}),
    rpc.backend_unavailable("b", "x"),
    rpc.backend_timeout("b", 1),
    rpc.backend_protocol_error("b", "x"),
    rpc.gateway_overloaded("x", limit="some.setting"),
]


@pytest.mark.parametrize("error", RAISED, ids=lambda e: str(e.code))
def test_a_relayed_error_gets_the_status_the_gateway_raises_it_with(error: rpc.McpError) -> None:
    # A message relayed from a backend or another replica must keep the status the same
    # error has when the gateway raises it, whichever backend era carried it.
    assert rpc.http_status_for(error.code) == error.status
    assert rpc.http_status_of(error.to_message()) == error.status


def test_results_and_other_errors_travel_with_200() -> None:
    assert rpc.http_status_of(rpc.result_message(1, {})) == 200
    assert rpc.http_status_of(rpc.error_message(1, rpc.INTERNAL_ERROR, "boom")) == 200
    assert rpc.http_status_of(rpc.error_message(1, -32000, "server-defined")) == 200
    assert rpc.http_status_for("not a code") == 200


def test_an_error_never_quotes_a_client_value_whole() -> None:
    """Messages quote what the client sent; a 200 KB protocolVersion must not come back whole."""
    huge = "9" * 200_000
    err = rpc.unsupported_version(huge, ["2026-07-28"], request_id=1)
    assert len(err.message) < rpc.MAX_MESSAGE_CHARS + 40
    assert err.message.startswith("Unsupported protocol version: '999") and err.message.endswith("characters)")
    assert err.data["requested"] == "9" * 100 + "…"
    assert len(orjson.dumps(err.to_message())) < 2000
    short = rpc.unsupported_version("2024-01-01", ["2026-07-28"])
    assert short.message == "Unsupported protocol version: '2024-01-01'" and short.data["requested"] == "2024-01-01"
