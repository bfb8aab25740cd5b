"""A backend's HTTP status as the client sees it (gateway/backends/modern.py `_refused`): a
backend's 401/403 or any other 4xx without a relayable JSON-RPC error is the backend refusing
the gateway, so the client gets 502 / -31001 naming the backend and the status, never the
backend's auth challenge; a JSON-RPC error at 400/404 keeps its code and its spec status."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.support import mcp_http
from tests.support.asgi import read_body
from tests.support.gateway import running_gateway
from tests.support.oauth import serve

# tools/call name → (status, extra headers, body) the backend answers with.
ANSWERS: dict[str, tuple[int, list[tuple[bytes, bytes]], bytes]] = {
    "unauthorized": (401, [(b"www-authenticate", b'Bearer realm="backend", error="invalid_token"'),
                           (b"content-type", b"application/json")], b'{"error": "invalid_token"}'),
    "forbidden": (403, [(b"content-type", b"text/plain")], b"forbidden"),
    "forbidden_rpc": (403, [(b"content-type", b"application/json")],
                      b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "no access"}}'),
    "not_allowed": (405, [(b"content-type", b"text/plain")], b"method not allowed"),
    "bad_params": (400, [(b"content-type", b"application/json")],
                   b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad arguments"}}'),
    "missing": (404, [(b"content-type", b"application/json")],
                b'{"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no such method"}}'),
}


async def backend(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = await read_body(receive)
    msg = orjson.loads(body)
    rid, method = msg.get("id"), msg.get("method")
    if method == "tools/call":
        status, headers, payload = ANSWERS[msg["params"]["name"]]
    else:
        result: dict[str, Any] = {"resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
        if method == "server/discover":
            result.update(supportedVersions=["2026-07-28"], capabilities={"tools": {}})
        elif method == "tools/list":
            result["tools"] = [{"name": name, "inputSchema": {"type": "object"}} for name in ANSWERS]
        status, headers = 200, [(b"content-type", b"application/json")]
        payload = orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture
async def gw():
    async with serve(backend) as served, \
            running_gateway({"backends": [{"name": "strict", "url": f"{served.base}/mcp"}]}) as gw:
        yield gw


async def call(gw: Any, tool: str) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        return await mcp_http.post(client, gw.url, "tools/call", {"name": tool, "arguments": {}})


@pytest.mark.parametrize(("tool", "status"), [("unauthorized", 401), ("forbidden", 403), ("forbidden_rpc", 403),
                                              ("not_allowed", 405)])
async def test_a_backend_refusing_the_gateway_is_a_502_naming_backend_and_status(gw, tool, status):
    response = await call(gw, tool)
    assert response.status_code == 502
    assert "www-authenticate" not in response.headers  # not the gateway's own challenge
    error = response.json()["error"]
    assert error["code"] == -31001
    assert error["data"] == {"backend": "strict", "status": status}
    assert "'strict'" in error["message"] and f"HTTP {status}" in error["message"]


@pytest.mark.parametrize(("tool", "status", "code"), [("bad_params", 400, -32602), ("missing", 404, -32601)])
async def test_a_json_rpc_error_at_400_or_404_keeps_its_code_and_status(gw, tool, status, code):
    response = await call(gw, tool)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
