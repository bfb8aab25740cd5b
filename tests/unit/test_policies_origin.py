"""gateway/policies/origin.py and limits.py, driven as ASGI apps in process (digest §a.2, the
DNS-rebinding defence; SEP-2243 §Security: reject oversized input before reading it)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.policies.limits import RequestLimits
from gateway.policies.origin import HostPolicy, OriginPolicy


async def inner(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"passed"})


async def call(app, headers: dict[str, str], scope_type: str = "http") -> tuple[int, Any]:
    scope = {"type": scope_type, "method": "POST", "path": "/mcp",
             "headers": [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (body.decode() if body == b"passed" else orjson.loads(body))


# -- Origin ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (None, "gw.example", True),  # no Origin: not a browser, nothing to check
        ("http://localhost:5173", "gw.example", True),
        ("http://127.0.0.1", "gw.example", True),
        ("http://[::1]:3000", "gw.example", True),
        ("http://dev.localhost", "gw.example", True),
        ("https://gw.example", "gw.example", True),  # same-host
        ("https://gw.example:8443", "gw.example:8443", True),
        ("https://GW.example", "gw.example", True),
        ("https://gw.example:8443", "gw.example", False),  # another port is another origin
        ("https://evil.example", "gw.example", False),
        ("https://gw.example.evil.example", "gw.example", False),
        ("null", "gw.example", False),  # opaque origin (sandboxed frame, file://)
        ("file://", "gw.example", False),
        ("chrome-extension://abc", "gw.example", False),
        ("https://evil.example", None, False),
        # Not serialized origins: urlsplit finds a loopback host in each, a browser sends none
        # of them. Two Origin headers arrive joined by ", " (asgi.header_dict).
        ("http://localhost:80, https://evil.example", "gw.example", False),
        ("http://evil.example@127.0.0.1", "gw.example", False),
        ("http://localhost/elsewhere", "gw.example", False),
        ("http://localhost:99999", "gw.example", False),
        ("http://localhost:8080/", "gw.example", True),
    ],
)
async def test_origin(origin, host, allowed):
    headers = {}
    if origin is not None:
        headers["origin"] = origin
    if host is not None:
        headers["host"] = host
    status, body = await call(OriginPolicy(inner), headers)
    if allowed:
        assert (status, body) == (200, "passed")
    else:
        assert status == 403
        assert "id" not in body and body["error"]["code"] == -32600
        assert origin in body["error"]["message"]


async def test_configured_origins_and_wildcard():
    app = OriginPolicy(inner, allowed_origins=["https://console.example.com/"])
    assert (await call(app, {"origin": "https://console.example.com", "host": "gw"}))[0] == 200
    assert (await call(app, {"origin": "https://other.example.com", "host": "gw"}))[0] == 403
    anything = OriginPolicy(inner, allowed_origins=["*"])
    assert (await call(anything, {"origin": "https://other.example.com", "host": "gw"}))[0] == 200


async def test_non_http_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    await OriginPolicy(app)({"type": "lifespan"}, None, None)
    await HostPolicy(app)({"type": "lifespan"}, None, None)
    assert seen == ["lifespan", "lifespan"]


# -- Host when bound to loopback ---------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8080", True),
        ("localhost", True),
        ("LOCALHOST:1", True),
        ("[::1]:8080", True),
        ("127.0.0.2", True),
        ("app.localhost", True),
        ("evil.example", False),
        ("evil.example:8080", False),
        ("localhost.evil.example", False),
        ("10.0.0.1", False),
        ("", False),
        ("[::1]evil.example", False),  # only ":port" may follow an IPv6 literal
        ("[::1]:80x", False),
        ("[::1", False),
        ("localhost, evil.example", False),  # two Host headers, joined
    ],
)
async def test_loopback_host(host, allowed):
    status, body = await call(HostPolicy(inner), {"host": host} if host else {})
    if allowed:
        assert status == 200
    else:
        assert status == 403 and body["error"]["code"] == -32600 and "id" not in body


async def test_loopback_host_allow_list():
    app = HostPolicy(inner, allowed_hosts=["Gateway.Internal"])
    assert (await call(app, {"host": "gateway.internal:8080"}))[0] == 200


# -- limits ------------------------------------------------------------------------------


async def test_declared_body_over_the_cap_is_413_before_reading():
    app = RequestLimits(inner, max_body_bytes=100)
    status, body = await call(app, {"content-length": "101"})
    assert status == 413 and body["error"]["code"] == -32600 and "100" in body["error"]["message"]
    assert (await call(app, {"content-length": "100"}))[0] == 200


async def test_oversized_headers_are_431():
    app = RequestLimits(inner, max_body_bytes=100, max_header_bytes=256)
    status, body = await call(app, {"mcp-param-blob": "x" * 300})
    assert status == 431 and "id" not in body


def test_limits_validate_their_options():
    with pytest.raises(ValueError):
        RequestLimits(inner, max_body_bytes=0)


# -- deployments beyond loopback -----------------------------------------------------------


async def test_same_host_origin_is_not_trusted_without_a_host_check():
    # A rebinding page controls both Host and Origin; equality proves nothing unless the Host
    # itself is checked.
    untrusting = OriginPolicy(inner, trust_same_host=False)
    status, _ = await call(untrusting, {"origin": "http://evil.example:8080", "host": "evil.example:8080"})
    assert status == 403
    status, _ = await call(untrusting, {"origin": "http://localhost:3000", "host": "gw.example"})
    assert status == 200


def test_pipeline_checks_host_beyond_loopback_only_when_allowed_hosts_is_set():
    from gateway.app import pipeline
    from gateway.settings import load_settings

    def policies(**server):
        steps = pipeline(load_settings(None, server=server))
        return {step.cls: step.kwargs for step in steps}

    open_bind = policies(host="0.0.0.0")
    assert HostPolicy not in open_bind
    assert open_bind[OriginPolicy]["trust_same_host"] is False
    listed = policies(host="0.0.0.0", allowed_hosts=["mcp.example.com"])
    assert listed[HostPolicy]["allowed_hosts"] == ("mcp.example.com",)
    assert listed[OriginPolicy]["trust_same_host"] is True
    assert HostPolicy in policies(host="127.0.0.1")
