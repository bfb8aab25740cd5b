"""Request validation over real HTTP (digest §a.3, §a.5, §b): one test per row of the outcome
table, raw requests against a gateway on loopback in front of a real backend, asserting the
status, the JSON-RPC code and the shape of the body. The official request examples of the
schema are the fixtures for "accepted"."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio

from gateway.protocol import headers as h
from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.procs import SPEC_EXAMPLES
from tests.support.scripted import Scripted

# One gateway for the module: every test is a request and reads back only its own traces.
pytestmark = pytest.mark.asyncio(loop_scope="module")

EXAMPLES = SPEC_EXAMPLES
V = mcp_http.VERSION


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    with Scripted("solo") as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(backend):
    # The modern-only gateway: the rows of digest §a.3 as a 2026-07-28 server answers them.
    # (Serving initialize-era clients on the same endpoint claims some legacy-looking
    # requests first; that is tests/integration/test_legacy_clients_*.)
    settings = {"backends": [{"name": "solo", "url": backend.url}],
                "server": {"max_body_bytes": 4096, "legacy_clients": False}}
    async with running_gateway(settings) as gw:
        yield gw


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        yield c


async def raw(client: httpx.AsyncClient, gw: Any, body: Any, headers: dict[str, str]) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return await client.post(gw.url, content=content, headers=headers)


def assert_error(response: httpx.Response, status: int, code: int, *, id: Any = 1) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "result" not in body
    if id is None:
        assert "id" not in body  # the id is omitted only when it could not be read
    else:
        assert body["id"] == id
    return body


# -- accepted: every official client request example reaches the backend -------------------


def _examples() -> list[Path]:
    out = []
    for path in sorted(EXAMPLES.glob("*Request/*.json")):
        example = json.loads(path.read_text())
        # Client->server requests only; the listen stream belongs to the subscription hub.
        if "jsonrpc" in example and "id" in example and example["method"] != "subscriptions/listen":
            out.append(path)
    assert out, f"the official examples are missing from {EXAMPLES}"
    return out


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.parent.name)
async def test_official_request_example_passes_validation_and_is_forwarded(gw, client, backend, path):
    example = json.loads(path.read_text())
    params = example["params"]
    headers = mcp_http.headers(example["method"])
    source = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(example["method"])
    if source:
        headers["mcp-name"] = h.encode_value(params[source])
    response = await raw(client, gw, path.read_bytes(), headers)
    # Whatever the backend makes of it, the gateway's validator let it through: the answer
    # carries the example's id and no validation code.
    body = response.json()
    assert body["id"] == example["id"]
    assert body.get("error", {}).get("code") not in (-32700, -32600, -32601, -32020, -32022)
    if example["method"] != "server/discover":  # answered by the gateway itself
        seen = [c for c in await backend.calls(example["method"]) if c["id"] == example["id"]]
        assert seen, f"{example['method']} never reached the backend"


async def test_discover_answered_with_status_200(gw, client):
    response = await mcp_http.post(client, gw.url, "server/discover")
    assert response.status_code == 200
    assert response.json()["result"]["resultType"] == "complete"


# -- Origin and Host (digest §a.2) ---------------------------------------------------------


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1.evil.example",
                                    "file://", "http://localhost.evil.example:80"])
async def test_foreign_origin_is_forbidden(gw, client, origin):
    response = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"origin": origin})
    body = assert_error(response, 403, -32600, id=None)
    assert origin.lower() in body["error"]["message"]


@pytest.mark.parametrize("origin", ["http://127.0.0.1", "http://localhost:3000", "http://[::1]:8080",
                                    "https://app.localhost"])
async def test_loopback_origins_are_allowed(gw, client, origin):
    response = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"origin": origin})
    assert response.status_code == 200, response.text


async def test_same_host_origin_is_allowed(gw, client):
    response = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"origin": gw.base})
    assert response.status_code == 200


async def test_configured_origin_is_allowed(backend, client):
    settings = {"backends": [{"name": "solo", "url": backend.url}],
                "server": {"allowed_origins": ["https://App.Example.com"]}}
    async with running_gateway(settings) as gw:
        ok = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"origin": "https://app.example.com"})
        assert ok.status_code == 200
        other = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"origin": "https://other.example.com"})
        assert_error(other, 403, -32600, id=None)


async def test_origin_is_not_forwarded_to_the_backend(gw, client, backend):
    await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "o"}}, id="origin-check",
                        extra_headers={"origin": "http://localhost:1234", "authorization": "Bearer secret"})
    (call,) = [c for c in await backend.calls("tools/call") if c["id"] == "origin-check"]
    assert call["headers"] == {}  # neither Origin nor the client's credential went upstream


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "10.0.0.1", "127.0.0.1.nip.io"])
async def test_non_loopback_host_is_refused_when_bound_to_loopback(gw, client, host):
    # A DNS-rebinding page reaches 127.0.0.1 under its own name; its Origin would even be
    # "same-host", so the Host check is what stops it.
    response = await mcp_http.post(client, gw.url, "tools/list",
                                   extra_headers={"host": host, "origin": f"http://{host}"})
    body = assert_error(response, 403, -32600, id=None)
    assert "Host" in body["error"]["message"]


@pytest.mark.parametrize("host", ["localhost", "localhost:9999", "127.0.0.1", "[::1]:80"])
async def test_loopback_host_names_are_accepted(gw, client, host):
    response = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"host": host})
    assert response.status_code == 200, response.text


# -- body size, JSON, message shape --------------------------------------------------------


async def test_body_over_the_cap_is_413(gw, client):
    big = mcp_http.body("tools/call", {"name": "echo", "arguments": {"text": "x" * 5000}})
    response = await raw(client, gw, big, mcp_http.headers("tools/call", "echo"))
    assert_error(response, 413, -32600, id=None)


async def test_chunked_body_over_the_cap_is_413(gw, client):
    # No Content-Length: the cap is enforced while reading.
    big = orjson.dumps(mcp_http.body("tools/call", {"name": "echo", "arguments": {"text": "x" * 5000}}))

    async def chunks():
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    response = await client.post(gw.url, content=chunks(), headers=mcp_http.headers("tools/call", "echo"))
    assert_error(response, 413, -32600, id=None)


async def test_parse_error(gw, client):
    response = await raw(client, gw, b'{"jsonrpc": "2.0", "id": 1,', mcp_http.headers("tools/list"))
    assert_error(response, 400, -32700, id=None)


@pytest.mark.parametrize(
    ("body", "id"),
    [
        ([mcp_http.body("tools/list"), mcp_http.body("prompts/list", id=2)], None),
        ({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "complete"}}, 1),
        ({**mcp_http.body("tools/list"), "jsonrpc": "1.0"}, 1),
        ({**mcp_http.body("tools/list"), "id": None}, None),
    ],
)
async def test_not_a_single_request(gw, client, body, id):
    response = await raw(client, gw, body, mcp_http.headers("tools/list"))
    assert_error(response, 400, -32600, id=id)


# -- headers ↔ body (digest §b) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "drop"),
    [
        ("tools/list", {}, "mcp-protocol-version"),
        ("tools/list", {}, "mcp-method"),
        ("tools/call", {"name": "echo", "arguments": {"text": "x"}}, "mcp-name"),
        ("prompts/get", {"name": "greet"}, "mcp-name"),
        ("resources/read", {"uri": "scripted://solo/doc-0"}, "mcp-name"),
    ],
)
async def test_required_header_missing(gw, client, method, params, drop):
    headers = mcp_http.headers(method, params.get("name") or params.get("uri"))
    del headers[drop]
    response = await raw(client, gw, mcp_http.body(method, params), headers)
    body = assert_error(response, 400, -32020)
    assert body["error"]["data"]["header"].lower() == drop


@pytest.mark.parametrize(
    ("method", "params", "override"),
    [
        ("tools/list", {}, {"mcp-method": "prompts/list"}),
        ("tools/call", {"name": "echo", "arguments": {"text": "x"}}, {"mcp-method": "TOOLS/CALL"}),
        ("tools/call", {"name": "echo", "arguments": {"text": "x"}}, {"mcp-name": "other"}),
        ("resources/read", {"uri": "scripted://solo/doc-0"}, {"mcp-name": "scripted://solo/doc-1"}),
        ("tools/call", {"name": "echo", "arguments": {"text": "x"}}, {"mcp-name": "=?base64?ZWNobw?="}),  # bad padding
        ("tools/call", {"name": "echo", "arguments": {"text": "x"}}, {"mcp-name": h.encode_value("écho")}),
        ("tools/list", {}, {"mcp-protocol-version": "2025-11-25"}),  # header ≠ _meta protocolVersion
    ],
)
async def test_header_does_not_match_body(gw, client, method, params, override):
    headers = {**mcp_http.headers(method, params.get("name") or params.get("uri")), **override}
    response = await raw(client, gw, mcp_http.body(method, params), headers)
    assert_error(response, 400, -32020)


async def test_header_matching_is_case_insensitive_on_names_and_trims_whitespace(gw):
    # httpx refuses to send padded header values, so this request is written by hand.
    body = orjson.dumps(mcp_http.body("tools/call", {"name": "echo", "arguments": {"text": "ws"}}))
    head = (f"POST {gw.app.settings.server.path} HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"MCP-PROTOCOL-VERSION: {V}\r\nMCP-METHOD: tools/call\r\nmcp-NAME:   echo \t\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(head.encode() + body)
    await writer.drain()
    response = await reader.read()
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 200 OK", response
    assert orjson.loads(rest.split(b"\r\n\r\n", 1)[1])["result"]["content"][0]["text"] == "solo: ws"


async def test_sentinel_encoded_name_is_decoded_and_re_encoded_upstream(gw, client, backend):
    uri = "scripted://solo/items/naïve café"
    response = await raw(client, gw, mcp_http.body("resources/read", {"uri": uri}, id="sentinel"),
                         mcp_http.headers("resources/read", h.encode_value(uri)))
    assert response.status_code == 200, response.text
    assert response.json()["result"]["contents"][0]["uri"] == uri
    (seen,) = [c for c in await backend.calls("resources/read") if c["id"] == "sentinel"]
    assert seen["mcp-name"] == h.encode_value(uri)


async def test_mcp_param_header_required_when_argument_present(gw, client, backend):
    params = {"name": "regional", "arguments": {"region": "eu-west1"}}
    # Omitted header with the value in the body: rejected (digest §b.2 "Server MUST reject").
    missing = await raw(client, gw, mcp_http.body("tools/call", params), mcp_http.headers("tools/call", "regional"))
    body = assert_error(missing, 400, -32020)
    assert body["error"]["data"]["header"] == "Mcp-Param-Region"
    # Wrong value: rejected.
    wrong = await raw(client, gw, mcp_http.body("tools/call", params),
                      mcp_http.headers("tools/call", "regional", **{"mcp-param-region": "us-east1"}))
    assert_error(wrong, 400, -32020)
    # Invalid encoding: rejected.
    broken = await raw(client, gw, mcp_http.body("tools/call", params),
                       mcp_http.headers("tools/call", "regional", **{"mcp-param-region": "=?base64?ZXU?="}))
    assert_error(broken, 400, -32020)
    # A decoded value that differs only by whitespace is still a different value.
    padded = await raw(client, gw, mcp_http.body("tools/call", params),
                       mcp_http.headers("tools/call", "regional", **{"Mcp-Param-Region": h.encode_value("eu-west1 ")}))
    assert_error(padded, 400, -32020)
    # Right value: accepted and relayed to the backend, plain or in the sentinel form.
    good = await raw(client, gw, mcp_http.body("tools/call", params),
                     mcp_http.headers("tools/call", "regional", **{"Mcp-Param-Region": "eu-west1"}))
    assert good.status_code == 200, good.text
    assert good.json()["result"]["content"][0]["text"] == "solo: region header 'eu-west1'"
    tokyo = {"name": "regional", "arguments": {"region": "東京"}}
    encoded = await raw(client, gw, mcp_http.body("tools/call", tokyo),
                        mcp_http.headers("tools/call", "regional", **{"mcp-param-region": h.encode_value("東京")}))
    assert encoded.status_code == 200, encoded.text
    assert encoded.json()["result"]["content"][0]["text"] == f"solo: region header {h.encode_value('東京')!r}"


async def test_unrecognized_mcp_param_header_is_forwarded_and_ignored(gw, client, backend):
    response = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "p"}},
                                   id="unknown-param", extra_headers={"mcp-param-whatever": "x y"})
    assert response.status_code == 200
    (seen,) = [c for c in await backend.calls("tools/call") if c["id"] == "unknown-param"]
    assert seen["headers"] == {"mcp-param-whatever": "x y"}


async def test_tool_with_invalid_annotation_is_not_offered(gw, client):
    names: list[str] = []
    cursor = None
    while True:
        response = await mcp_http.post(client, gw.url, "tools/list", {"cursor": cursor} if cursor else {})
        result = response.json()["result"]
        names += [t["name"] for t in result["tools"]]
        cursor = result.get("nextCursor")
        if cursor is None:
            break
    assert "regional" in names
    assert "bad_header_tool" not in names  # x-mcp-header on a number: the whole tool is invalid


# -- version, _meta, method ----------------------------------------------------------------


async def test_unsupported_version(gw, client):
    meta = {"io.modelcontextprotocol/protocolVersion": "1900-01-01"}
    response = await raw(client, gw, mcp_http.body("tools/list", meta=meta),
                         {**mcp_http.headers("tools/list"), "mcp-protocol-version": "1900-01-01"})
    body = assert_error(response, 400, -32022)
    example = json.loads((EXAMPLES / "UnsupportedProtocolVersionError/unsupported-version.json").read_text())
    assert body.keys() == example.keys()
    assert body["error"]["data"].keys() == example["error"]["data"].keys()
    assert body["error"]["data"] == {"supported": [V], "requested": "1900-01-01"}


@pytest.mark.parametrize("drop", ["io.modelcontextprotocol/protocolVersion",
                                  "io.modelcontextprotocol/clientCapabilities"])
async def test_missing_meta_field(gw, client, drop):
    body = mcp_http.body("tools/list")
    del body["params"]["_meta"][drop]
    response = await raw(client, gw, body, mcp_http.headers("tools/list"))
    assert_error(response, 400, -32602)


@pytest.mark.parametrize("method", ["initialize", "ping", "resources/subscribe", "logging/setLevel", "made/up"])
async def test_unknown_method(gw, client, method):
    response = await raw(client, gw, mcp_http.body(method), mcp_http.headers(method))
    body = assert_error(response, 404, -32601)
    assert method in body["error"]["message"]


async def test_notification_is_202_without_body(gw, client):
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    response = await raw(client, gw, note, mcp_http.headers("notifications/cancelled"))
    assert response.status_code == 202
    assert response.content == b""


@pytest.mark.parametrize("verb", ["GET", "DELETE", "PUT"])
async def test_other_http_methods_are_405(gw, client, verb):
    response = await client.request(verb, gw.url, headers={"accept": "text/event-stream"})
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


async def test_session_id_and_last_event_id_are_ignored(gw, client):
    response = await mcp_http.post(client, gw.url, "tools/list",
                                   extra_headers={"mcp-session-id": "stale-session", "last-event-id": "42"})
    assert response.status_code == 200
    assert "mcp-session-id" not in response.headers  # never minted or echoed


async def test_dual_era_gateway_answers_modern_requests_the_modern_way(backend, client):
    # With legacy clients served too (the default), a request with the modern version header
    # stays modern even when it carries a stale session id, and its errors are modern.
    async with running_gateway({"backends": [{"name": "solo", "url": backend.url}]}) as gw:
        ok = await mcp_http.post(client, gw.url, "tools/list", extra_headers={"mcp-session-id": "stale"})
        assert ok.status_code == 200 and "mcp-session-id" not in ok.headers
        mismatch = await raw(client, gw, mcp_http.body("tools/call", {"name": "echo"}),
                             mcp_http.headers("tools/call", "other"))
        assert_error(mismatch, 400, -32020)
        missing = await raw(client, gw, {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                            mcp_http.headers("tools/list"))
        assert_error(missing, 400, -32602)


# -- order (digest §a.5): a request wrong in several ways gets the earliest row -------------


async def test_origin_before_everything(gw, client):
    response = await raw(client, gw, b"{not json", {"origin": "https://evil.example"})
    assert_error(response, 403, -32600, id=None)


async def test_parse_before_headers(gw, client):
    response = await raw(client, gw, b"{not json", {})
    assert_error(response, 400, -32700, id=None)


async def test_header_mismatch_before_version_and_meta(gw, client):
    body = mcp_http.body("tools/call", {"name": "echo"}, meta={"io.modelcontextprotocol/protocolVersion": "1900-01-01"})
    response = await raw(client, gw, body, {**mcp_http.headers("tools/call", "other"),
                                            "mcp-protocol-version": "1900-01-01"})
    assert_error(response, 400, -32020)


async def test_version_before_meta_before_method(gw, client):
    body = {"jsonrpc": "2.0", "id": 1, "method": "made/up", "params": {}}
    response = await raw(client, gw, body, {**mcp_http.headers("made/up"), "mcp-protocol-version": "1900-01-01"})
    assert_error(response, 400, -32022)
    response = await raw(client, gw, body, mcp_http.headers("made/up"))
    assert_error(response, 400, -32602)


async def test_a_repeated_mirrored_header_is_a_header_mismatch(gw, client):
    # Two Mcp-Method lines: one intermediary may route on the first, another on the last.
    body = mcp_http.body("tools/list")
    raw = [(k, v) for k, v in mcp_http.headers("tools/list").items()] + [("mcp-method", "tools/call")]
    response = await client.post(gw.url, content=orjson.dumps(body), headers=raw)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020
