"""A modern (2026-07-28) backend that answers per caller, and a real identity provider, for the
cache scope tests (tests/integration/test_cache_scope_security.py). Nothing here imports the
gateway.

The gateway never forwards the client's credentials (spec: no token passthrough), so the
backend tells callers apart by something every caller sends and the cache key leaves out on
purpose: `_meta["io.modelcontextprotocol/clientInfo"].name` (a volatile `_meta` key, digest
§e). That is exactly the shape of the danger: two principals' requests that are "the same"
for the cache key while the backend answered each for its caller.

`resources/read` URIs say how to answer: `who://SCOPE/TTL/NAME`

- SCOPE `private` | `public` | `none` (no cacheScope) | `public-for-CALLER` (public to that
  caller, private to everyone else);
- TTL milliseconds, or `none` (no ttlMs);
- NAME free text; `gated-…` holds the answer until `release(uri)`; `ask-…` answers
  `input_required` unless the request carries `inputResponses` or `requestState`.

A private answer reads `"<uri> for <caller> #<n>"`, a public one `"<uri> for anyone #<n>"`
(public answers hold no user data, as the spec asks of them), n counting that URI's reads.
URIs in `failing` answer a JSON-RPC -32603 (HTTP 500). `tools/list` answers per caller in the
same way at `list_scope`/`list_ttl`; `prompts/list` answers -32601 (HTTP 404) to the callers in
`no_prompts_for` ("*": everyone). Every request is recorded in `requests` as
(method, uri or cursor, caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.support.asgi import read_body
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, JwksEndpoint, ServedApp, rsa_key

CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
VERSION = "2026-07-28"


def as_caller(name: str) -> dict[str, Any]:
    """The `_meta` a test sends so that the backend knows whom it answers."""
    return {CLIENT_INFO: {"name": name, "version": "1"}}


class PerCallerBackend:
    def __init__(self, *, list_scope: str = "private", list_ttl: int = 60_000) -> None:
        self.url = ""  # its /mcp URL, once served
        self.list_scope = list_scope
        self.list_ttl = list_ttl
        self.no_prompts_for: set[str] = set()
        self.failing: set[str] = set()
        self.requests: list[tuple[str, str | None, str]] = []
        self._gates: dict[str, asyncio.Event] = {}
        self._reads: dict[str, int] = {}

    # -- what the test steers and reads ------------------------------------------------------

    def gate(self, uri: str) -> asyncio.Event:
        return self._gates.setdefault(uri, asyncio.Event())

    def release(self, uri: str) -> None:
        self.gate(uri).set()

    def seen(self, method: str, what: str | None = None) -> list[str]:
        """The callers whose `method` (for `what`, when given) reached this backend, in order."""
        return [c for m, w, c in self.requests if m == method and (what is None or w == what)]

    async def arrived(self, method: str, what: str | None, count: int) -> None:
        """Wait until `count` such requests reached the backend (at most 10 s)."""
        deadline = time.monotonic() + 10
        while len(self.seen(method, what)) < count:
            assert time.monotonic() < deadline, f"{count} {method} {what} never arrived: {self.requests}"
            await asyncio.sleep(0.002)

    # -- the MCP endpoint ----------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        msg = orjson.loads(await read_body(receive))
        method, rid = msg.get("method"), msg.get("id")
        params = msg.get("params") or {}
        if rid is None:
            await _reply(send, 202, None)
            return
        info = (params.get("_meta") or {}).get(CLIENT_INFO) or {}
        caller = info.get("name") if isinstance(info.get("name"), str) else "?"
        if method == "server/discover":
            await _result(send, rid, {"supportedVersions": [VERSION],
                                      "capabilities": {"tools": {}, "resources": {}, "prompts": {}},
                                      "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "per-caller",
                                                                                       "version": "1"}},
                                      "ttlMs": 0, "cacheScope": "public"})
            return
        if method == "tools/list":
            self.requests.append((method, params.get("cursor"), caller))
            scope_ = _scope_for(self.list_scope, caller)
            tools = [{"name": f"tool_for_{caller}" if scope_ == "private" else "public_tool",
                      "inputSchema": {"type": "object"}}]
            await _result(send, rid, {"tools": tools, "ttlMs": self.list_ttl, "cacheScope": scope_})
            return
        if method == "prompts/list":
            self.requests.append((method, params.get("cursor"), caller))
            if "*" in self.no_prompts_for or caller in self.no_prompts_for:
                await _reply(send, 404, {"jsonrpc": "2.0", "id": rid,
                                         "error": {"code": -32601, "message": f"no prompts for {caller}"}})
                return
            await _result(send, rid, {"prompts": [{"name": f"prompt_for_{caller}"}], "ttlMs": 60_000,
                                      "cacheScope": "private"})
            return
        if method == "resources/read":
            await self._read(send, rid, params, caller)
            return
        await _reply(send, 404, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})

    async def _read(self, send: Any, rid: Any, params: dict[str, Any], caller: str) -> None:
        uri = params.get("uri")
        self.requests.append(("resources/read", uri, caller))
        parts = uri.removeprefix("who://").split("/", 2) if isinstance(uri, str) else []
        if len(parts) != 3:
            error = {"code": -32602, "message": "Resource not found", "data": {"uri": uri}}
            await _reply(send, 200, {"jsonrpc": "2.0", "id": rid, "error": error})
            return
        scope_spec, ttl, name = parts
        n = self._reads[uri] = self._reads.get(uri, 0) + 1
        if name.startswith("gated"):
            await self.gate(uri).wait()
        if uri in self.failing:
            await _reply(send, 500, {"jsonrpc": "2.0", "id": rid,
                                     "error": {"code": -32603, "message": f"{uri} failed for {caller}"}})
            return
        if name.startswith("ask") and "inputResponses" not in params and "requestState" not in params:
            await _result(send, rid, {"resultType": "input_required", "inputRequests": {
                "ok": {"method": "elicitation/create", "params": {
                    "mode": "form", "message": "Proceed?",
                    "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}},
                "requestState": f"state-{n}"})
            return
        scope_ = _scope_for(scope_spec, caller)
        who = caller if scope_ != "public" else "anyone"
        content = {"uri": uri, "mimeType": "text/plain", "text": f"{uri} for {who} #{n}"}
        result: dict[str, Any] = {"contents": [content]}
        if ttl != "none":
            result["ttlMs"] = int(ttl)
        if scope_ != "none":
            result["cacheScope"] = scope_
        await _result(send, rid, result)


def _scope_for(spec: str, caller: str) -> str:
    if spec.startswith("public-for-"):
        return "public" if caller == spec.removeprefix("public-for-") else "private"
    return spec


async def _result(send: Any, rid: Any, result: dict[str, Any]) -> None:
    await _reply(send, 200, {"jsonrpc": "2.0", "id": rid, "result": {"resultType": "complete", **result}})


async def _reply(send: Any, status: int, payload: Any) -> None:
    body = orjson.dumps(payload) if payload is not None else b""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- a real identity provider: keys, a JWKS over HTTP, tokens ----------------------------------


@dataclass
class IdentityProvider:
    issuer: Issuer
    jwks_url: str
    tokens: dict[str, str] = field(default_factory=dict)

    def auth_settings(self) -> dict[str, Any]:
        """`auth:` settings of a gateway that accepts this provider's tokens."""
        return {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": self.jwks_url,
                "authorization_servers": [ISSUER]}

    def bearer(self, sub: str, **claims: Any) -> dict[str, str]:
        """`Authorization` for `sub`: one token per subject, or, with `claims` (a `jti`, other
        scopes), a token of its own for the same subject."""
        if claims:
            return {"authorization": f"Bearer {self.issuer.token(sub, **claims)}"}
        if sub not in self.tokens:
            self.tokens[sub] = self.issuer.token(sub)
        return {"authorization": f"Bearer {self.tokens[sub]}"}


@contextlib.asynccontextmanager
async def identity_provider() -> AsyncIterator[IdentityProvider]:
    issuer = Issuer(keys=[rsa_key()])
    served = ServedApp(JwksEndpoint(issuer))
    await served.start()
    try:
        yield IdentityProvider(issuer, f"{served.base}/jwks")
    finally:
        await served.stop()
