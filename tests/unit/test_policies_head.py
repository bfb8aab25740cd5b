"""policies/head.py: a row of head policies runs as one ASGI step and decides exactly as the
same policies chained one by one would, in the order the pipeline declares."""

from __future__ import annotations

import pytest
from starlette.middleware import Middleware

from gateway.app import pipeline, wrap
from gateway.observability.middleware import RequestTelemetry
from gateway.policies.auth import ANONYMOUS, NoAuth
from gateway.policies.head import HeadPhase, HeadPolicy
from gateway.policies.jwt_auth import JwtAuth
from gateway.policies.limits import RequestLimits
from gateway.policies.origin import HostPolicy, OriginPolicy
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
    host_origin = app.app
    assert isinstance(host_origin, HeadPhase)
    assert [type(p) for p in host_origin.policies] == [HostPolicy, OriginPolicy]
    assert isinstance(host_origin.app, JwtAuth)
    assert isinstance(host_origin.app.app, RequestLimits)  # a row of one stays itself
    assert host_origin.app.app.app is inner


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


def test_every_head_policy_decides_synchronously():
    for policy in (HostPolicy, OriginPolicy, NoAuth, RequestLimits):
        assert issubclass(policy, HeadPolicy)
    assert not issubclass(JwtAuth, HeadPolicy)  # it may fetch keys: an ASGI step of its own
