"""A fast, minimal MCP backend for benchmarks (raw ASGI + orjson, served by uvicorn).

    python bench/backend.py --port 9001 --mode modern [--tools 10] [--ttl-ms 60000]
    python bench/backend.py --port 9002 --mode legacy

modern  (revision 2026-07-28, stateless): POST /mcp answers ``server/discover``,
        ``tools/list`` (N tools; ``ttlMs`` + ``cacheScope: "public"``) and ``tools/call``
        (tool ``echo`` returns its ``text`` argument), every result with
        ``resultType: "complete"``, always as ``application/json``.  The standard headers are
        checked cheaply (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name`` present and equal
        to the body, digest §a.3/§b.1) so a proxy that forwards wrong headers shows up as 400s
        in the numbers instead of silently being measured on a fast error path.

legacy  (2025-11-25, initialize era): ``initialize`` mints an ``Mcp-Session-Id``;
        ``notifications/initialized`` -> 202; ``tools/list`` / ``tools/call`` need the session
        header (400 without one, 404 for an unknown one); ``server/discover`` without an
        initialized session -> HTTP 400 with JSON-RPC error -32000 (what the reference SDK
        servers answer), with a session -> -32601.  No ``resultType`` in results.
        DELETE /mcp ends a session; GET /mcp -> 405 (no standalone stream here).

Both: GET /healthz -> 200 ``ok`` (used by the harness to wait for readiness);
      GET /stats -> ``{"posts": N}`` (POSTs received, so the harness can tell how many
      client requests a proxy actually forwarded, e.g. 0 on a cache hit).

This is deliberately not a general MCP server: it exists so that the backend costs as little
CPU as possible and a proxy's overhead is visible.  Never use it in tests as a reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections import OrderedDict

import orjson

MODERN_VERSION = "2026-07-28"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LEGACY_LATEST = "2025-11-25"
MAX_BODY = 4 * 1024 * 1024
MAX_SESSIONS = 100_000

JSON_HEADERS = [(b"content-type", b"application/json")]
TEXT_HEADERS = [(b"content-type", b"text/plain")]


def _tools(n: int) -> list[dict]:
    tools = [
        {
            "name": "echo",
            "description": "Echo the text argument back.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "What to echo"}},
                "required": ["text"],
            },
        }
    ]
    for i in range(1, n):
        tools.append(
            {
                "name": f"tool-{i}",
                "description": f"Benchmark filler tool number {i}.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                },
            }
        )
    return tools


def _error_body(id_, code: int, message: str, data=None) -> bytes:
    err = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    msg = {"jsonrpc": "2.0", "error": err}
    if id_ is not None:
        msg["id"] = id_
    return orjson.dumps(msg)


def _result_raw(id_, result_json: bytes) -> bytes:
    # Splice a pre-serialized result so hot paths serialize only the id.
    return b'{"jsonrpc":"2.0","id":' + orjson.dumps(id_) + b',"result":' + result_json + b"}"


async def _read_body(receive) -> bytes | None:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > MAX_BODY:
                return None
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send, status: int, body: bytes, headers=JSON_HEADERS) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _headers(scope) -> dict[bytes, bytes]:
    # ASGI servers deliver lower-cased header names.
    return dict(scope["headers"])


class Base:
    def __init__(self, tools: int, ttl_ms: int, path: str) -> None:
        self.path = path
        self.tools = _tools(tools)
        self.posts = 0          # POSTs received; GET /stats lets the harness see forwarding

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        method = scope["method"]
        if path == "/healthz":
            await _send(send, 200, b"ok", TEXT_HEADERS)
            return
        if path == "/stats":
            await _send(send, 200, orjson.dumps({"posts": self.posts}))
            return
        if path != self.path:
            await _send(send, 404, b"not found", TEXT_HEADERS)
            return
        if method == "POST":
            self.posts += 1
            body = await _read_body(receive)
            if body is None:
                await _send(send, 413, _error_body(None, -32600, "Body too large or client gone"))
                return
            try:
                msg = orjson.loads(body)
            except orjson.JSONDecodeError:
                await _send(send, 400, _error_body(None, -32700, "Parse error"))
                return
            if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
                await _send(send, 400, _error_body(None, -32600, "Invalid Request"))
                return
            await self.post(scope, msg, send)
            return
        await self.other(scope, method, send)

    async def other(self, scope, method, send):
        await _send(send, 405, b"", [(b"allow", b"POST")])


class Modern(Base):
    def __init__(self, tools: int, ttl_ms: int, path: str) -> None:
        super().__init__(tools, ttl_ms, path)
        self.discover_json = orjson.dumps(
            {
                "resultType": "complete",
                "supportedVersions": [MODERN_VERSION],
                "capabilities": {"tools": {}},
                "_meta": {
                    "io.modelcontextprotocol/serverInfo": {
                        "name": "bench-backend-modern",
                        "version": "1.0.0",
                    }
                },
                "ttlMs": ttl_ms,
                "cacheScope": "public",
            }
        )
        self.list_json = orjson.dumps(
            {
                "resultType": "complete",
                "tools": self.tools,
                "ttlMs": ttl_ms,
                "cacheScope": "public",
            }
        )

    async def post(self, scope, msg, send):
        method = msg["method"]
        id_ = msg.get("id")
        if id_ is None:
            # This revision defines no client->server notifications over HTTP; accept quietly.
            await _send(send, 202, b"", [])
            return
        params = msg.get("params") or {}
        h = _headers(scope)
        # spec: SHTTP Server Validation (digest §a.3) — cheap presence + equality checks.
        pv = h.get(b"mcp-protocol-version")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if method == "initialize":
            requested = params.get("protocolVersion") if isinstance(params, dict) else None
            await _send(
                send,
                400,
                _error_body(
                    id_,
                    -32022,
                    "Unsupported protocol version",
                    {"supported": [MODERN_VERSION], "requested": requested},
                ),
            )
            return
        if pv is None or h.get(b"mcp-method") is None:
            await _send(send, 400, _error_body(id_, -32020, "Missing required MCP header"))
            return
        if h[b"mcp-method"].strip().decode("latin-1") != method:
            await _send(send, 400, _error_body(id_, -32020, "Mcp-Method does not match body"))
            return
        pv_s = pv.strip().decode("latin-1")
        if not isinstance(meta, dict) or meta.get("io.modelcontextprotocol/protocolVersion") != pv_s:
            await _send(
                send, 400, _error_body(id_, -32020, "MCP-Protocol-Version does not match _meta")
            )
            return
        if pv_s != MODERN_VERSION:
            await _send(
                send,
                400,
                _error_body(
                    id_,
                    -32022,
                    "Unsupported protocol version",
                    {"supported": [MODERN_VERSION], "requested": pv_s},
                ),
            )
            return
        if method == "tools/call":
            name = params.get("name")
            mname = h.get(b"mcp-name")
            if mname is None or mname.strip().decode("latin-1") != name:
                await _send(send, 400, _error_body(id_, -32020, "Mcp-Name does not match body"))
                return
            if name != "echo":
                await _send(send, 200, _error_body(id_, -32602, f"Unknown tool: {name}"))
                return
            args = params.get("arguments") or {}
            text = args.get("text", "") if isinstance(args, dict) else ""
            result = {
                "resultType": "complete",
                "content": [{"type": "text", "text": str(text)}],
                "isError": False,
            }
            await _send(send, 200, orjson.dumps({"jsonrpc": "2.0", "id": id_, "result": result}))
        elif method == "tools/list":
            await _send(send, 200, _result_raw(id_, self.list_json))
        elif method == "server/discover":
            await _send(send, 200, _result_raw(id_, self.discover_json))
        else:
            await _send(send, 404, _error_body(id_, -32601, f"Method not found: {method}"))


class Legacy(Base):
    def __init__(self, tools: int, ttl_ms: int, path: str) -> None:
        super().__init__(tools, ttl_ms, path)
        # session id -> initialized flag; bounded (oldest evicted).
        self.sessions: OrderedDict[bytes, bool] = OrderedDict()
        self.list_json = orjson.dumps({"tools": self.tools})

    def _check_version(self, h) -> bytes | None:
        pv = h.get(b"mcp-protocol-version")
        if pv is not None and pv.strip().decode("latin-1") not in LEGACY_VERSIONS:
            return _error_body(
                None, -32000, f"Bad Request: Unsupported protocol version: {pv.decode('latin-1')}"
            )
        return None

    async def post(self, scope, msg, send):
        method = msg["method"]
        id_ = msg.get("id")
        params = msg.get("params") or {}
        h = _headers(scope)
        sid = h.get(b"mcp-session-id")
        if method == "initialize":
            if sid is not None and sid in self.sessions:
                await _send(
                    send, 400, _error_body(id_, -32600, "Invalid Request: Server already initialized")
                )
                return
            requested = params.get("protocolVersion") if isinstance(params, dict) else None
            version = requested if requested in LEGACY_VERSIONS else LEGACY_LATEST
            new_sid = uuid.uuid4().hex.encode()
            self.sessions[new_sid] = False
            if len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
            result = {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "bench-backend-legacy", "version": "1.0.0"},
            }
            await _send(
                send,
                200,
                orjson.dumps({"jsonrpc": "2.0", "id": id_, "result": result}),
                [(b"content-type", b"application/json"), (b"mcp-session-id", new_sid)],
            )
            return
        if sid is None:
            # Reference SDK servers answer 400 / -32000 for anything before initialize,
            # including modern-only methods such as server/discover.
            await _send(
                send, 400, _error_body(id_, -32000, "Bad Request: No valid session ID provided")
            )
            return
        if sid not in self.sessions:
            await _send(send, 404, _error_body(id_, -32001, "Session not found"))
            return
        bad = self._check_version(h)
        if bad is not None:
            await _send(send, 400, bad)
            return
        if id_ is None:
            if method == "notifications/initialized":
                self.sessions[sid] = True
            await _send(send, 202, b"", [])
            return
        if method == "tools/call":
            name = params.get("name")
            if name != "echo":
                await _send(send, 200, _error_body(id_, -32602, f"Unknown tool: {name}"))
                return
            args = params.get("arguments") or {}
            text = args.get("text", "") if isinstance(args, dict) else ""
            result = {"content": [{"type": "text", "text": str(text)}], "isError": False}
            await _send(send, 200, orjson.dumps({"jsonrpc": "2.0", "id": id_, "result": result}))
        elif method == "tools/list":
            await _send(send, 200, _result_raw(id_, self.list_json))
        elif method == "ping":
            await _send(send, 200, _result_raw(id_, b"{}"))
        else:
            await _send(send, 200, _error_body(id_, -32601, f"Method not found: {method}"))

    async def other(self, scope, method, send):
        if method == "DELETE":
            sid = _headers(scope).get(b"mcp-session-id")
            if sid is not None and self.sessions.pop(sid, None) is not None:
                await _send(send, 200, b"", [])
            else:
                await _send(send, 404, _error_body(None, -32001, "Session not found"))
            return
        await _send(send, 405, b"", [(b"allow", b"POST, DELETE")])


def build_app(mode: str, tools: int = 10, ttl_ms: int = 60_000, path: str = "/mcp"):
    cls = {"modern": Modern, "legacy": Legacy}[mode]
    return cls(tools, ttl_ms, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=("modern", "legacy"), default="modern")
    p.add_argument("--tools", type=int, default=10, help="number of tools in tools/list")
    p.add_argument("--ttl-ms", type=int, default=60_000, help="ttlMs on cacheable results")
    p.add_argument("--path", default="/mcp")
    a = p.parse_args(argv)
    if a.tools < 1:
        p.error("--tools must be >= 1")
    if a.ttl_ms < 0:
        p.error("--ttl-ms must be >= 0")

    import uvicorn

    app = build_app(a.mode, a.tools, a.ttl_ms, a.path)
    kwargs = dict(host=a.host, port=a.port, log_level="warning", access_log=False,
                  lifespan="on", server_header=False, date_header=False)
    try:
        import uvloop  # noqa: F401
        import httptools  # noqa: F401

        kwargs.update(loop="uvloop", http="httptools")
    except ImportError:  # pragma: no cover - still works, just slower
        print("backend: uvloop/httptools missing, using defaults", file=sys.stderr)
    print(f"backend: {a.mode} on http://{a.host}:{a.port}{a.path} pid={os.getpid()}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, **kwargs)


if __name__ == "__main__":
    main()
