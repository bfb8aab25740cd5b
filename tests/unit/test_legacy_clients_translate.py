"""Legacy request → modern Call, and the modern answer back (digest §h.9, §h.5 mirrored)."""

from __future__ import annotations

import pytest

from gateway.legacy_clients import translate
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.headers import ParamHeader


@pytest.mark.parametrize(
    ("asked", "agreed"),
    [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
        (None, "2025-11-25"),
    ],
)
def test_version_negotiation(asked, agreed):
    assert translate.negotiate_version(asked) == agreed


def test_capabilities_follow_the_fleet_and_the_hub():
    fleet = {
        "tools": {"listChanged": True},
        "resources": {"subscribe": True, "listChanged": True},
        "completions": {},
        "extensions": {"x": {}},
    }
    with_hub = translate.legacy_capabilities(fleet, notifications=True)
    assert with_hub == {
        "logging": {},
        "tools": {"listChanged": True},
        "resources": {"listChanged": True, "subscribe": True},
        "completions": {},
    }
    assert translate.legacy_capabilities(fleet, notifications=False) == {
        "logging": {},
        "tools": {},
        "resources": {},
        "completions": {},
    }


def test_modern_call_carries_the_session_in_meta_and_mirrored_headers():
    message = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {
            "name": "wëather",
            "arguments": {"region": "eu", "n": 3},
            "_meta": {"progressToken": "t1"},
        },
    }
    call = translate.modern_call(
        message,
        request_id="r-1",
        client_capabilities={"elicitation": {}},
        client_info={"name": "c", "version": "1"},
        log_level="info",
        param_headers=(ParamHeader("Region", ("region",)), ParamHeader("Count", ("n",))),
    )
    assert call.id == "r-1" and call.method == "tools/call" and call.name == "wëather"
    m = call.params["_meta"]
    assert m["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert m["io.modelcontextprotocol/clientCapabilities"] == {"elicitation": {}}
    assert m["io.modelcontextprotocol/logLevel"] == "info"
    assert m["io.modelcontextprotocol/clientInfo"] == {"name": "c", "version": "1"}
    assert m["progressToken"] == "t1"
    assert call.headers["mcp-name"].startswith("=?base64?")  # non-ASCII travels encoded
    assert call.headers["mcp-param-region"] == "eu" and call.headers["mcp-param-count"] == "3"


def test_modern_call_validates_like_any_modern_request():
    with pytest.raises(rpc.McpError) as bad_name:
        translate.modern_call(
            {"id": 1, "method": "tools/call", "params": {"name": 5}},
            request_id="r",
            client_capabilities={},
            client_info=None,
            log_level=None,
        )
    assert bad_name.value.code == rpc.INVALID_PARAMS
    with pytest.raises(rpc.McpError) as bad_params:
        translate.modern_call(
            {"id": 1, "method": "tools/list", "params": [1]},
            request_id="r",
            client_capabilities={},
            client_info=None,
            log_level=None,
        )
    assert bad_params.value.code == rpc.INVALID_REQUEST


def test_retry_params_are_added():
    call = translate.modern_call(
        {"id": 1, "method": "prompts/get", "params": {"name": "p"}},
        request_id="r-2",
        client_capabilities={},
        client_info=None,
        log_level=None,
        extra_params={"inputResponses": {"k": {"action": "decline"}}, "requestState": "s"},
    )
    assert (
        call.params["inputResponses"] == {"k": {"action": "decline"}} and call.params["requestState"] == "s"
    )


def test_results_lose_modern_fields_and_take_the_legacy_id():
    modern = {
        "jsonrpc": "2.0",
        "id": "r-7",
        "result": {
            "tools": [],
            "resultType": "complete",
            "ttlMs": 5,
            "cacheScope": "public",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "gw"}, "trace": 1},
        },
    }
    assert translate.legacy_response(modern, 3) == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"tools": [], "_meta": {"trace": 1}},
    }


def test_errors_pass_unchanged_with_the_legacy_id():
    modern = rpc.error_message("r-1", rpc.INVALID_PARAMS, "Resource not found", {"uri": "x://y"})
    legacy = translate.legacy_response(modern, "a")
    assert legacy["id"] == "a" and legacy["error"] == modern["error"]


def test_input_requests_need_the_declared_capability():
    with pytest.raises(rpc.McpError) as refused:
        translate.legacy_input_request(
            "sampling/createMessage",
            {"messages": []},
            protocol_version="2025-11-25",
            client_capabilities={"elicitation": {}},
        )
    assert refused.value.code == rpc.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert refused.value.data == {"requiredCapabilities": {"sampling": {}}}
    assert (
        translate.legacy_input_request(
            "roots/list", None, protocol_version="2025-11-25", client_capabilities={"roots": {}}
        )
        == {}
    )


def test_elicitation_is_shaped_for_the_clients_version():
    form = {"mode": "form", "message": "m", "requestedSchema": {"type": "object", "properties": {}}}
    caps = {"elicitation": {}}
    assert (
        translate.legacy_input_request(
            "elicitation/create", form, protocol_version="2025-11-25", client_capabilities=caps
        )
        == form
    )
    older = translate.legacy_input_request(
        "elicitation/create", form, protocol_version="2025-06-18", client_capabilities=caps
    )
    assert "mode" not in older and older["message"] == "m"
    url = {"mode": "url", "message": "m", "url": "https://example.com/x"}
    with pytest.raises(rpc.McpError):  # form-only client
        translate.legacy_input_request(
            "elicitation/create", url, protocol_version="2025-11-25", client_capabilities=caps
        )
    legacy_url = translate.legacy_input_request(
        "elicitation/create",
        url,
        protocol_version="2025-11-25",
        client_capabilities={"elicitation": {"url": {}}},
    )
    assert legacy_url["elicitationId"]  # 2025-11-25 requires one; modern has none


def test_answers_become_input_responses():
    assert translate.input_response("roots/list", {"id": "gw-1", "result": {"roots": []}}) == {"roots": []}
    refusal = {"id": "gw-1", "error": {"code": -1, "message": "user said no"}}
    assert translate.input_response("elicitation/create", refusal) == {"action": "cancel"}
    with pytest.raises(rpc.McpError) as refused:
        translate.input_response("sampling/createMessage", refusal)
    assert "user said no" in refused.value.message
