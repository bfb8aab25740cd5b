"""The demo backend: a minimal, dependency-free modern (2026-07-28) MCP server in raw ASGI.

It exists so that a new user sees the gateway work end to end with nothing installed but the
gateway: three tools (one streams progress), a resource, a prompt. It is not a test fixture;
the tests use the official SDK's servers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway import __version__, asgi
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import meta, sse

SERVER_INFO = {"name": "mcp-gateway-demo", "version": __version__}
VERSIONS = ["2026-07-28"]

TOOLS = [
    {
        "name": "echo",
        "description": "Echo the text back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
    {
        "name": "add",
        "description": "Add two integers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "countdown",
        "description": "Count down from n, reporting progress each step (send a progressToken to see it).",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 20}}},
    },
]
RESOURCES = [{"uri": "demo://readme", "name": "readme", "mimeType": "text/plain"}]
PROMPTS = [{"name": "greet", "description": "Greet someone.", "arguments": [{"name": "name", "required": True}]}]
CACHE = {"ttlMs": 60_000, "cacheScope": "public"}


def _result(**fields: Any) -> dict[str, Any]:
    return {"resultType": "complete", **fields, "_meta": {meta.SERVER_INFO: SERVER_INFO}}


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


async def demo_app(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] != "POST":
        await asgi.send_json(send, 405, rpc.error_message(None, rpc.INVALID_REQUEST, "use POST"), [(b"allow", b"POST")])
        return
    body = await asgi.read_body(receive, 1 << 20)
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError:
        await asgi.send_json(send, 400, rpc.error_message(None, rpc.PARSE_ERROR, "Parse error"))
        return
    if not isinstance(msg, dict) or "id" not in msg:
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    rid, method, params = msg["id"], msg.get("method"), msg.get("params") or {}
    version = (params.get("_meta") or {}).get(meta.PROTOCOL_VERSION)
    if version not in VERSIONS:
        err = rpc.unsupported_version(str(version), VERSIONS, rid)
        await asgi.send_error(send, err)
        return
    if method == "tools/call" and params.get("name") == "countdown":
        await _countdown(rid, params, send)
        return
    try:
        result = _answer(method, params)
    except rpc.McpError as exc:
        await asgi.send_error(send, exc.with_id(rid))
        return
    await asgi.send_json(send, 200, rpc.result_message(rid, result))


def _answer(method: str | None, params: dict[str, Any]) -> dict[str, Any]:
    if method == "server/discover":
        caps = {"tools": {}, "resources": {}, "prompts": {}}
        return _result(supportedVersions=VERSIONS, capabilities=caps, ttlMs=3_600_000, cacheScope="public")
    if method == "tools/list":
        return _result(tools=TOOLS, **CACHE)
    if method == "resources/list":
        return _result(resources=RESOURCES, **CACHE)
    if method == "resources/templates/list":
        return _result(resourceTemplates=[], **CACHE)
    if method == "prompts/list":
        return _result(prompts=PROMPTS, **CACHE)
    if method == "resources/read":
        if params.get("uri") != "demo://readme":
            raise rpc.invalid_params(f"Resource not found: {params.get('uri')!r}", data={"uri": params.get("uri")})
        text = "This is the mcp-gateway demo backend. Try the tools echo, add and countdown."
        return _result(contents=[{"uri": "demo://readme", "mimeType": "text/plain", "text": text}], **CACHE)
    if method == "prompts/get":
        if params.get("name") != "greet":
            raise rpc.invalid_params(f"Unknown prompt: {params.get('name')!r}")
        who = (params.get("arguments") or {}).get("name", "world")
        return _result(messages=[{"role": "user", "content": {"type": "text", "text": f"Say hello to {who}."}}])
    if method == "tools/call":
        args = params.get("arguments") or {}
        if params.get("name") == "echo":
            return _result(**_text(str(args.get("text", ""))))
        if params.get("name") == "add":
            a, b = args.get("a"), args.get("b")
            if not isinstance(a, int) or not isinstance(b, int):
                return _result(content=[{"type": "text", "text": "a and b must be integers"}], isError=True)
            return _result(**_text(str(a + b)), structuredContent={"sum": a + b})
        raise rpc.invalid_params(f"Unknown tool: {params.get('name')!r}")
    raise rpc.method_not_found(str(method))


async def _countdown(rid: Any, params: dict[str, Any], send: asgi.Send) -> None:
    n = (params.get("arguments") or {}).get("n", 3)
    n = n if isinstance(n, int) and 1 <= n <= 20 else 3
    token = (params.get("_meta") or {}).get(meta.PROGRESS_TOKEN)
    await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS})
    for i in range(n):
        if token is not None:
            note = rpc.notification("notifications/progress",
                                    {"progressToken": token, "progress": i + 1, "total": n, "message": f"{n - i}…"})
            await send({"type": "http.response.body", "body": sse.encode(note), "more_body": True})
        await asyncio.sleep(0.2)
    final = rpc.result_message(rid, _result(**_text("liftoff")))
    await send({"type": "http.response.body", "body": sse.encode(final), "more_body": False})
