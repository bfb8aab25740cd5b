"""The JwtAuth policy driven in process with real keys and real signed tokens: every refusal
(status, WWW-Authenticate shape, JSON-RPC body), every acceptance (the Principal it sets),
scopes per method and their hierarchy, open paths, and NoAuth's principals."""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest

from gateway.policies.auth import NoAuth
from gateway.policies.jwt_auth import MAX_AUTHORIZATION_BYTES, JwtAuth, www_authenticate
from gateway.protocol.principal import ANONYMOUS, Principal, credential_principal
from gateway.settings import load_settings
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, ec_key, rsa_key, unsigned_token

PRM = "https://mcp.test/.well-known/oauth-protected-resource/mcp"
MODERN = {"mcp-protocol-version": "2026-07-28"}


class Downstream:
    """The next app: records the principal it was handed."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append(scope.get("auth"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"reached"})


def auth_settings(issuer: Issuer, **extra: Any) -> Any:
    auth = {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "public_key": issuer.keys[0].public_pem(),
            "authorization_servers": [ISSUER], **extra}
    return load_settings(None, auth=auth).auth


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer()


def client_for(policy: JwtAuth) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=policy), base_url="http://testserver")


async def request(policy: JwtAuth, token: str | None = None, *, path: str = "/mcp", method: str | None = None,
                  headers: dict[str, str] | None = None, params: dict[str, str] | None = None) -> httpx.Response:
    h = dict(MODERN)
    if method is not None:
        h["mcp-method"] = method
    if token is not None:
        h["authorization"] = f"Bearer {token}"
    h.update(headers or {})
    async with client_for(policy) as client:
        return await client.post(path, headers=h, params=params, content=b"{}")


def challenge(response: httpx.Response) -> str:
    return response.headers["www-authenticate"]


def assert_idless_error(response: httpx.Response, text: str) -> None:
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "id" not in body
    assert text in body["error"]["message"]


# -- 401: no usable credentials ---------------------------------------------------------------


async def test_no_token_is_401_with_metadata_and_no_error_code(issuer):
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth_settings(issuer)))
    assert response.status_code == 401
    # RFC 6750 §3.1: a request without credentials gets no error code, just the challenge.
    assert challenge(response) == f'Bearer resource_metadata="{PRM}"'
    assert_idless_error(response, "Unauthorized")
    assert downstream.seen == []


async def test_challenge_names_required_and_method_scopes(issuer):
    auth = auth_settings(issuer, required_scopes=["mcp:read"], method_scopes={"tools/call": ["mcp:tools"]})
    listing = await request(JwtAuth(Downstream(), auth=auth), method="tools/list")
    calling = await request(JwtAuth(Downstream(), auth=auth), method="tools/call")
    assert challenge(listing) == f'Bearer scope="mcp:read", resource_metadata="{PRM}"'
    assert challenge(calling) == f'Bearer scope="mcp:read mcp:tools", resource_metadata="{PRM}"'


async def test_other_scheme_is_a_plain_challenge(issuer):
    response = await request(JwtAuth(Downstream(), auth=auth_settings(issuer)),
                             headers={"authorization": "Basic YWxpY2U6c2VjcmV0"})
    assert response.status_code == 401
    assert "error=" not in challenge(response)


INVALID = {
    # case: (what the error_description must say)
    "expired": "expired",
    "audience": "audience",
    "issuer": "issuer",
    "signature": "signature",
    "alg_none": "'none' is not accepted",
    "alg_None_capitalised": "'None' is not accepted",
    "no_sub": "'sub'",
    "garbage": "not a JWT",
    "hmac_with_public_key": "'HS256' is not accepted",
    "not_yet_valid": "not valid yet (nbf)",
    # Claims: exp is required (RFC 9068 §2.2), iat may not lie in the future, iss and aud
    # are compared exactly (RFC 8707: the audience is this resource's canonical URI).
    "no_exp": "no 'exp' claim",
    "no_iss": "no 'iss' claim",
    "no_aud": "no 'aud' claim",
    "iat_in_the_future": "not valid yet (iat in the future)",
    "audience_with_trailing_slash": "audience",
    "audience_host_only": "audience",
    "audience_list_without_us": "audience",
    "audience_not_strings": "audience",
    "issuer_prefix": "issuer",
    "issuer_with_trailing_slash": "issuer",
    # An algorithm the key could compute but the allow-list does not name (here: RS256 only).
    "alg_outside_the_allow_list": "'RS512' is not accepted",
    "alg_ps256_with_the_rsa_key": "'PS256' is not accepted",
    # Header parameters that would choose the key: never followed (only kid looks up a key).
    "embedded_jwk": "signature",
    "jku": "signature",
    # RFC 7515 §4.1.11: an extension listed in crit that the recipient does not know → invalid.
    "unknown_crit": "critical extension",
    # A header nested past the JSON parser's recursion limit: a 401, not a 500.
    "deeply_nested_header": "not a JWT",
}


@pytest.mark.parametrize("case", list(INVALID))
async def test_invalid_tokens_are_401_invalid_token(issuer, case):
    pem = issuer.keys[0].public_pem().encode()
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": 2**31}
    attacker = rsa_key(issuer.keys[0].kid)
    make = {
        "expired": lambda: issuer.token(lifetime=-120),
        "audience": lambda: issuer.token(aud="https://other.test/mcp"),
        "issuer": lambda: issuer.token(iss="https://evil.test"),
        "signature": lambda: Issuer(keys=[attacker]).token(),
        "alg_none": lambda: unsigned_token(claims, issuer.keys[0].kid),
        "alg_None_capitalised": lambda: _forged({"alg": "None", "kid": issuer.keys[0].kid}, claims, b""),
        "no_sub": lambda: issuer.token(sub=None),
        "garbage": lambda: "not.a.jwt",
        # The algorithm-confusion attack: HS256 keyed with the public key's PEM bytes.
        "hmac_with_public_key": lambda: _hs256(pem, claims),
        "not_yet_valid": lambda: issuer.token(nbf=2**31 - 10),
        "no_exp": lambda: issuer.token(exp=None),
        "no_iss": lambda: issuer.token(iss=None),
        "no_aud": lambda: issuer.token(aud=None),
        "iat_in_the_future": lambda: issuer.token(iat=now + 3600),
        "audience_with_trailing_slash": lambda: issuer.token(aud=AUDIENCE + "/"),
        "audience_host_only": lambda: issuer.token(aud="https://mcp.test"),
        "audience_list_without_us": lambda: issuer.token(aud=["https://other.test/mcp", "https://mcp.test"]),
        "audience_not_strings": lambda: issuer.token(aud=[1, 2]),
        "issuer_prefix": lambda: issuer.token(iss="https://idp"),
        "issuer_with_trailing_slash": lambda: issuer.token(iss=ISSUER + "/"),
        "alg_outside_the_allow_list": lambda: jwt.encode(claims, issuer.keys[0].private, algorithm="RS512",
                                                         headers={"kid": issuer.keys[0].kid}),
        "alg_ps256_with_the_rsa_key": lambda: jwt.encode(claims, issuer.keys[0].private, algorithm="PS256",
                                                         headers={"kid": issuer.keys[0].kid}),
        "embedded_jwk": lambda: Issuer(keys=[attacker]).token(headers={"jwk": attacker.public_jwk()}),
        "jku": lambda: Issuer(keys=[attacker]).token(headers={"jku": "https://evil.test/jwks"}),
        "unknown_crit": lambda: issuer.token(headers={"crit": ["x-policy"], "x-policy": "strict"}),
        "deeply_nested_header": lambda: _forged({"alg": "RS256", "x": "NEST"}, claims, b"sig",
                                                nest=5000),
    }
    expected = INVALID
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth_settings(issuer)), make[case]())
    assert response.status_code == 401, response.text
    header = challenge(response)
    assert header.startswith('Bearer error="invalid_token", ')
    assert f'resource_metadata="{PRM}"' in header
    assert expected[case] in header  # error_description says what failed
    assert_idless_error(response, expected[case])
    assert downstream.seen == []


def _forged(header: dict[str, Any], payload: dict[str, Any], signature: bytes, *, nest: int = 0) -> str:
    """A token assembled by hand, with any header; `nest` replaces "NEST" in the header by an
    array nested that deep."""
    import base64

    import orjson

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    raw_header = orjson.dumps(header).replace(b'"NEST"', b"[" * nest + b"]" * nest)
    return f"{b64(raw_header)}.{b64(orjson.dumps(payload))}.{b64(signature)}"


def _hs256(secret: bytes, payload: dict[str, Any]) -> str:
    # pyjwt refuses to HMAC with a PEM key, so the attacker's token is assembled by hand.
    import base64
    import hashlib
    import hmac

    import orjson

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{b64(orjson.dumps({'alg': 'HS256', 'typ': 'JWT'}))}.{b64(orjson.dumps(payload))}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


async def test_leeway_accepts_a_token_just_past_expiry(issuer):
    token = issuer.token(lifetime=-5)
    assert (await request(JwtAuth(Downstream(), auth=auth_settings(issuer, leeway_seconds=30)), token)).status_code == 200
    assert (await request(JwtAuth(Downstream(), auth=auth_settings(issuer, leeway_seconds=0)), token)).status_code == 401


async def test_leeway_accepts_a_token_just_before_nbf(issuer):
    token = issuer.token(nbf=int(time.time()) + 10)
    assert (await request(JwtAuth(Downstream(), auth=auth_settings(issuer, leeway_seconds=30)), token)).status_code == 200
    assert (await request(JwtAuth(Downstream(), auth=auth_settings(issuer, leeway_seconds=0)), token)).status_code == 401


async def test_audience_as_a_string_or_a_list_containing_the_gateway_is_accepted(issuer):
    for aud in (AUDIENCE, [AUDIENCE], ["https://other.test", AUDIENCE]):
        token = issuer.token(aud=aud)
        assert (await request(JwtAuth(Downstream(), auth=auth_settings(issuer)), token)).status_code == 200, aud


async def test_the_error_description_is_bounded(issuer):
    """The description echoes what the token claims (here a 5000-character `alg`): bounded, so
    a client cannot make the challenge as large as its own request."""
    token = _forged({"alg": "X" * 5000}, {"sub": "a"}, b"s")
    response = await request(JwtAuth(Downstream(), auth=auth_settings(issuer)), token)
    assert response.status_code == 401
    assert challenge(response).startswith('Bearer error="invalid_token"')
    assert "XXXX" in challenge(response) and len(challenge(response)) < 400
    assert len(response.json()["error"]["message"]) < 300


# -- 400: malformed --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["Bearer", "Bearer ", "Bearer a b", "Bearer a,b"])
async def test_malformed_authorization_is_400(issuer, value):
    response = await request(JwtAuth(Downstream(), auth=auth_settings(issuer)), headers={"authorization": value})
    assert response.status_code == 400
    assert challenge(response).startswith('Bearer error="invalid_request"')
    assert_idless_error(response, "Bad Request")


async def test_two_authorization_headers_are_400(issuer):
    token = issuer.token()
    policy = JwtAuth(Downstream(), auth=auth_settings(issuer))
    async with client_for(policy) as client:
        response = await client.post("/mcp", content=b"{}", headers=[
            ("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")])
    assert response.status_code == 400
    assert "more than one" in challenge(response)


async def test_token_in_query_string_is_refused_even_beside_a_good_header(issuer):
    token = issuer.token()
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth_settings(issuer)), token, params={"access_token": token})
    assert response.status_code == 400
    assert "query string" in challenge(response)
    assert downstream.seen == []


@pytest.mark.parametrize("path", ["/mcp", "/healthz"])
async def test_a_token_in_the_query_string_is_redacted_from_the_scope(issuer, path):
    """The server writes its access log line from the request's scope after the answer: the
    token must be gone from scope["query_string"] by then (RFC 6750 §5.3), on a refused
    request and on an open path alike."""
    token = issuer.token()
    scopes: list[dict[str, Any]] = []
    policy = JwtAuth(Downstream(), auth=auth_settings(issuer), open_paths=["/healthz"])

    async def server(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scopes.append(scope)
        await policy(scope, receive, send)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://testserver") as client:
        response = await client.post(f"{path}?x=1&access_token={token}&y=2", content=b"{}")
    assert response.status_code == (400 if path == "/mcp" else 200)
    assert scopes[0]["query_string"] == b"x=1&access_token=REDACTED&y=2"


async def test_an_authorization_header_past_the_header_limit_is_431_unread(issuer):
    """Past 64 KiB (the gateway's limit on a whole request head) the token is not decoded at
    all: 431, even when it is a valid token, and no challenge (the credentials are not at
    fault, the size is)."""
    token = issuer.token(scope="a", padding="x" * (MAX_AUTHORIZATION_BYTES + 1))
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth_settings(issuer)), token)
    assert response.status_code == 431
    assert "www-authenticate" not in response.headers
    assert_idless_error(response, f"larger than {MAX_AUTHORIZATION_BYTES} bytes")
    assert downstream.seen == []
    # Just under the limit, a valid token is still a valid token.
    fits = issuer.token(scope="a", padding="x" * (MAX_AUTHORIZATION_BYTES * 3 // 4 - 1000))
    assert (await request(JwtAuth(downstream, auth=auth_settings(issuer)), fits)).status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_the_bearer_scheme_is_case_insensitive(issuer, scheme):
    """RFC 9110 §11.1: auth schemes are case-insensitive."""
    token = issuer.token()
    response = await request(JwtAuth(Downstream(), auth=auth_settings(issuer)),
                             headers={"authorization": f"{scheme} {token}"})
    assert response.status_code == 200


async def test_a_token_in_a_form_body_is_not_a_credential(issuer):
    """OAuth 2.1 §5.1 keeps only the header (RFC 6750 §2.2's form parameter is gone): a form
    body with access_token is a request without credentials."""
    downstream = Downstream()
    policy = JwtAuth(downstream, auth=auth_settings(issuer))
    async with client_for(policy) as client:
        response = await client.post("/mcp", content=f"access_token={issuer.token()}",
                                     headers={**MODERN, "content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 401
    assert challenge(response) == f'Bearer resource_metadata="{PRM}"'
    assert downstream.seen == []


# -- accepted -------------------------------------------------------------------------------


async def test_valid_token_sets_the_principal(issuer):
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth_settings(issuer)), issuer.token("alice", scope="a b"))
    assert response.status_code == 200 and response.text == "reached"
    assert downstream.seen == [Principal("alice", ISSUER, True, frozenset({"a", "b"}))]


@pytest.mark.parametrize("claims", [{"scope": "files:read x"}, {"scp": ["files:read", "x"]}, {"scp": "files:read x"},
                                    {"scope": "x", "scp": ["files:read"]}])
async def test_scopes_from_scope_or_scp(issuer, claims):
    downstream = Downstream()
    auth = auth_settings(issuer, required_scopes=["files:read"])
    response = await request(JwtAuth(downstream, auth=auth), issuer.token("bob", **claims))
    assert response.status_code == 200
    assert downstream.seen[0].scopes == {"files:read", "x"}


@pytest.mark.parametrize("claims", [{}, {"scope": "files:readx"}, {"scope": "files:read,x"}, {"scp": [["files:read"]]},
                                    {"scope": ["FILES:READ"]}])
async def test_scopes_are_matched_exactly(issuer, claims):
    auth = auth_settings(issuer, required_scopes=["files:read"])
    response = await request(JwtAuth(Downstream(), auth=auth), issuer.token("bob", **claims))
    assert response.status_code == 403
    assert challenge(response).startswith('Bearer error="insufficient_scope", scope="files:read", resource_metadata=')


async def test_ec_key_and_scp_list_claim(issuer):
    ec = Issuer(keys=[ec_key()])
    downstream = Downstream()
    auth = auth_settings(ec, required_scopes=["files:read"])
    response = await request(JwtAuth(downstream, auth=auth), ec.token("bob", scp=["files:read", "x"]))
    assert response.status_code == 200
    assert downstream.seen[0].scopes == {"files:read", "x"}


async def test_hs256_secret_mode():
    secret = "s" * 32
    auth = load_settings(None, auth={"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "hs256_secret": secret,
                                     "authorization_servers": [ISSUER]}).auth
    good = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "svc", "exp": 2**31}, secret, algorithm="HS256")
    forged = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "svc", "exp": 2**31}, "t" * 32, algorithm="HS256")
    downstream = Downstream()
    assert (await request(JwtAuth(downstream, auth=auth), good)).status_code == 200
    assert (await request(JwtAuth(downstream, auth=auth), forged)).status_code == 401
    assert [p.subject for p in downstream.seen] == ["svc"]


# -- 403: scopes ----------------------------------------------------------------------------


async def test_insufficient_scope_is_403_naming_every_required_scope(issuer):
    auth = auth_settings(issuer, required_scopes=["mcp:read"], method_scopes={"tools/call": ["mcp:tools"]})
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth), issuer.token(scope="mcp:read"), method="tools/call")
    assert response.status_code == 403
    # One challenge with all the operation needs, not just what is missing (spec: §Runtime
    # Insufficient Scope Errors).
    assert challenge(response) == (
        f'Bearer error="insufficient_scope", scope="mcp:read mcp:tools", resource_metadata="{PRM}", '
        f'error_description="the token lacks scope mcp:tools"')
    assert_idless_error(response, "Forbidden")
    assert downstream.seen == []
    # The same token is enough for a method that needs only the global scope.
    assert (await request(JwtAuth(downstream, auth=auth), issuer.token(scope="mcp:read"),
                          method="tools/list")).status_code == 200


async def test_broader_scope_implies_narrower(issuer):
    auth = auth_settings(issuer, method_scopes={"tools/call": ["mcp:tools"]},
                         scope_implies={"mcp:admin": ["mcp:write"], "mcp:write": ["mcp:tools"]})
    downstream = Downstream()
    response = await request(JwtAuth(downstream, auth=auth), issuer.token(scope="mcp:admin"), method="tools/call")
    assert response.status_code == 200
    assert downstream.seen[0].scopes == {"mcp:admin", "mcp:write", "mcp:tools"}


@pytest.mark.parametrize("headers", [{}, {"mcp-protocol-version": "2025-11-25", "mcp-method": "tools/list"}])
async def test_unknown_method_fails_closed(issuer, headers):
    """Without a modern Mcp-Method the method is unknown before the body: every method's scopes
    are required, so an initialize-era request cannot dodge a method scope."""
    auth = auth_settings(issuer, method_scopes={"tools/call": ["mcp:tools"], "prompts/get": ["mcp:prompts"]})
    policy = JwtAuth(Downstream(), auth=auth)
    token = issuer.token(scope="")
    async with client_for(policy) as client:
        response = await client.post("/mcp", content=b"{}", headers={"authorization": f"Bearer {token}", **headers})
    assert response.status_code == 403
    assert 'scope="mcp:tools mcp:prompts"' in challenge(response)


# -- paths ----------------------------------------------------------------------------------


async def test_open_paths_need_no_token_and_everything_else_does(issuer):
    downstream = Downstream()
    policy = JwtAuth(downstream, auth=auth_settings(issuer), open_paths=["/healthz", "/.well-known/x"])
    async with client_for(policy) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/healthz/")).status_code == 200
        assert (await client.get("/.well-known/x")).status_code == 200
        assert (await client.get("/somewhere-new")).status_code == 401
        assert (await client.post("/mcp/")).status_code == 401
    assert downstream.seen == [None, None, None]


async def test_websocket_is_closed():
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    issuer = Issuer()
    downstream = Downstream()
    await JwtAuth(downstream, auth=auth_settings(issuer))({"type": "websocket", "path": "/mcp", "headers": []},
                                                          None, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert downstream.seen == []


def test_challenge_description_cannot_break_the_header():
    header = www_authenticate("https://m/.well-known/x", error="invalid_token", description='bad "quote" \\ \n')
    assert header == 'Bearer error="invalid_token", resource_metadata="https://m/.well-known/x", ' \
                     'error_description="bad ?quote? ? ?"'


# -- principals -----------------------------------------------------------------------------


def test_principal_keys_tell_callers_apart():
    alice, bob = Principal("alice", ISSUER, True), Principal("bob", ISSUER, True)
    other_idp_alice = Principal("alice", "https://other.test", True)
    assert len({alice.key, bob.key, other_idp_alice.key}) == 3
    # Scopes are not identity: a re-issued token with more scopes is the same caller.
    assert Principal("alice", ISSUER, True, frozenset({"x"})).key == alice.key


async def test_two_tokens_give_two_principal_keys(issuer):
    downstream = Downstream()
    policy = JwtAuth(downstream, auth=auth_settings(issuer))
    for sub in ("alice", "bob", "alice"):
        assert (await request(policy, issuer.token(sub))).status_code == 200
    keys = [p.key for p in downstream.seen]
    assert keys[0] != keys[1] and keys[0] == keys[2]


async def test_no_auth_principal_is_a_hash_of_the_credentials():
    downstream = Downstream()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=NoAuth(downstream)), base_url="http://t") as c:
        await c.get("/", headers={"authorization": "Bearer one"})
        await c.get("/", headers={"authorization": "Bearer two"})
        await c.get("/")
    one, two, none = downstream.seen
    assert one != two and none == ANONYMOUS
    assert "one" not in one.key and one == credential_principal(b"Bearer one")



@pytest.mark.parametrize(("verb", "path"), [("POST", "/sse/messages"), ("GET", "/sse"), ("GET", "/mcp"),
                                            ("DELETE", "/mcp"), ("POST", "/elsewhere")])
async def test_mcp_method_chooses_scopes_only_on_a_post_to_the_mcp_endpoint(issuer, verb, path):
    """Only a POST to the MCP endpoint has its Mcp-Method checked against the body (SHTTP
    §Server Validation); anywhere else a declared cheap method must not lower the scopes."""
    auth = auth_settings(issuer, method_scopes={"tools/call": ["mcp:tools"]})
    policy = JwtAuth(Downstream(), auth=auth, mcp_path="/mcp")
    headers = {**MODERN, "mcp-method": "tools/list", "authorization": f"Bearer {issuer.token(scope='')}"}
    async with client_for(policy) as client:
        refused = await client.request(verb, path, headers=headers)
        trusted = await client.post("/mcp/", headers=headers, content=b"{}")
    assert refused.status_code == 403
    assert 'scope="mcp:tools"' in challenge(refused)
    assert trusted.status_code == 200
