"""The gateway as an OAuth 2.1 resource server, end to end over real HTTP: real keys, tokens
signed with pyjwt, a JWKS served on 127.0.0.1, the gateway in front of real backends (the
SDK's MCPServer fixture; a raw recorder where the test must see what arrived upstream)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import orjson
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


# -- token transport, over real HTTP ------------------------------------------------------------


async def raw_post(port: int, head_lines: list[str]) -> tuple[int, dict[str, str]]:
    """One tools/list written byte for byte (httpx would merge or refuse what this sends)."""
    body = orjson.dumps(mcp_http.body("tools/list"))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = "".join(f"{line}\r\n" for line in ["POST /mcp HTTP/1.1", "host: 127.0.0.1", *head_lines,
                                                    f"content-length: {len(body)}"])
        writer.write(head.encode("latin-1") + b"\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()
    status_line, *fields = answer.decode("latin-1").split("\r\n")
    return int(status_line.split()[1]), {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}


@pytest.mark.parametrize("http", ["gateway", "uvicorn"])
async def test_only_the_authorization_header_carries_the_token(conformance_backend, jwks, issuer, http):
    """OAuth 2.1 §5.1 / spec §Token Requirements: `Authorization: Bearer` (scheme in any case)
    and nothing else: not the query string (400), not a form body (no credentials: 401), not
    two headers, not an empty Bearer (400)."""
    served, _ = jwks
    settings = {**gateway_settings(conformance_backend.url, f"{served.base}/jwks"), "server": {"http": http}}
    token = issuer.token(scope="mcp:read mcp:tools")
    mcp = [f"{k}: {v}" for k, v in mcp_http.headers("tools/list").items()]
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert (await raw_post(gw.port, [*mcp, f"authorization: {scheme} {token}"]))[0] == 200, scheme
        status, headers = await raw_post(gw.port, [*mcp, f"authorization: Bearer {token}", f"authorization: Bearer {token}"])
        assert status == 400 and 'error="invalid_request"' in headers["www-authenticate"]
        status, headers = await raw_post(gw.port, [*mcp, "authorization: Bearer "])
        assert status == 400 and 'error="invalid_request"' in headers["www-authenticate"]

        in_query = await mcp_http.post(client, f"{gw.url}?access_token={token}", "tools/list")
        assert in_query.status_code == 400 and "query string" in in_query.headers["www-authenticate"]
        in_form = await client.post(gw.url, content=f"access_token={token}", headers={
            **mcp_http.headers("tools/list"), "content-type": "application/x-www-form-urlencoded"})
        assert in_form.status_code == 401
        assert in_form.headers["www-authenticate"] == f'Bearer scope="mcp:read", resource_metadata="{PRM_URL}"'


@pytest.mark.parametrize("http", ["gateway", "uvicorn"])
async def test_an_oversized_token_is_431_and_never_decoded(conformance_backend, jwks, issuer, http):
    """A 100 KB token is past the gateway's 64 KiB header limit: 431, promptly, under both HTTP
    protocols. "Never decoded" is visible from outside: its unknown kid would make the gateway
    fetch the JWKS, and the JWKS server sees no fetch."""
    served, endpoint = jwks
    settings = {**gateway_settings(conformance_backend.url, f"{served.base}/jwks"), "server": {"http": http}}
    token = issuer.token(scope="mcp:read", headers={"kid": "unknown"}, padding="x" * 100_000)
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as client:
        started = time.monotonic()
        response = await mcp_http.post(client, gw.url, "tools/list", extra_headers=bearer(token))
        assert time.monotonic() - started < 2
        assert response.status_code == 431, response.text
        assert "www-authenticate" not in response.headers
        # A large token the gateway does accept (some IdPs put many groups in theirs).
        large = issuer.token(scope="mcp:read", padding="x" * 30_000)
        assert (await mcp_http.post(client, gw.url, "tools/list", extra_headers=bearer(large))).status_code == 200
    assert endpoint.fetches == 1  # for the large token; none for the oversized one


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


@pytest.mark.parametrize("http", ["gateway", "uvicorn"])
async def test_tokens_are_never_logged(conformance_backend, jwks, issuer, caplog, http):
    """With the access log on and every logger at DEBUG, no part of any token the clients sent
    (accepted, refused, in the query string by mistake, in a form body) reaches a log line."""
    served, _ = jwks
    settings = {**gateway_settings(conformance_backend.url, f"{served.base}/jwks"), "server": {"http": http}}
    good = issuer.token(scope="mcp:read mcp:tools")
    tokens = [good, issuer.token(scope="mcp:read", lifetime=-3600), Issuer(keys=[rsa_key("k1")]).token(),
              issuer.token(headers={"kid": "nope"}), issuer.token(scope="")]
    access = _Lines()
    caplog.set_level(logging.DEBUG)
    async with running_gateway(settings, uvicorn_options={"access_log": True, "log_level": "debug"}) as gw:
        logging.getLogger("uvicorn.access").addHandler(access)
        try:
            async with httpx.AsyncClient() as client:
                for token in tokens:
                    await call_tool(client, gw.url, token)
                    await mcp_http.post(client, f"{gw.url}?x=1&access_token={token}", "tools/list")
                    await mcp_http.post(client, f"{gw.url}?access_token={token}", "tools/list", extra_headers=bearer(good))
                    await client.post(gw.url, content=f"access_token={token}", headers={
                        **mcp_http.headers("tools/list"), "content-type": "application/x-www-form-urlencoded"})
        finally:
            logging.getLogger("uvicorn.access").removeHandler(access)
    # The client's own logger (httpx) prints the URLs it was given: only the server's count.
    lines = access.lines + [f"{r.name}: {r.getMessage()}" for r in caplog.records
                            if r.name.startswith(("gateway", "uvicorn"))]
    assert any("access_token=REDACTED" in line for line in access.lines), access.lines  # the log did run
    assert any("auth refused" in line for line in lines)
    for token in tokens:
        payload, signature = token.split(".")[1:]
        leaked = [line for line in lines if payload in line or signature in line]
        assert not leaked, leaked


# -- the JWKS in trouble ---------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["error", "garbage", "huge", "slow"])
async def test_a_jwks_that_fails_before_any_fetch_is_a_prompt_503(conformance_backend, issuer, answer):
    """No key was ever held: the gateway cannot judge the token. 503 naming the JWKS (not 401:
    the client's token may be fine), within about jwks_timeout_seconds, never a 500 or a hang."""
    endpoint = JwksEndpoint(Issuer(keys=list(issuer.keys)), answer=answer)
    async with serve(endpoint) as idp:
        settings = gateway_settings(conformance_backend.url, f"{idp.base}/jwks", jwks_timeout_seconds=0.5)
        async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=5) as client:
            started = time.monotonic()
            response = await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))
            elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert "www-authenticate" not in response.headers and response.headers["retry-after"]
    body = response.json()
    assert "cannot verify the access token" in body["error"]["message"]
    assert body["error"]["data"]["url"] == f"{idp.base}/jwks"
    assert elapsed < 2.5
    assert endpoint.fetches == 1


@pytest.mark.parametrize("answer", ["error", "garbage", "huge", "slow", "down"])
async def test_a_jwks_that_fails_later_keeps_the_cached_keys_working(conformance_backend, issuer, answer):
    """The cached set has gone stale and every refetch fails: tokens signed with a cached key
    are still accepted, promptly; a token signed with a key the IdP published only in the
    answer it cannot deliver (here: in the oversized one) is a 401 naming the kid."""
    endpoint = JwksEndpoint(Issuer(keys=list(issuer.keys)))
    idp = ServedApp(endpoint)
    await idp.start()
    settings = gateway_settings(conformance_backend.url, f"{idp.base}/jwks", jwks_timeout_seconds=0.5,
                                jwks_cache_seconds=0.2, jwks_min_refresh_seconds=0)
    rotated = rsa_key("k2")
    try:
        async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=5) as client:
            assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))).status_code == 200
            endpoint.issuer.keys.append(rotated)
            if answer == "down":
                await idp.stop()
            else:
                endpoint.answer = answer
            await asyncio.sleep(0.25)  # past jwks_cache_seconds: every request now tries a refetch
            started = time.monotonic()
            known = await call_tool(client, gw.url, issuer.token("alice", scope="mcp:read mcp:tools"))
            unknown = await call_tool(client, gw.url, issuer.token("bob", scope="mcp:read mcp:tools", key=rotated))
            elapsed = time.monotonic() - started
    finally:
        await idp.stop()
    assert known.status_code == 200, known.text
    assert unknown.status_code == 401, unknown.text
    assert "no key with kid 'k2'" in unknown.headers["www-authenticate"]
    assert elapsed < 3
    assert endpoint.fetches == (1 if answer == "down" else 3)


async def test_a_burst_at_a_cold_start_waits_for_the_one_fetch(conformance_backend, issuer):
    """Twenty clients at once against a fresh gateway whose IdP takes 300 ms to answer: all are
    served (none gets 503 because the first one's fetch is still in flight), from one fetch."""
    endpoint = JwksEndpoint(Issuer(keys=list(issuer.keys)), delay_seconds=0.3)
    async with serve(endpoint) as idp:
        settings = gateway_settings(conformance_backend.url, f"{idp.base}/jwks")
        async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=5) as client:
            first = asyncio.create_task(call_tool(client, gw.url, issuer.token("u0", scope="mcp:read mcp:tools")))
            while endpoint.fetches == 0:
                await asyncio.sleep(0.01)
            rest = [call_tool(client, gw.url, issuer.token(f"u{i}", scope="mcp:read mcp:tools")) for i in range(1, 20)]
            responses = await asyncio.gather(first, *rest)
    assert [r.status_code for r in responses] == [200] * 20
    assert endpoint.fetches == 1


async def test_a_concurrent_flood_of_unknown_kids_costs_the_idp_one_fetch(settings, jwks, issuer):
    _, endpoint = jwks
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as client:
        for wave in ("cold", "warm"):
            responses = await asyncio.gather(*(
                call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools", headers={"kid": f"{wave}-{i}"}))
                for i in range(50)))
            assert {r.status_code for r in responses} == {401}, wave
    assert endpoint.fetches == 1  # both waves fall within jwks_min_refresh_seconds of the one fetch


def _auth_failures(text: str) -> dict[str, float]:
    """mcp_gateway_auth_failures_total by reason, from an exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('mcp_gateway_auth_failures_total{reason="'):
            reason = line.split('"')[1]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


async def test_auth_failures_are_counted_by_reason_never_by_what_the_client_sent(settings, issuer):
    async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        before = _auth_failures((await client.get(f"{gw.base}/metrics")).text)
        assert {"missing_token", "invalid_token", "expired_token", "insufficient_scope"} <= before.keys()
        assert (await call_tool(client, gw.url, None)).status_code == 401
        assert (await call_tool(client, gw.url, "not.a.jwt")).status_code == 401
        assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools", lifetime=-120))
                ).status_code == 401
        assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read"))).status_code == 403
        assert (await call_tool(client, gw.url, issuer.token(scope="mcp:read mcp:tools"))).status_code == 200
        after = _auth_failures((await client.get(f"{gw.base}/metrics")).text)
    moved = {reason: after[reason] - before.get(reason, 0) for reason in after}
    assert {reason: n for reason, n in moved.items() if n} == {
        "missing_token": 1, "invalid_token": 1, "expired_token": 1, "insufficient_scope": 1}
