"""What the governance end-to-end tests share (authorization, rate limits, curation, views):
a JWKS endpoint on loopback serving an issuer's RS256 keys, run in a thread of its own so that
one server outlives every test of a module (each test has its own event loop), the gateway's
`auth` block that trusts it, and the two scripted backends' names. The module-scoped fixtures
built from these are in tests/integration/conftest.py."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import httpx
import uvicorn

from tests.support import mcp_http
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, JwksEndpoint

# The two scripted backends (tests/support/scripted.py) every governance test puts behind the gateway.
BACKENDS = ("ledger", "reports")
# The rules the authorization and view tests hold the gateway to: finance may use ledger's
# tools (not its `fail`), everyone reports__echo, holders of reports.write every reports tool.
RULES = {
    "default": "deny",
    "rules": [
        {"id": "no-failing", "effect": "deny", "names": ["*__fail"]},
        {"id": "finance-ledger", "effect": "allow", "methods": ["tools/call", "tools/list"], "backends": ["ledger"],
         "names": ["ledger__*"], "when": {"claims": {"groups": "finance"}}},
        {"id": "reports-echo", "effect": "allow", "names": ["reports__echo"]},
        {"id": "reports-writers", "effect": "allow", "methods": ["tools/call"], "names": ["reports__*"],
         "when": {"scopes": ["reports.write"]}},
    ],
}


class JwksServer:
    """`JwksEndpoint(issuer)` on 127.0.0.1, in a thread with its own loop; `url` is the key set's."""

    def __init__(self, issuer: Issuer) -> None:
        self.endpoint = JwksEndpoint(issuer)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/jwks"
        self._server = uvicorn.Server(uvicorn.Config(self.endpoint, lifespan="off", log_level="warning"))
        self._thread = threading.Thread(target=self._run, name="jwks-server", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def __enter__(self) -> JwksServer:
        self._thread.start()
        for _ in range(1000):
            if self._server.started:
                return self
            if not self._thread.is_alive():
                raise RuntimeError("the JWKS server did not start")
            threading.Event().wait(0.01)
        raise RuntimeError("the JWKS server did not start within 10 s")

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def governed(ledger: Any, reports: Any, jwks_url: str, **extra: Any) -> dict[str, Any]:
    """Gateway settings: the two scripted backends, tokens from the test issuer, `RULES`."""
    return {
        "backends": [{"name": "ledger", "url": ledger.url, "era": "modern"},
                     {"name": "reports", "url": reports.url, "era": "modern"}],
        "auth": jwt_auth(jwks_url),
        "authorization": RULES,
        **extra,
    }


def jwt_auth(jwks_url: str, *, claims: tuple[str, ...] = ("groups",)) -> dict[str, Any]:
    """The gateway's `auth` section trusting the test issuer's tokens, keeping `claims`."""
    auth: dict[str, Any] = {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks_url,
                            "authorization_servers": [ISSUER]}
    if claims:
        auth["claims"] = list(claims)
    return auth


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def all_tools(http: httpx.AsyncClient, url: str, token: str | None = None
                    ) -> tuple[list[str], list[httpx.Response]]:
    """Every page of tools/list over raw HTTP (the scripted backends page by two, so the gateway
    cursor is used): the sorted names, and every response."""
    names: list[str] = []
    responses = []
    cursor = None
    for _ in range(50):
        response = await mcp_http.post(http, url, "tools/list", {"cursor": cursor} if cursor else None,
                                       extra_headers=bearer(token) if token is not None else None)
        assert response.status_code == 200, response.text
        responses.append(response)
        result = response.json()["result"]
        names += [t["name"] for t in result["tools"]]
        cursor = result.get("nextCursor")
        if cursor is None:
            return sorted(names), responses
    raise AssertionError("the list did not end")


async def sdk_tool_names(client: Any) -> list[str]:
    """Every page of `client.list_tools()` (an `mcp.Client`, modern or legacy): the sorted names."""
    names: list[str] = []
    cursor = None
    for _ in range(50):
        page = await client.list_tools(cursor=cursor)
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if cursor is None:
            return sorted(names)
    raise AssertionError("the list did not end")


async def call_tool(http: httpx.AsyncClient, url: str, token: str, tool: str, **arguments: Any) -> httpx.Response:
    return await mcp_http.post(http, url, "tools/call", {"name": tool, "arguments": arguments},
                               extra_headers=bearer(token))
