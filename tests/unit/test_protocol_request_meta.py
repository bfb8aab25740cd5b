"""gateway/protocol/request_meta.py: the standard `_meta` fields are checked at the front door,
through `parse_call`, whatever the method (schema `RequestMetaObject`), each failure 400 -32602
naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import parse_call
from gateway.protocol.request_meta import check_initialize_declarations

V = "2026-07-28"
INFO = "io.modelcontextprotocol/clientInfo"
CAPS = "io.modelcontextprotocol/clientCapabilities"
LOG = "io.modelcontextprotocol/logLevel"
METHODS = {  # method → (params, Mcp-Name)
    "tools/list": ({}, None),
    "prompts/list": ({}, None),
    "resources/list": ({}, None),
    "resources/templates/list": ({}, None),
    "tools/call": ({"name": "echo", "arguments": {}}, "echo"),
    "prompts/get": ({"name": "p"}, "p"),
    "resources/read": ({"uri": "file:///a"}, "file:///a"),
    "server/discover": ({}, None),
    "subscriptions/listen": ({"notifications": {"toolsListChanged": True}}, None),
    "completion/complete": ({"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": ""}},
                            None),
}


def parse(method: str, extra_meta: dict[str, Any], caps: Any = None) -> Any:
    params, name = METHODS[method]
    body = {"jsonrpc": "2.0", "id": 7, "method": method,
            "params": {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": V,
                                           CAPS: {} if caps is None else caps, **extra_meta}}}
    headers = {"mcp-protocol-version": V, "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return parse_call(orjson.dumps(body), headers)


def refused(method: str, extra_meta: dict[str, Any], caps: Any = None) -> rpc.McpError:
    with pytest.raises(rpc.McpError) as info:
        parse(method, extra_meta, caps)
    err = info.value
    assert (err.code, err.status, err.request_id) == (rpc.INVALID_PARAMS, 400, 7), err.message
    return err


# The malformed clientInfo values the issue's fuzzer found, and what each error must name.
BAD_CLIENT_INFO = [
    (" ", f"_meta[{INFO!r}]"),
    (42, f"_meta[{INFO!r}]"),
    ({"name": 5, "version": []}, f"_meta[{INFO!r}].name"),
    ({"a": 1}, f"_meta[{INFO!r}].name"),
    ({"name": "c"}, f"_meta[{INFO!r}].version"),
    ({"name": "c", "version": []}, f"_meta[{INFO!r}].version"),
    ({"name": "c", "version": "1", "title": 3}, f"_meta[{INFO!r}].title"),
    ({"name": "c", "version": "1", "websiteUrl": {}}, f"_meta[{INFO!r}].websiteUrl"),
    ({"name": "c", "version": "1", "icons": "x.png"}, f"_meta[{INFO!r}].icons"),
    ({"name": "c", "version": "1", "icons": [{"mimeType": "image/png"}]}, f"_meta[{INFO!r}].icons[0].src"),
    ({"name": "c", "version": "1", "icons": [{"src": "a", "theme": "blue"}]}, f"_meta[{INFO!r}].icons[0].theme"),
    ({"name": "c", "version": "1", "icons": [{"src": "a", "sizes": [48]}]}, f"_meta[{INFO!r}].icons[0].sizes"),
]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize(("value", "field"), BAD_CLIENT_INFO, ids=[repr(v)[:30] for v, _ in BAD_CLIENT_INFO])
def test_malformed_client_info_is_refused_naming_the_field(method, value, field):
    err = refused(method, {INFO: value})
    assert err.data == {"field": field}
    assert err.message.startswith(f"Invalid params: {field} "), err.message


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("token", [{"a": 1}, [], None, True, 1.5, {}])
def test_progress_token_must_be_a_string_or_an_integer(method, token):
    err = refused(method, {"progressToken": token})
    assert err.data == {"field": "_meta['progressToken']"}
    assert "ProgressToken" in err.message


@pytest.mark.parametrize("token", ["t-1", "", 0, -3, 2**63 - 1, 7.0])
def test_valid_progress_tokens_pass(token):
    assert parse("tools/call", {"progressToken": token}).meta["progressToken"] == token


def test_a_complete_client_info_passes():
    info = {"name": "c", "version": "1", "title": "C", "description": "d", "websiteUrl": "https://c.example",
            "icons": [{"src": "https://c.example/i.png", "mimeType": "image/png", "sizes": ["48x48"],
                       "theme": "dark"}], "x-vendor": {"anything": True}}
    assert parse("tools/list", {INFO: info}).meta[INFO] == info


@pytest.mark.parametrize(("level", "ok"), [("debug", True), ("emergency", True), (None, True), ("loud", False),
                                           (3, False), ([], False)])
def test_log_level(level, ok):
    if ok:
        parse("tools/list", {LOG: level})
    else:
        assert refused("tools/list", {LOG: level}).data == {"field": f"_meta[{LOG!r}]"}


@pytest.mark.parametrize("key", ["traceparent", "tracestate", "baggage"])
def test_trace_context_must_be_strings(key):
    parse("tools/call", {key: "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"})
    parse("tools/call", {key: "not w3c, but the tracer's to judge"})
    assert refused("tools/call", {key: {"a": 1}}).data == {"field": f"_meta[{key!r}]"}


@pytest.mark.parametrize(("caps", "field"), [
    ({"sampling": True}, "sampling"), ({"roots": []}, "roots"), ({"elicitation": "form"}, "elicitation"),
    ({"elicitation": {"url": 1}}, "elicitation.url"), ({"sampling": {"tools": True}}, "sampling.tools"),
    ({"extensions": {"io.modelcontextprotocol/tasks": True}}, "extensions.io.modelcontextprotocol/tasks"),
    ({"experimental": []}, "experimental"), ({"experimental": {"x": 1}}, "experimental.x"),
])
def test_named_capabilities_must_be_objects(caps, field):
    assert refused("tools/list", {}, caps=caps).data == {"field": f"_meta[{CAPS!r}].{field}"}


def test_capabilities_the_schema_does_not_name_are_the_clients_own():
    caps = {"roots": {"listChanged": True}, "elicitation": {"form": {}, "url": {}}, "sampling": {"context": {}},
            "extensions": {"io.modelcontextprotocol/tasks": {}}, "com.example/custom": 5}
    assert parse("tools/list", {}, caps=caps).client_capabilities == caps


def test_user_keys_are_not_judged():
    parse("tools/list", {"com.example/anything": {"nested": [1]}, "clientInfo": 5})


def test_notifications_are_not_checked():
    body = {"jsonrpc": "2.0", "method": "notifications/whatever", "params": {"_meta": {INFO: 42}}}
    assert parse_call(orjson.dumps(body), {}).is_notification


@pytest.mark.parametrize(("params", "field"), [
    ({"clientInfo": " ", "capabilities": {}}, "params.clientInfo"),
    ({"clientInfo": {"name": "c"}, "capabilities": {}}, "params.clientInfo.version"),
    ({"clientInfo": {"name": "c", "version": "1"}, "capabilities": {"sampling": 1}}, "params.capabilities.sampling"),
    ({"clientInfo": {"name": "c", "version": "1"}, "capabilities": 7}, "params.capabilities"),
])
def test_initialize_declarations(params, field):
    with pytest.raises(rpc.McpError) as info:
        check_initialize_declarations(params, 0)
    assert (info.value.code, info.value.status, info.value.data) == (rpc.INVALID_PARAMS, 400, {"field": field})
    check_initialize_declarations({"clientInfo": {"name": "c", "version": "1"}, "capabilities": {}}, 0)
    check_initialize_declarations({"capabilities": {}}, 0)
