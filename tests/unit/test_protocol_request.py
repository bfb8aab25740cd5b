"""gateway/protocol/request.py: the body phase, one test per row of digest §a.3 it owns, and
the order of digest §a.5 (each failure maps to exactly one row)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import check_param_headers, parse_call
from tests.support.procs import SPEC_EXAMPLES

EXAMPLES = SPEC_EXAMPLES
V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}


def msg(method: str = "tools/list", params: dict[str, Any] | None = None, *, id: Any = 1, meta: Any = None,
        drop_meta: bool = False) -> dict[str, Any]:
    p = dict(params or {})
    if not drop_meta:
        p["_meta"] = META if meta is None else meta
    m: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": p}
    if id is not None:
        m["id"] = id
    return m


def hdrs(method: str = "tools/list", name: str | None = None, version: str | None = V, **extra: str) -> dict:
    out = {"mcp-method": method}
    if version is not None:
        out["mcp-protocol-version"] = version
    if name is not None:
        out["mcp-name"] = name
    out.update(extra)
    return out


def rejected(body: Any, headers: dict[str, str]) -> rpc.McpError:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(rpc.McpError) as info:
        parse_call(raw, headers)
    return info.value


# -- accepted ------------------------------------------------------------------------------


def _client_request_examples() -> list[Path]:
    out = []
    for path in sorted(EXAMPLES.glob("*Request/*.json")):
        example = json.loads(path.read_text())
        if "jsonrpc" in example and "id" in example:  # client->server requests, not InputRequests
            out.append(path)
    assert out, f"the official examples are missing from {EXAMPLES}"
    return out


def example_headers(example: dict[str, Any]) -> dict[str, str]:
    """The headers a compliant client sends with this body (digest §b.1)."""
    params = example.get("params") or {}
    out = hdrs(example["method"], version=params["_meta"]["io.modelcontextprotocol/protocolVersion"])
    source = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(example["method"])
    if source:
        out["mcp-name"] = h.encode_value(params[source])
    return out


@pytest.mark.parametrize("path", _client_request_examples(), ids=lambda p: p.parent.name)
def test_every_official_request_example_is_accepted(path):
    example = json.loads(path.read_text())
    call = parse_call(path.read_bytes(), example_headers(example))
    assert call.id == example["id"]
    assert call.method == example["method"]
    assert call.version == V
    assert call.body == path.read_bytes()
    # Backends get the validated message encoded again (Call.wire_body): the same JSON-RPC request.
    assert orjson.loads(call.wire_body()) == {k: example[k] for k in ("jsonrpc", "id", "method", "params")
                                              if k in example}


def test_the_examples_cover_every_client_method():
    methods = {json.loads(p.read_text())["method"] for p in _client_request_examples()}
    assert {"server/discover", "tools/list", "tools/call", "prompts/get", "resources/read",
            "subscriptions/listen"} <= methods


def test_name_is_decoded_from_the_sentinel():
    call = parse_call(orjson.dumps(msg("tools/call", {"name": "météo"})),
                      hdrs("tools/call", name=h.encode_value("météo")))
    assert call.name == "météo"


def test_header_names_are_case_insensitive_but_values_are_not():
    # header_dict lower-cases names; "MCP-METHOD" arrives as "mcp-method".
    call = parse_call(orjson.dumps(msg("tools/list")), {"mcp-protocol-version": V, "mcp-method": "tools/list"})
    assert call.method == "tools/list"
    err = rejected(msg("tools/call", {"name": "x"}), hdrs("TOOLS/CALL", name="x"))
    assert err.code == rpc.HEADER_MISMATCH and err.data == {"header": "Mcp-Method"}


def test_notification_is_accepted_without_headers():
    call = parse_call(orjson.dumps(msg("notifications/whatever", id=None)), {})
    assert call.is_notification


def test_mcp_session_id_and_last_event_id_are_ignored():
    call = parse_call(orjson.dumps(msg()), hdrs(**{"mcp-session-id": "abc", "last-event-id": "7"}))
    assert call.method == "tools/list"


def test_unknown_extra_meta_and_log_level_accepted():
    meta = {**META, "io.modelcontextprotocol/logLevel": "warning", "traceparent": "00-abc-def-01"}
    call = parse_call(orjson.dumps(msg(meta=meta)), hdrs())
    assert call.log_level == "warning"


# -- one row each (digest §a.3), in the order of §a.5 ------------------------------------


@pytest.mark.parametrize("body", [b"{", b"", b"not json", b'{"jsonrpc": "2.0",}'])
def test_parse_error(body):
    err = rejected(body, hdrs())
    assert (err.status, err.code, err.request_id) == (400, rpc.PARSE_ERROR, None)


@pytest.mark.parametrize(
    ("body", "has_id"),
    [
        ([msg(), msg(id=2)], False),  # batch
        ([], False),
        ("tools/list", False),
        (42, False),
        ({**msg(), "jsonrpc": "1.0"}, True),
        ({k: v for k, v in msg().items() if k != "jsonrpc"}, True),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, True),  # clients must not send responses
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "x"}}, True),
        ({**msg(), "method": 7}, True),
        ({**msg(), "id": None}, False),  # id MUST NOT be null
        ({**msg(), "id": True}, False),
        ({**msg(), "id": 1.5}, False),
        ({**msg(), "id": {"a": 1}}, False),
        ({**msg(), "params": [1, 2]}, True),
    ],
)
def test_not_a_single_request_or_notification(body, has_id):
    err = rejected(body, hdrs())
    assert (err.status, err.code) == (400, rpc.INVALID_REQUEST)
    assert err.request_id == (1 if has_id else None)


@pytest.mark.parametrize(
    ("method", "headers", "header"),
    [
        ("tools/list", hdrs(version=None), "MCP-Protocol-Version"),
        ("tools/list", {"mcp-protocol-version": V}, "Mcp-Method"),
        ("tools/call", hdrs("tools/call"), "Mcp-Name"),
        ("prompts/get", hdrs("prompts/get"), "Mcp-Name"),
        ("resources/read", hdrs("resources/read"), "Mcp-Name"),
    ],
)
def test_required_header_missing(method, headers, header):
    params = {"uri": "file:///a"} if method == "resources/read" else {"name": "x"}
    err = rejected(msg(method, params), headers)
    assert (err.status, err.code, err.request_id, err.data) == (400, rpc.HEADER_MISMATCH, 1, {"header": header})
    assert header in err.message


@pytest.mark.parametrize(
    ("method", "params", "headers", "header"),
    [
        ("tools/list", {}, hdrs("prompts/list"), "Mcp-Method"),
        ("tools/call", {"name": "bar"}, hdrs("tools/call", name="foo"), "Mcp-Name"),
        ("prompts/get", {"name": "bar"}, hdrs("prompts/get", name="Bar"), "Mcp-Name"),
        ("resources/read", {"uri": "file:///a"}, hdrs("resources/read", name="file:///b"), "Mcp-Name"),
        # The sentinel is decoded before comparing; a wrong decoded value is a mismatch.
        ("tools/call", {"name": "météo"}, hdrs("tools/call", name=h.encode_value("meteo")), "Mcp-Name"),
        # A broken sentinel (bad padding) is an invalid header value.
        ("tools/call", {"name": "Hello"}, hdrs("tools/call", name="=?base64?SGVsbG8?="), "Mcp-Name"),
        # Invalid characters in the header value.
        ("tools/call", {"name": "é"}, hdrs("tools/call", name="\xc3\xa9"), "Mcp-Name"),
        # MCP-Protocol-Version vs _meta protocolVersion (SHTTP §Protocol Version Header).
        ("tools/list", {}, hdrs(version="2025-11-25"), "MCP-Protocol-Version"),
    ],
)
def test_header_does_not_match_body(method, params, headers, header):
    err = rejected(msg(method, params), headers)
    assert (err.status, err.code, err.request_id, err.data) == (400, rpc.HEADER_MISMATCH, 1, {"header": header})


def test_header_mismatch_body_has_the_shape_of_the_spec_example():
    example = json.loads((EXAMPLES / "HeaderMismatchError/header-mismatch.json").read_text())
    err = rejected(msg("tools/call", {"name": "bar"}), hdrs("tools/call", name="foo"))
    body = err.to_message()
    assert body.keys() == example.keys()
    assert {"code", "message"} <= body["error"].keys()
    assert body["error"]["code"] == example["error"]["code"]
    # The message says what differed, like the example's.
    assert "'foo'" in body["error"]["message"] and "'bar'" in body["error"]["message"]


@pytest.mark.parametrize("version", ["1900-01-01", "2025-11-25", "2026-07-29", "latest"])
def test_unsupported_version(version):
    meta = {**META, "io.modelcontextprotocol/protocolVersion": version}
    err = rejected(msg(meta=meta), hdrs(version=version))
    assert (err.status, err.code, err.request_id) == (400, rpc.UNSUPPORTED_PROTOCOL_VERSION, 1)
    example = json.loads((EXAMPLES / "UnsupportedProtocolVersionError/unsupported-version.json").read_text())
    body = err.to_message()
    assert body.keys() == example.keys()
    assert body["error"]["data"].keys() == example["error"]["data"].keys()
    assert body["error"]["data"] == {"supported": [V], "requested": version}


@pytest.mark.parametrize(
    "meta",
    [
        {"io.modelcontextprotocol/clientCapabilities": {}},  # protocolVersion missing
        {"io.modelcontextprotocol/protocolVersion": V},  # clientCapabilities missing
        {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": "all"},
        {**META, "io.modelcontextprotocol/logLevel": "loud"},  # unknown log level (LOG: SHOULD -32602)
    ],
)
def test_missing_or_invalid_meta(meta):
    err = rejected(msg(meta=meta), hdrs())
    assert (err.status, err.code, err.request_id) == (400, rpc.INVALID_PARAMS, 1)


@pytest.mark.parametrize("body", [msg(drop_meta=True), {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}])
def test_missing_meta_object(body):
    err = rejected(body, hdrs())
    assert (err.status, err.code) == (400, rpc.INVALID_PARAMS)


@pytest.mark.parametrize("method", ["initialize", "ping", "logging/setLevel", "resources/subscribe", "nope/nope",
                                    "tasks/get"])
def test_unknown_method(method):
    err = rejected(msg(method), hdrs(method))
    assert (err.status, err.code, err.request_id) == (404, rpc.METHOD_NOT_FOUND, 1)


# -- nesting (RFC 8259 §9: a limit on depth): what is accepted can be encoded again ---------


def _nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("where", ["arguments", "meta-version", "log-level"])
def test_nesting_deeper_than_the_gateway_can_encode_is_invalid_request(where):
    # Each used to fail with a 500: re-encoding the body for a prefixed backend (orjson writes
    # 254 levels), or quoting the value in the error message (repr's recursion limit).
    deep = _nested(rpc.MAX_DEPTH)  # inside the message object: one level too many
    body = orjson.dumps(msg("tools/call", {"name": "t", "arguments": {"a": 1}}))
    if where == "arguments":
        body = body.replace(b'{"a":1}', b'{"a":' + deep + b"}")
    elif where == "meta-version":
        body = body.replace(b'"' + V.encode() + b'"', deep)
    else:
        body = body.replace(b'"_meta":{', b'"_meta":{"io.modelcontextprotocol/logLevel":' + deep + b",")
    err = rejected(body, hdrs("tools/call", name="t"))
    assert (err.status, err.code, err.request_id) == (400, rpc.INVALID_REQUEST, 1)
    assert f"deeper than {rpc.MAX_DEPTH} levels" in err.message


def test_nesting_the_gateway_can_encode_is_accepted_and_rewritten():
    inner = _nested(rpc.MAX_DEPTH - 3)  # message, params, arguments: 254 levels in all
    body = orjson.dumps(msg("tools/call", {"name": "p__t", "arguments": {}})).replace(
        b'"arguments":{}', b'"arguments":{"a":' + inner + b"}")
    call = parse_call(body, hdrs("tools/call", name="p__t"))
    assert orjson.loads(call.with_name("t").wire_body())["params"]["arguments"] == orjson.loads(
        b'{"a":' + inner + b"}")


@pytest.mark.parametrize(("body", "deep"), [
    (b'{"a":"' + b"[" * 600 + b'"}', False),  # brackets in a string are no nesting
    (b"[" + b"[]," * 400 + b"[]]", False),  # many arrays, two levels
    (b'{"a":' + b"[" * 255 + b"]" * 255 + b"}", True),
    (b"[" * 254 + b"]" * 254, False),
    (b"[" * 255 + b"]" * 255, True),
])
def test_too_deep(body, deep):
    assert rpc.too_deep(body, orjson.loads(body)) is deep


# -- the order of digest §a.5: a body wrong in several ways gets the earliest row ----------


def test_order_single_message_before_headers():
    assert rejected([msg()], {}).code == rpc.INVALID_REQUEST


def test_order_header_presence_before_equality():
    err = rejected(msg("tools/call", {"name": "bar"}), hdrs("tools/call", version=None, name="foo"))
    assert err.data == {"header": "MCP-Protocol-Version"}


def test_order_header_mismatch_before_version():
    meta = {**META, "io.modelcontextprotocol/protocolVersion": "1900-01-01"}
    err = rejected(msg("tools/call", {"name": "bar"}, meta=meta), hdrs("tools/call", version="1900-01-01", name="foo"))
    assert err.code == rpc.HEADER_MISMATCH


def test_order_version_before_meta():
    err = rejected(msg(meta={"io.modelcontextprotocol/protocolVersion": "1900-01-01"}), hdrs(version="1900-01-01"))
    assert err.code == rpc.UNSUPPORTED_PROTOCOL_VERSION


def test_order_unsupported_header_version_without_body_version():
    # Header present, body lacks protocolVersion: the version row comes before the _meta row.
    err = rejected(msg(drop_meta=True), hdrs(version="1900-01-01"))
    assert err.code == rpc.UNSUPPORTED_PROTOCOL_VERSION


def test_order_meta_before_method():
    err = rejected(msg("nope/nope", drop_meta=True), hdrs("nope/nope"))
    assert err.code == rpc.INVALID_PARAMS


# -- Mcp-Param-* against a tool's annotations (SHTTP §Server Behavior for Custom Headers) ---

REGION = h.ParamHeader("Region", ("region",))
COUNT = h.ParamHeader("Count", ("opts", "count"))


def tool_call(arguments: dict[str, Any], **param_headers: str):
    headers = hdrs("tools/call", name="t", **{f"mcp-param-{k.lower()}": v for k, v in param_headers.items()})
    return parse_call(orjson.dumps(msg("tools/call", {"name": "t", "arguments": arguments})), headers)


@pytest.mark.parametrize(
    ("arguments", "headers"),
    [
        ({"region": "us-west1"}, {"Region": "us-west1"}),
        ({"region": "日本"}, {"Region": h.encode_value("日本")}),
        ({"region": "x", "opts": {"count": 42}}, {"Region": "x", "Count": "42"}),
        ({"region": "x", "opts": {"count": 42}}, {"Region": "x", "Count": "42.0"}),  # numeric comparison
        ({}, {}),  # absent argument -> no header expected
        ({"region": None}, {}),  # null argument -> no header expected
        ({"region": "x", "other": 1}, {"Region": "x", "Unknown": "whatever"}),  # unrecognized: ignored
    ],
)
def test_param_headers_accepted(arguments, headers):
    check_param_headers(tool_call(arguments, **headers), (REGION, COUNT))


@pytest.mark.parametrize(
    ("arguments", "headers", "header"),
    [
        ({"region": "us-west1"}, {}, "Mcp-Param-Region"),  # value in body, header omitted
        ({"region": "us-west1"}, {"Region": "eu-west1"}, "Mcp-Param-Region"),
        ({"region": "x", "opts": {"count": 42}}, {"Region": "x", "Count": "41"}, "Mcp-Param-Count"),
        ({"region": "x"}, {"Region": "=?base64?eA?="}, "Mcp-Param-Region"),  # bad padding
        ({"region": "x"}, {"Region": "x", "Count": "1"}, "Mcp-Param-Count"),  # header without a value
    ],
)
def test_param_headers_rejected(arguments, headers, header):
    with pytest.raises(rpc.McpError) as info:
        check_param_headers(tool_call(arguments, **headers), (REGION, COUNT))
    err = info.value
    assert (err.status, err.code, err.request_id, err.data) == (400, rpc.HEADER_MISMATCH, 1, {"header": header})


# -- the Call itself -----------------------------------------------------------------------


def test_with_name_rewrites_body_and_keeps_the_rest():
    call = parse_call(orjson.dumps(msg("tools/call", {"name": "alpha__echo", "arguments": {"text": "hi"}})),
                      hdrs("tools/call", name="alpha__echo"))
    upstream = call.with_name("echo")
    sent = orjson.loads(upstream.wire_body())
    assert sent["params"]["name"] == "echo" and upstream.name == "echo"
    assert sent["params"]["arguments"] == {"text": "hi"}
    assert sent["params"]["_meta"] == META
    assert sent["id"] == 1
    assert call.with_name("alpha__echo") is call  # nothing to rewrite: same bytes go upstream
