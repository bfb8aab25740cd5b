"""Raw MCP-over-HTTP requests for tests that must control every header and byte."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

VERSION = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": {}}


def body(method: str, params: dict[str, Any] | None = None, *, id: Any = 1, meta: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    p = dict(params or {})
    p["_meta"] = {**META, **(meta or {})}
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": p}


def headers(method: str, name: str | None = None, **extra: str) -> dict[str, str]:
    h = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": VERSION,
        "mcp-method": method,
    }
    if name is not None:
        h["mcp-name"] = name
    h.update(extra)
    return h


async def post(client: httpx.AsyncClient, url: str, method: str, params: dict[str, Any] | None = None, *,
               name: str | None = None, id: Any = 1, meta: dict[str, Any] | None = None,
               extra_headers: dict[str, str] | None = None) -> httpx.Response:
    if name is None and params:
        name = params.get("name") if method in ("tools/call", "prompts/get") else params.get("uri")
    return await client.post(url, content=orjson.dumps(body(method, params, id=id, meta=meta)),
                             headers=headers(method, name, **(extra_headers or {})))


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if data:
            out.append(orjson.loads("\n".join(data)))
    return out
