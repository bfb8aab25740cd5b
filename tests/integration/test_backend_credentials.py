"""Who the gateway is toward its backends, end to end over real HTTP: a real OAuth token
endpoint on 127.0.0.1 (tests/support/oauth.py `AuthorizationServer`: client credentials and
RFC 8693 token exchange, counting its requests), the gateway in front, and a backend that
records every header it receives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.oauth import (AUDIENCE, ISSUER, AuthorizationServer, Issuer, JwksEndpoint, RecordingBackend,
                                 ServedApp, rsa_key)

CLIENT_ID, CLIENT_SECRET = "gateway", "cc-secret-7f3a9c"
ACTOR_ID, ACTOR_SECRET = "gateway-actor", "actor-secret-51b2"
BACKEND_AUDIENCE = "https://backend.test"


class GuardedBackend(RecordingBackend):
    """The recorder, answering 401 to the bearer tokens in `revoked` (as a backend does to a
    token revoked or expired early)."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked: set[str] = set()
        self.reject_all = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode()
        if self.reject_all or authorization.removeprefix("Bearer ") in self.revoked:
            from tests.support.asgi import read_body

            self.requests.append((list(scope["headers"]), await read_body(receive)))
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer error="invalid_token"')]})
            await send({"type": "http.response.body", "body": b""})
            return
        await super().__call__(scope, receive, send)

    def bearer_tokens(self, method: str = "tools/call") -> list[str]:
        return [dict(h).get(b"authorization", b"").decode().removeprefix("Bearer ")
                for h, _ in self.calls(method)]

    def all_header_bytes(self) -> bytes:
        return b"\n".join(b"%s: %s" % pair for headers, _ in self.requests for pair in headers)


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer(keys=[rsa_key("front")])


@pytest.fixture
async def served() -> AsyncIterator[Any]:
    """Start ASGI apps on loopback for this test; all stopped at its end."""
    apps: list[ServedApp] = []

    async def serve(app: Any) -> ServedApp:
        s = ServedApp(app)
        await s.start()
        apps.append(s)
        return s

    try:
        yield serve
    finally:
        for s in apps:
            await s.stop()


def backend_entry(url: str, auth: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    entry = {"name": "alpha", "url": url, "era": "modern", **extra}
    if auth is not None:
        entry["auth"] = auth
    return entry


def client_credentials(token_url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "oauth_client_credentials", "token_url": token_url, "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET, "audience": BACKEND_AUDIENCE, "scope": "tools", **extra}


async def call(client: httpx.AsyncClient, url: str, token: str | None = None, id: int = 1) -> httpx.Response:
    return await mcp_http.post(client, url, "tools/call", {"name": "echo", "arguments": {}}, id=id,
                               extra_headers={"authorization": f"Bearer {token}"} if token else None)


# -- static headers -------------------------------------------------------------------------


async def test_static_headers_arrive_and_the_clients_token_never_does(served):
    backend = GuardedBackend()
    b = await served(backend)
    settings = {"backends": [backend_entry(f"{b.base}/mcp", {"type": "headers", "headers": {"X-Api-Key": "k-123"}},
                                           headers={"x-tenant": "acme"})]}
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        response = await call(client, gw.url, "client-token-must-not-pass")
    assert response.status_code == 200, response.text
    headers = dict(backend.calls("tools/call")[0][0])
    assert headers[b"x-api-key"] == b"k-123" and headers[b"x-tenant"] == b"acme"
    assert b"authorization" not in headers
    assert b"client-token-must-not-pass" not in backend.all_header_bytes()


# -- client credentials ---------------------------------------------------------------------


async def test_one_token_request_serves_a_hundred_calls_and_the_clients_token_never_arrives(served, issuer):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET})
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    jwks = await served(JwksEndpoint(issuer))
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"{a.base}/token"))],
                "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": f"{jwks.base}/jwks",
                         "authorization_servers": [ISSUER]}}
    client_token = issuer.token("alice")
    async with running_gateway(settings) as gw, httpx.AsyncClient() as client:
        answers = [await call(client, gw.url, client_token, id=i) for i in range(100)]
    assert [r.status_code for r in answers] == [200] * 100
    assert len(authz.requests) == 1  # discovery and 100 calls: one token
    form = authz.grants("client_credentials")[0]
    assert form["audience"] == BACKEND_AUDIENCE and form["scope"] == "tools"
    tokens = set(backend.bearer_tokens())
    assert len(tokens) == 1
    assert authz.decode(tokens.pop())["sub"] == CLIENT_ID
    assert client_token.encode() not in backend.all_header_bytes()


async def test_concurrent_first_calls_share_one_token_fetch(served):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET})
    authz.delay_seconds = 0.3
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"{a.base}/token"))]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        answers = await asyncio.gather(*(call(client, gw.url, id=i) for i in range(20)))
    assert [r.status_code for r in answers] == [200] * 20
    assert len(authz.requests) == 1


async def test_a_token_is_refreshed_in_the_background_before_it_expires(served):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET}, expires_in=10)
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    # Refresh once 8 of the 10 seconds remain... but never before half the lifetime: at 5 s.
    # The token stays usable until 9 s: seconds of slack for a loaded machine either side.
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"{a.base}/token",
                                                                              refresh_before_seconds=8))]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        assert (await call(client, gw.url)).status_code == 200
        assert (await call(client, gw.url)).status_code == 200
        assert len(authz.requests) == 1
        await asyncio.sleep(5.3)
        # Served at once by the old token, which is still good; the refresh runs beside it.
        assert (await call(client, gw.url)).status_code == 200
        for _ in range(100):
            if len(authz.requests) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(authz.requests) == 2
        assert (await call(client, gw.url)).status_code == 200
    tokens = backend.bearer_tokens()
    assert tokens[0] == tokens[1] == tokens[2] != tokens[3]


async def test_a_401_from_the_backend_gets_one_fresh_token_and_one_retry(served):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET})
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"{a.base}/token"))]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        assert (await call(client, gw.url)).status_code == 200
        first = backend.bearer_tokens()[0]
        backend.revoked.add(first)
        response = await call(client, gw.url)
        assert response.status_code == 200, response.text
        assert len(authz.requests) == 2
        assert backend.bearer_tokens()[1:] == [first, backend.bearer_tokens()[2]] and backend.bearer_tokens()[2] != first

        # A backend that refuses every token: one refresh, then its refusal stands (no loop).
        backend.reject_all = True
        before = len(authz.requests)
        response = await call(client, gw.url)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["data"]["backend"] == "alpha" and error["data"]["status"] == 401
        assert len(authz.requests) == before + 1


async def test_a_refused_client_is_a_clear_502_naming_the_backend(served):
    authz = AuthorizationServer({CLIENT_ID: "another-secret"})
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"{a.base}/token"))]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        response = await call(client, gw.url)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == -31001 and error["data"]["backend"] == "alpha"
    assert error["data"]["error"] == "invalid_client"
    assert "refused the gateway's client credentials: invalid_client" in error["message"]
    assert CLIENT_SECRET not in response.text
    assert backend.requests == []  # nothing went upstream without a token


async def test_an_authorization_server_that_is_down_is_a_clear_502(served):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]  # closed again below: nobody listens there
    backend = GuardedBackend()
    b = await served(backend)
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"http://127.0.0.1:{dead}/token"))]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        response = await call(client, gw.url)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == -31001 and error["data"] == {"backend": "alpha", "dependency": "token_url"}
    assert f"cannot reach http://127.0.0.1:{dead}/token" in error["message"]


# -- token exchange -------------------------------------------------------------------------


def exchange_settings(backend_url: str, token_url: str, jwks_url: str, **auth: Any) -> dict[str, Any]:
    return {"backends": [backend_entry(backend_url, {
                "type": "token_exchange", "token_url": token_url, "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET, "audience": BACKEND_AUDIENCE, "resource": BACKEND_AUDIENCE,
                "scope": "tools", **auth})],
            "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks_url,
                     "authorization_servers": [ISSUER]}}


async def test_token_exchange_gives_each_principal_its_own_token_reused_until_expiry(served, issuer):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET, ACTOR_ID: ACTOR_SECRET}, subject_issuer=issuer)
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    jwks = await served(JwksEndpoint(issuer))
    settings = exchange_settings(f"{b.base}/mcp", f"{a.base}/token", f"{jwks.base}/jwks",
                                 actor={"client_id": ACTOR_ID, "client_secret": ACTOR_SECRET})
    alice, bob = issuer.token("alice"), issuer.token("bob")
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        for i in range(5):
            for token in (alice, bob):
                assert (await call(client, gw.url, token, id=i)).status_code == 200
    exchanges = authz.grants("urn:ietf:params:oauth:grant-type:token-exchange")
    assert len(exchanges) == 2  # one per principal, for ten calls
    assert {e["subject_token"] for e in exchanges} == {alice, bob}
    form = exchanges[0]
    assert form["audience"] == form["resource"] == BACKEND_AUDIENCE and form["scope"] == "tools"
    assert form["subject_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    assert form["actor_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    assert len(authz.grants("client_credentials")) == 1  # the actor token, shared by both exchanges
    claims = [authz.decode(t) for t in backend.bearer_tokens()]
    assert [c["sub"] for c in claims] == ["alice", "bob"] * 5
    assert {c["act"]["sub"] for c in claims} == {ACTOR_ID}
    assert len(set(backend.bearer_tokens())) == 2
    # The client's own tokens never reached the backend.
    assert alice.encode() not in backend.all_header_bytes() and bob.encode() not in backend.all_header_bytes()


async def test_an_exchanged_token_never_outlives_the_subject_token(served, issuer):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET}, subject_issuer=issuer, expires_in=3600)
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    jwks = await served(JwksEndpoint(issuer))
    settings = exchange_settings(f"{b.base}/mcp", f"{a.base}/token", f"{jwks.base}/jwks")
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        short = issuer.token("carol", lifetime=3)
        assert (await call(client, gw.url, short)).status_code == 200
        await asyncio.sleep(3.2)
        fresh = issuer.token("carol")  # the same principal, a new token: the old exchange is spent
        assert (await call(client, gw.url, fresh)).status_code == 200
    exchanges = authz.grants("urn:ietf:params:oauth:grant-type:token-exchange")
    assert [e["subject_token"] for e in exchanges] == [short, fresh]


@pytest.mark.parametrize("refusal, status", [("invalid_grant", 403), ("invalid_target", 403),
                                             ("invalid_token", 401)])
async def test_a_refused_exchange_is_the_callers_403_or_401_with_the_servers_reason(served, issuer, refusal, status):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET}, subject_issuer=issuer)
    authz.refuse = refusal
    a = await served(authz)
    backend = GuardedBackend()
    b = await served(backend)
    jwks = await served(JwksEndpoint(issuer))
    settings = exchange_settings(f"{b.base}/mcp", f"{a.base}/token", f"{jwks.base}/jwks")
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        response = await call(client, gw.url, issuer.token("mallory"))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["data"] == {"backend": "alpha", "error": refusal,
                             "error_description": "policy forbids this exchange"}
    assert f"refused the token exchange: {refusal}: policy forbids this exchange" in error["message"]
    assert backend.calls("tools/call") == []


def test_token_exchange_without_jwt_authentication_is_refused_by_the_settings():
    from gateway.settings import ConfigError, load_settings

    with pytest.raises(ConfigError) as exc:
        load_settings(None, backends=[backend_entry("http://127.0.0.1:1/mcp", {
            "type": "token_exchange", "token_url": "http://127.0.0.1:1/token"})])
    assert exc.value.problems == [("backends.0.auth.type", "token_exchange exchanges the caller's validated access "
                                                           "token: it needs auth.mode: jwt")]


def test_the_backend_sees_the_tokens_it_was_issued_not_forged_ones(issuer):
    # Sanity of the harness: the AS's tokens are real signatures the backend could verify.
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET})
    forged = jwt.encode({"sub": "eve"}, rsa_key().private, algorithm="RS256")
    with pytest.raises(jwt.InvalidSignatureError):
        authz.decode(forged)


# -- chosen client headers and the identity header --------------------------------------------


async def test_forward_headers_pass_the_allowlisted_headers_only_and_identity_is_signed(served, issuer):
    from gateway.backends.identity import verify

    backend = GuardedBackend()
    b = await served(backend)
    jwks = await served(JwksEndpoint(issuer))
    secret = "identity-hmac-secret-0123456789abcdef"
    settings = {"backends": [backend_entry(f"{b.base}/mcp", None, identity_header="x-mcp-user",
                                           forward_headers=[{"from": "x-tenant-id", "to": "x-tenant"},
                                                            {"from": "x-request-region"}])],
                "security": {"secret": secret},
                "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": f"{jwks.base}/jwks",
                         "authorization_servers": [ISSUER]}}
    token = issuer.token("dana")
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        response = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {}},
                                       extra_headers={"authorization": f"Bearer {token}", "x-tenant-id": "acme",
                                                      "x-request-region": "eu", "x-other": "not-listed",
                                                      "cookie": "session=abc"})
    assert response.status_code == 200, response.text
    headers = {k.decode(): v.decode() for k, v in backend.calls("tools/call")[0][0]}
    assert headers["x-tenant"] == "acme" and headers["x-request-region"] == "eu"
    assert "x-tenant-id" not in headers and "x-other" not in headers
    assert "cookie" not in headers and "authorization" not in headers
    claims = verify(secret.encode(), headers["x-mcp-user"], max_age=60)
    assert claims is not None and claims["sub"] == "dana" and claims["iss"] == ISSUER and claims["authenticated"]
    assert verify(b"another-secret", headers["x-mcp-user"], max_age=60) is None
    forged = headers["x-mcp-user"].rsplit(".", 1)[0].replace("v1.", "v1.x") + "." + headers["x-mcp-user"].rsplit(".", 1)[1]
    assert verify(secret.encode(), forged, max_age=60) is None


@pytest.mark.parametrize("name", ["authorization", "Cookie", "connection", "transfer-encoding", "mcp-session-id",
                                  "mcp-param-region", "traceparent", "host"])
def test_check_config_refuses_credentials_hop_by_hop_and_gateway_headers_in_forward_headers(tmp_path, name):
    import subprocess
    import sys

    import yaml

    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "alpha", "url": "http://127.0.0.1:1/mcp",
                                                    "forward_headers": [{"from": name, "to": "x-ok"}]}]}))
    result = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "backends.0.forward_headers.0.from" in result.stdout + result.stderr
    assert f"{name.lower()!r} can never be forwarded" in result.stdout + result.stderr


def test_identity_header_needs_security_secret():
    from gateway.settings import ConfigError, load_settings

    with pytest.raises(ConfigError) as exc:
        load_settings(None, backends=[backend_entry("http://127.0.0.1:1/mcp", None, identity_header="x-mcp-user")])
    assert exc.value.problems == [("backends.0.identity_header",
                                   "is signed with security.secret, which is not set")]


# -- initialize-era backends ------------------------------------------------------------------


class LegacyRecorder:
    """A minimal initialize-era (2025-06-18) Streamable HTTP backend: sessions minted on
    initialize, an `echo` tool, no GET stream (405). It records, per session id, the
    Authorization values it saw."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[str]] = {}
        self.initializes: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        import uuid

        import orjson

        from tests.support.asgi import read_body

        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization", b"").decode()
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        msg = orjson.loads(await read_body(receive))
        extra: list[tuple[bytes, bytes]] = []
        if msg.get("method") == "initialize":
            sid = uuid.uuid4().hex
            self.sessions[sid] = [authorization]
            self.initializes.append(authorization)
            extra.append((b"mcp-session-id", sid.encode()))
            result: Any = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                           "serverInfo": {"name": "legacy-recorder", "version": "1"}}
        else:
            sid = headers.get(b"mcp-session-id", b"").decode()
            if sid not in self.sessions:
                await send({"type": "http.response.start", "status": 404, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            self.sessions[sid].append(authorization)
            if "id" not in msg:
                await send({"type": "http.response.start", "status": 202, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            if msg["method"] == "tools/list":
                result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
            else:
                result = {"content": [{"type": "text", "text": "echoed"}]}
        body = orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), *extra]})
        await send({"type": "http.response.body", "body": body})


async def test_a_legacy_backend_gets_the_client_credentials_token_on_its_session(served):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET})
    a = await served(authz)
    legacy = LegacyRecorder()
    b = await served(legacy)
    settings = {"backends": [backend_entry(f"{b.base}/mcp", client_credentials(f"{a.base}/token"), era="legacy")]}
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        for i in range(5):
            response = await call(client, gw.url, "client-token-never-upstream", id=i)
            assert response.status_code == 200, response.text
    assert len(authz.requests) == 1
    seen = {value for values in legacy.sessions.values() for value in values}
    assert len(seen) == 1 and authz.decode(seen.pop().removeprefix("Bearer "))["sub"] == CLIENT_ID


async def test_two_principals_exchanged_tokens_never_share_a_legacy_session(served, issuer):
    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET}, subject_issuer=issuer)
    a = await served(authz)
    legacy = LegacyRecorder()
    b = await served(legacy)
    jwks = await served(JwksEndpoint(issuer))
    settings = exchange_settings(f"{b.base}/mcp", f"{a.base}/token", f"{jwks.base}/jwks")
    settings["backends"][0]["era"] = "legacy"
    alice, bob = issuer.token("alice"), issuer.token("bob")
    async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
        for i in range(3):
            for token in (alice, bob):
                response = await call(client, gw.url, token, id=i)
                assert response.status_code == 200, response.text
    # One session per principal, each carrying only its principal's exchanged token; the
    # gateway's own session (its discovery: no user, no actor configured) carries none.
    own = [values for values in legacy.sessions.values() if not any(values)]
    assert len(own) <= 1
    subjects_per_session = [{authz.decode(v.removeprefix("Bearer "))["sub"] for v in values}
                            for values in legacy.sessions.values() if any(values)]
    assert sorted(map(sorted, subjects_per_session)) == [["alice"], ["bob"]]
    assert len(authz.grants("urn:ietf:params:oauth:grant-type:token-exchange")) == 2
