"""Modern ⇄ legacy mapping rules (gateway/backends/legacy/translate.py, digest §h.4, §h.7)."""

from __future__ import annotations

import pytest

from gateway.backends.legacy import translate
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta


def test_session_capabilities_keep_only_what_mrtr_can_carry() -> None:
    declared = translate.session_capabilities({
        "sampling": {"tools": {}}, "elicitation": {"form": {}}, "roots": {"listChanged": True},
        "experimental": {"x": {}}, "extensions": {"io.modelcontextprotocol/tasks": {}}})
    assert declared == {"sampling": {"tools": {}}, "elicitation": {"form": {}}, "roots": {}}
    assert translate.session_capabilities({}) == {}


def test_pool_key_is_order_independent() -> None:
    assert translate.pool_key({"a": {}, "b": {"x": 1}}) == translate.pool_key({"b": {"x": 1}, "a": {}})


def test_legacy_params_strip_modern_meta_and_mrtr_fields() -> None:
    params = {"name": "t", "arguments": {"a": 1}, "inputResponses": {"k": {}}, "requestState": "s",
              "_meta": {meta.PROTOCOL_VERSION: "2026-07-28", meta.CLIENT_CAPABILITIES: {}, meta.LOG_LEVEL: "info",
                        "progressToken": "client-token", "traceparent": "00-abc", "com.example/x": 1}}
    assert translate.legacy_params(params) == {"name": "t", "arguments": {"a": 1},
                                               "_meta": {"traceparent": "00-abc", "com.example/x": 1}}
    assert translate.legacy_params({"name": "t", "_meta": {meta.PROTOCOL_VERSION: "x"}}) == {"name": "t"}


def test_result_gets_result_type_cache_hints_and_server_info() -> None:
    legacy = {"jsonrpc": "2.0", "id": 17, "result": {"tools": []}}
    out = translate.result_for_client(legacy, "client-1", "tools/list", backend="old",
                                      server_info={"name": "s", "version": "1"}, ttl_ms=5000, cache_scope="public")
    assert out["id"] == "client-1"
    assert out["result"] == {"tools": [], "resultType": "complete", "ttlMs": 5000, "cacheScope": "public",
                             "_meta": {meta.SERVER_INFO: {"name": "s", "version": "1"}}}


def test_non_cacheable_results_get_no_cache_hints() -> None:
    out = translate.result_for_client({"id": 3, "result": {"content": []}}, 1, "tools/call", backend="old",
                                      server_info=None, ttl_ms=5000, cache_scope="public")
    assert out["result"] == {"content": [], "resultType": "complete"}


def test_resource_not_found_becomes_invalid_params() -> None:
    legacy = {"id": 3, "error": {"code": -32002, "message": "Resource not found", "data": {"uri": "x://y"}}}
    out = translate.result_for_client(legacy, 9, "resources/read", backend="old", server_info=None, ttl_ms=0,
                                      cache_scope="private")
    assert out == {"jsonrpc": "2.0", "id": 9,
                   "error": {"code": -32602, "message": "Resource not found", "data": {"uri": "x://y"}}}


def test_url_elicitation_required_is_never_emitted() -> None:
    out = translate.result_for_client({"id": 3, "error": {"code": -32042, "message": "go there"}}, 9, "tools/call",
                                      backend="old", server_info=None, ttl_ms=0, cache_scope="private")
    assert out["error"]["code"] == -32603


@pytest.mark.parametrize("legacy", [
    {"id": 3, "result": "done"},
    {"id": 3, "error": "boom"},
    {"id": 3},
], ids=["result-not-an-object", "error-not-an-object", "neither"])
def test_a_response_the_client_cannot_use_is_the_backends_invalid_answer(legacy) -> None:
    """-31003 naming the backend (README "Errors the gateway makes"), at 502, not a bare -32603
    that would read as the gateway's own fault and say nothing of where it came from."""
    out = translate.result_for_client(legacy, 9, "tools/call", backend="old", server_info=None, ttl_ms=0,
                                      cache_scope="private")
    assert out["id"] == 9
    assert out["error"]["code"] == -31003
    assert out["error"]["data"] == {"backend": "old"}
    assert out["error"]["message"] == ("Backend 'old' sent an invalid response: its response to tools/call has "
                                       "neither a result object nor an error object")
    assert rpc.http_status_of(out) == 502


def test_discover_from_initialize() -> None:
    init = {"protocolVersion": "2025-11-25", "serverInfo": {"name": "old", "version": "1"}, "instructions": "hi",
            "capabilities": {"tools": {"listChanged": False}, "resources": {"subscribe": True, "listChanged": True},
                             "logging": {}, "tasks": {"list": {}}, "experimental": {"x": {}}}}
    result = translate.discover_result(init, ttl_ms=0, cache_scope="private")
    assert result == {
        "supportedVersions": ["2026-07-28"],
        "capabilities": {"tools": {}, "resources": {"subscribe": True, "listChanged": True}, "logging": {}},
        "resultType": "complete", "ttlMs": 0, "cacheScope": "private", "instructions": "hi",
        "_meta": {meta.SERVER_INFO: {"name": "old", "version": "1"}},
    }


def test_input_request_drops_legacy_only_fields() -> None:
    message = {"jsonrpc": "2.0", "id": 4, "method": "elicitation/create",
               "params": {"mode": "url", "message": "log in", "url": "https://x", "elicitationId": "e1"}}
    assert translate.input_request(message) == {
        "method": "elicitation/create", "params": {"mode": "url", "message": "log in", "url": "https://x"}}


def test_missing_capability() -> None:
    form = {"method": "elicitation/create", "params": {"message": "?"}}
    url = {"method": "elicitation/create", "params": {"mode": "url", "message": "?", "url": "https://x"}}
    sampling = {"method": "sampling/createMessage", "params": {}}
    assert translate.missing_capability(form, {}) == {"elicitation": {}}
    assert translate.missing_capability(form, {"elicitation": {}}) is None
    assert translate.missing_capability(url, {"elicitation": {}}) == {"elicitation": {"url": {}}}
    assert translate.missing_capability(url, {"elicitation": {"url": {}}}) is None
    assert translate.missing_capability(sampling, {"roots": {}}) == {"sampling": {}}
    assert translate.missing_capability({"method": "roots/list"}, {"roots": {}}) is None


def test_log_level_threshold() -> None:
    assert translate.log_level_passes("error", "warning")
    assert translate.log_level_passes("warning", "warning")
    assert not translate.log_level_passes("info", "warning")
    assert not translate.log_level_passes("nonsense", "debug")


def test_url_elicitations_become_modern_url_input_requests() -> None:
    error = {"code": -32042, "message": "URL elicitation required", "data": {"elicitations": [
        {"mode": "url", "message": "Sign in", "url": "https://auth.example/a", "elicitationId": "e1"},
        {"mode": "url", "message": "no url here", "elicitationId": "e2"},
        "garbage",
    ]}}
    assert translate.url_elicitations(error) == {
        "url0": {"method": "elicitation/create",
                 "params": {"mode": "url", "message": "Sign in", "url": "https://auth.example/a"}},
    }
    assert translate.url_elicitations({"code": -32042, "message": "x"}) == {}


def test_session_capabilities_are_a_small_fixed_set_whatever_the_client_writes() -> None:
    # They key the session pool: content copied verbatim let every distinct client object
    # cost a backend session, an initialize, and someone else's warm session.
    keys = {translate.pool_key(translate.session_capabilities({
        "sampling": {"n": i, "tools": {"x": i}}, "elicitation": {"form": {"n": i}, "junk": i},
        "roots": {"listChanged": True, "n": i}})) for i in range(100)}
    assert keys == {translate.pool_key({"sampling": {"tools": {}}, "elicitation": {"form": {}}, "roots": {}})}
    # ELICIT: `{}` is form only, the same session as an explicit form.
    assert translate.session_capabilities({"elicitation": {}}) == translate.session_capabilities(
        {"elicitation": {"form": {"applyDefaults": True}}}) == {"elicitation": {"form": {}}}
    assert translate.session_capabilities({"elicitation": {"url": {}}}) == {"elicitation": {"url": {}}}
    assert translate.session_capabilities({"sampling": {"context": {}, "tools": {}, "other": {}}}) == {
        "sampling": {"context": {}, "tools": {}}}
    assert translate.session_capabilities({"sampling": True, "roots": "yes"}) == {}
