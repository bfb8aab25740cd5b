"""The gateway as an OAuth 2.1 resource server, end to end over real HTTP: real keys, tokens
signed with pyjwt, a JWKS served on 127.0.0.1, the gateway in front of real backends (the
SDK's MCPServer fixture; a raw recorder where the test must see what arrived upstream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.oauth import (
    AUDIENCE,
    ISSUER,
    Issuer,
    JwksEndpoint,
    RecordingBackend,
    ServedApp,
    rsa_key,
    serve,
    unsigned_token,
)

PRM_URL = "https://mcp.test/.well-known/oauth-protected-resource/mcp"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer(keys=[rsa_key("k1")])


@pytest.fixture
async def jwks(issuer) -> AsyncIterator[tuple[ServedApp, JwksEndpoint]]:
    # A copy per test: rotation tests add keys without touching the module's issuer.
    endpoint = JwksEndpoint(Issuer(keys=list(issuer.keys)))
    served = ServedApp(endpoint)
    await served.start()
    try:
        yield served, endpoint
    finally:
        await served.stop()


def gateway_settings(backend_url: str, jwks_url: str, **auth: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "alpha", "url": backend_url, "era": "modern"}],
        "auth": {
            "mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks_url,
            "authorization_servers": [ISSUER], "required_scopes": ["mcp:read"],
            "method_scopes": {"tools/call": ["mcp:tools"]}, **auth,
        },
    }


@pytest.fixture
def settings(conformance_backend, jwks) -> dict[str, Any]:
    served, _ = jwks
    return gateway_settings(conformance_backend.url, f"{served.base}/jwks")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def call_tool(client: httpx.AsyncClient, url: str, token: str | None, tool: str = "test_simple_text"
                    ) -> httpx.Response:
    return await mcp_http.post(client, url, "tools/call", {"name": tool, "arguments": {}},
                               extra_headers=bearer(token) if token else None)


async def test_no_token_is_401_pointing_at_metadata_that_is_served_openly(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        response = await mcp_http.post(client, gw.url, "tools/list")
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == f'Bearer scope="mcp:read", resource_metadata="{PRM_URL}"'
        body = response.json()
        assert "id" not in body and body["error"]["message"].startswith("Unauthorized")

        # The metadata, at the path-inserted and the root well-known URIs, without a token.
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
            prm = await client.get(gw.base + path)
            assert prm.status_code == 200, path
            assert prm.json() == {"resource": AUDIENCE, "authorization_servers": [ISSUER],
                                  "bearer_methods_supported": ["header"], "scopes_supported": ["mcp:read"]}
        # Probes carry no token.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(gw.base + path)).status_code == 200, path


@pytest.mark.parametrize("case", ["expired", "wrong_audience", "wrong_issuer", "alg_none", "unknown_key"])
async def test_bad_tokens_are_401(settings, issuer, case):
    token = {
        "expired": lambda: issuer.token(scope="mcp:read mcp:tools", lifetime=-3600),
        "wrong_audience": lambda: issuer.token(scope="mcp:read mcp:tools", aud="https://other.test/mcp"),
        "wrong_issuer": lambda: issuer.token(scope="mcp:read mcp:tools", iss="https://evil.test"),
        "alg_none": lambda: unsigned_token({"iss": ISSUER, "aud": AUDIENCE, "sub": "eve", "scope": "mcp:read mcp:tools",
                                            "exp": 2**31}, "k1"),
        "unknown_key": lambda: Issuer(keys=[rsa_key("k1")]).token(scope="mcp:read mcp:tools"),
    }[case]()
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        response = await call_tool(client, gw.url, token)
    assert response.status_code == 401, response.text
    header = response.headers["www-authenticate"]
    assert header.startswith('Bearer error="invalid_token", scope="mcp:read mcp:tools", ')
    assert f'resource_metadata="{PRM_URL}"' in header


async def test_insufficient_scope_is_403_with_the_full_challenge(settings, issuer):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        response = await call_tool(client, gw.url, issuer.token(scope="mcp:read"))
        assert response.status_code == 403
        assert response.headers["www-authenticate"] == (
            f'Bearer error="insufficient_scope", scope="mcp:read mcp:tools", resource_metadata="{PRM_URL}", '
            f'error_description="the token lacks scope mcp:tools"')
        # The same token lists tools: only tools/call needs mcp:tools.
        listed = await mcp_http.post(client, gw.url, "tools/list", extra_headers=bearer(issuer.token(scope="mcp:read")))
        assert listed.status_code == 200
        assert "test_simple_text" in [t["name"] for t in listed.json()["result"]["tools"]]


async def test_good_token_reaches_the_backend(settings, issuer):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        response = await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["content"][0]["text"] and not result.get("isError")


async def test_sdk_client_with_a_bearer_token(settings, issuer):
    token = issuer.token(scope="mcp:read mcp:tools")
    async with (
        running_gateway(settings) as gw,
        httpx2.AsyncClient(headers=bearer(token)) as http,
        Client(streamable_http_client(gw.url, http_client=http), mode="2026-07-28") as client,
    ):
        result = await client.call_tool("test_simple_text", {})
        assert result.content[0].text and not result.is_error


async def test_the_clients_token_is_not_forwarded_to_the_backend(jwks, issuer):
    served, _ = jwks
    recorder = RecordingBackend()
    token = issuer.token("alice", scope="mcp:read mcp:tools")
    async with serve(recorder) as backend:
        settings = gateway_settings(f"{backend.base}/mcp", f"{served.base}/jwks")
        async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
            response = await call_tool(client, gw.url, token, tool="echo")
            assert response.status_code == 200, response.text
    calls = recorder.calls("tools/call")
    assert len(calls) == 1  # the call did arrive, and its headers were recorded
    assert (b"mcp-method", b"tools/call") in calls[0][0]
    for headers, body in recorder.requests:
        assert b"authorization" not in [name.lower() for name, _ in headers]
        assert not any(token.encode() in value for _, value in headers)
        assert token.encode() not in body


async def test_rotated_key_is_accepted_after_a_refresh(conformance_backend, jwks, issuer):
    served, endpoint = jwks
    settings = gateway_settings(conformance_backend.url, f"{served.base}/jwks", jwks_min_refresh_seconds=0)
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))).status_code == 200
        rotated = rsa_key("k2")
        endpoint.issuer.keys.append(rotated)  # the IdP publishes a new key and signs with it
        token = issuer.token(scope="mcp:read mcp:tools", key=rotated)
        assert (await call_tool(client, gw.url, token)).status_code == 200
        assert endpoint.fetches == 2
        # The old key still verifies, from the cache.
        assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))).status_code == 200
    assert endpoint.fetches == 2


async def test_cached_keys_serve_while_the_jwks_server_is_down(settings, jwks, issuer):
    served, endpoint = jwks
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        assert (await call_tool(client, gw.url, issuer.token("alice", scope="mcp:read mcp:tools"))).status_code == 200
        await served.stop()
        response = await call_tool(client, gw.url, issuer.token("bob", scope="mcp:read mcp:tools"))
        assert response.status_code == 200, response.text
    assert endpoint.fetches == 1


async def test_a_flood_of_unknown_kids_does_not_hammer_the_idp(settings, jwks, issuer):
    _, endpoint = jwks
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))).status_code == 200
        for i in range(20):
            token = issuer.token(scope="mcp:read mcp:tools", headers={"kid": f"random-{i}"})
            response = await call_tool(client, gw.url, token)
            assert response.status_code == 401
            assert f"random-{i}" in response.headers["www-authenticate"]
    assert endpoint.fetches == 1  # within jwks_min_refresh_seconds of the first fetch


async def test_jwks_unreachable_before_any_fetch_is_503_not_401(conformance_backend, issuer):
    idp = ServedApp(JwksEndpoint(issuer))
    await idp.start()
    url = f"{idp.base}/jwks"
    await idp.stop()
    async with running_gateway(gateway_settings(conformance_backend.url, url)) as gw, httpx.AsyncClient() as client:
        response = await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))
    assert response.status_code == 503
    assert "www-authenticate" not in response.headers
    assert "cannot verify the access token" in response.json()["error"]["message"]


async def test_two_principals_do_not_share_private_cache_entries(jwks, issuer):
    """The principal from the token keys private cache entries: alice's second list is a hit,
    bob's first is not served from alice's entry."""
    served, _ = jwks
    recorder = RecordingBackend(list_cache={"ttlMs": 60_000, "cacheScope": "private"})
    async with serve(recorder) as backend:
        settings = gateway_settings(f"{backend.base}/mcp", f"{served.base}/jwks")
        async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
            for sub in ("alice", "alice", "bob"):
                response = await mcp_http.post(client, gw.url, "tools/list",
                                               extra_headers=bearer(issuer.token(sub, scope="mcp:read")))
                assert response.status_code == 200, response.text
    assert len(recorder.calls("tools/list")) == 2


async def test_method_scopes_cannot_be_dodged_on_the_http_sse_transport(settings, issuer):
    """`Mcp-Method` may choose the method scopes only where the body phase proves it (POST to
    the MCP endpoint, SHTTP §Server Validation). The HTTP+SSE transport (/sse) never looks at
    it, so declaring a cheap method there must not lower the scopes: a token without
    mcp:tools must not get a tools/call through."""
    narrow = {**bearer(issuer.token(scope="mcp:read")), "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as client:
        async with client.stream("GET", gw.base + "/sse", headers={"accept": "text/event-stream", **narrow}) as stream:
            refused = stream.status_code
            if refused == 200:  # the bypass: show what the narrow token can then do
                events = stream.aiter_lines()
                endpoint = next(line[5:].strip() for line in [await anext(events), await anext(events)]
                                if line.startswith("data:"))
                for message in (
                    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                        "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "test_simple_text", "arguments": {}}},
                ):
                    posted = await client.post(gw.base + endpoint, json=message, headers=narrow)
                    assert posted.status_code == 202
                called = ""
                async for line in events:
                    if line.startswith("data:") and '"id":1' in line:
                        called = line
                        break
                pytest.fail(f"a token without mcp:tools called a tool over /sse: {called}")
        assert refused == 403
        posted = await client.post(gw.base + "/sse/messages?session_id=x", json={}, headers=narrow)
        assert posted.status_code == 403
        assert 'scope="mcp:read mcp:tools"' in posted.headers["www-authenticate"]
        # The same headers on the MCP endpoint itself still choose the method's scopes.
        listed = await mcp_http.post(client, gw.url, "tools/list", extra_headers=bearer(issuer.token(scope="mcp:read")))
        assert listed.status_code == 200
