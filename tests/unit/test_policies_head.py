"""policies/head.py: a row of head policies runs as one ASGI step and decides exactly as the
same policies chained one by one would, in the order the pipeline declares; a refusal is an
`McpError` (returned or raised, from a sync or an async `admit`) and answers with its status,
headers and JSON-RPC body."""

from __future__ import annotations

import httpx
import pytest
from starlette.middleware import Middleware

from gateway.app import pipeline, wrap
from gateway.observability.middleware import RequestTelemetry
from gateway.policies.auth import NoAuth
from gateway.policies.head import HeadPhase, HeadPolicy
from gateway.policies.jwt_auth import JwtAuth
from gateway.policies.limits import RequestLimits
from gateway.policies.origin import HostPolicy, OriginPolicy
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.principal import ANONYMOUS
from gateway.settings import load_settings
from tests.unit.test_policies_auth_config import BASE as JWT
from tests.unit.test_policies_origin import call

SEEN: list[dict] = []


async def inner(scope, receive, send) -> None:
    SEEN.append(scope)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"passed"})


STEPS = [
    Middleware(HostPolicy, allowed_hosts=["gw.example"]),
    Middleware(OriginPolicy, allowed_origins=["https://app.example"]),
    Middleware(NoAuth),
    Middleware(RequestLimits, max_body_bytes=100),
]


def chained(steps):
    """The same steps, one ASGI middleware each (no fusion)."""
    app = inner
    for cls, args, kwargs in reversed(steps):
        app = cls(app, *args, **kwargs)
    return app


def test_a_row_of_head_policies_becomes_one_step_in_declared_order():
    app = wrap(inner, STEPS)
    assert isinstance(app, HeadPhase)
    assert [type(p) for p in app.policies] == [HostPolicy, OriginPolicy, NoAuth, RequestLimits]
    assert app.app is inner


def test_other_steps_break_the_row():
    jwt = load_settings(None, auth=JWT)
    app = wrap(inner, pipeline(jwt))
    assert isinstance(app, RequestTelemetry)
    head = app.app
    assert isinstance(head, HeadPhase)
    # JwtAuth's admit awaits (it may fetch keys) and still joins the row.
    assert [type(p) for p in head.policies] == [HostPolicy, OriginPolicy, JwtAuth, RequestLimits]
    assert head.app is inner


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "gw.example"}, 200),
        ({"host": "evil.example", "origin": "https://evil.example"}, 403),  # Host is checked first
        ({"host": "gw.example", "origin": "https://evil.example"}, 403),
        ({"host": "gw.example", "origin": "https://app.example", "content-length": "101"}, 413),
        ({"host": "evil.example", "content-length": "101"}, 403),  # refused before the size check
        ({"host": "gw.example", "x-big": "x" * 70_000}, 431),
    ],
)
async def test_fused_and_chained_policies_decide_alike(headers, status):
    fused_status, fused_body = await call(wrap(inner, STEPS), headers)
    chained_status, chained_body = await call(chained(STEPS), headers)
    assert fused_status == chained_status == status
    assert fused_body == chained_body


async def test_authentication_still_annotates_the_scope():
    SEEN.clear()
    await call(wrap(inner, STEPS), {"host": "gw.example"})
    assert SEEN[-1]["auth"] == ANONYMOUS


async def test_non_http_scopes_pass_through():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    await HeadPhase(app, [HostPolicy(app), OriginPolicy(app)])({"type": "lifespan"}, None, None)
    assert reached == ["lifespan"]


def test_every_pipeline_policy_is_a_head_policy():
    for policy in (HostPolicy, OriginPolicy, NoAuth, RequestLimits, JwtAuth):
        assert issubclass(policy, HeadPolicy)


class RateLimited(HeadPolicy):
    """The shape of a shared rate limit: an async admit (a Redis round trip) that refuses with
    -31004 at 429 and Retry-After. Counts per Host so that the test can tell callers apart."""

    def __init__(self, app, *, allowed: int) -> None:
        super().__init__(app)
        self.allowed = allowed
        self.seen: dict[str, int] = {}

    async def admit(self, scope):
        host = dict(scope["headers"]).get(b"host", b"").decode()
        self.seen[host] = self.seen.get(host, 0) + 1
        if self.seen[host] > self.allowed:
            return rpc.gateway_overloaded("rate limit reached", limit="test.allowed", status=429, retry_after=1.2)
        return None


class RaisesForbidden(HeadPolicy):
    def admit(self, scope):
        if dict(scope["headers"]).get(b"x-deny"):
            raise rpc.request_refused(403, "Forbidden: denied", headers={"X-Why": "test"})
        return None


async def test_an_async_admit_refuses_with_its_status_headers_and_body():
    steps = [Middleware(HostPolicy, allowed_hosts=["gw.example"]), Middleware(RateLimited, allowed=1),
             Middleware(RequestLimits, max_body_bytes=100)]
    app = wrap(inner, steps)
    assert isinstance(app, HeadPhase) and len(app.policies) == 3
    first = await _response(app, {"host": "gw.example"})
    second = await _response(app, {"host": "gw.example"})
    assert first.status_code == 200 and first.content == b"passed"
    assert second.status_code == 429
    assert second.headers["retry-after"] == "2"  # rounded up: never asks for a retry too early
    error = second.json()["error"]
    assert error["code"] == rpc.GATEWAY_OVERLOADED and error["data"] == {"limit": "test.allowed"}
    assert "id" not in second.json()
    # A refusal earlier in the row means the async policy is never asked.
    refused = await _response(app, {"host": "evil.example"})
    assert refused.status_code == 403 and "evil.example" not in app.policies[1].seen


async def test_a_raised_refusal_answers_like_a_returned_one():
    app = wrap(inner, [Middleware(RaisesForbidden), Middleware(NoAuth)])
    refused = await _response(app, {"host": "gw.example", "x-deny": "1"})
    assert refused.status_code == 403 and refused.headers["x-why"] == "test"
    assert refused.json() == {"jsonrpc": "2.0", "error": {"code": rpc.INVALID_REQUEST, "message": "Forbidden: denied"}}
    alone = await _response(RaisesForbidden(inner), {"host": "gw.example", "x-deny": "1"})  # outside a row
    assert alone.status_code == 403 and alone.json() == refused.json()
    assert (await _response(app, {"host": "gw.example"})).status_code == 200


async def test_a_websocket_is_closed_only_by_a_row_that_guards_every_path():
    jwt = load_settings(None, auth=JWT)
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    await wrap(app, pipeline(jwt)[1:])({"type": "websocket", "path": "/mcp", "headers": []}, None, send)
    assert sent == [{"type": "websocket.close", "code": 1008}] and reached == []
    await wrap(app, STEPS)({"type": "websocket", "path": "/mcp", "headers": []}, None, send)
    assert reached == ["websocket"]


async def _response(app, headers):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw.example") as client:
        return await client.get("/mcp", headers=headers)


def test_the_header_limit_counts_every_name_and_value_byte():
    """At the limit exactly: admitted; one byte over, in a name or in a value: 431."""
    limits = RequestLimits(None, max_body_bytes=100, max_header_bytes=40)  # type: ignore[arg-type]
    at_limit = [(b"host", b"gw"), (b"x-a", b"1" * 20), (b"x-bb", b"2" * 7)]  # 4+2 + 3+20 + 4+7 = 40
    assert limits.admit({"headers": at_limit}) is None
    for over in ([*at_limit[:2], (b"x-bbb", b"2" * 7)], [*at_limit[:2], (b"x-bb", b"2" * 8)]):
        refused = limits.admit({"headers": over})
        assert refused is not None and refused.status == 431
