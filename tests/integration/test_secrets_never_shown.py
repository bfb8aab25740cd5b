"""Every secret setting, in every form (inline, {env}, {file}), grepped for in everything the
gateway shows: `repr`/`str`/JSON of its settings, `check-config` output (passing and failing),
debug-level logs of real traffic, and the error answers of every credential failure (token
endpoint refusing, down, backend refusing every token). None may appear."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import httpx
import jwt
import pytest
import yaml

from gateway.settings import ConfigError, load_settings
from tests.integration.test_backend_credentials import CLIENT_ID, GuardedBackend
from tests.support.oauth import AuthorizationServer, ServedApp

HEADER_SECRET = "hdr-SECRET-a1b2c3d4e5"
CLIENT_SECRET = "cc-SECRET-f6a7b8c9d0"
SECURITY_SECRET = "sec-SECRET-0123456789abcdef0123456789"
HS256_SECRET = "hs-SECRET-fedcba9876543210fedcba9876543210"
TLS_PASSWORD = "tls-SECRET-5566778899"
SECRETS = (HEADER_SECRET, CLIENT_SECRET, SECURITY_SECRET, HS256_SECRET, TLS_PASSWORD)


def assert_no_secret(text: str, *extra: str) -> None:
    for secret in (*SECRETS, *extra):
        assert secret not in text, f"a secret ({secret[:6]}...) appears in:\n{text[:3000]}"


@pytest.fixture
def secret_files(tmp_path, monkeypatch) -> dict[str, Any]:
    (tmp_path / "client-secret").write_text(CLIENT_SECRET + "\n")  # as kubectl writes it
    monkeypatch.setenv("TEST_SECURITY_SECRET", SECURITY_SECRET)
    return {"client_secret": {"file": str(tmp_path / "client-secret")},
            "security": {"secret": {"env": "TEST_SECURITY_SECRET"}}}


def config(backend_url: str, token_url: str, forms: dict[str, Any]) -> dict[str, Any]:
    return {
        "backends": [
            {"name": "keyed", "url": backend_url, "era": "modern", "retries": 0,
             "auth": {"type": "headers", "headers": {"x-api-key": HEADER_SECRET}}},
            {"name": "oauth", "url": backend_url, "era": "modern", "retries": 0,
             "auth": {"type": "oauth_client_credentials", "token_url": token_url, "client_id": CLIENT_ID,
                      "client_secret": forms["client_secret"]}},
        ],
        "security": forms["security"],
        "auth": {"mode": "jwt", "issuer": "https://idp.test", "audience": "https://mcp.test/mcp",
                 "hs256_secret": HS256_SECRET, "authorization_servers": ["https://idp.test"]},
        "observability": {"log_level": "debug"},
    }


def test_settings_never_show_a_secret_in_any_form(secret_files):
    settings = load_settings(None, **config("http://127.0.0.1:1/mcp", "http://127.0.0.1:1/token", secret_files))
    # They were read: the file (its newline dropped) and the variable.
    assert settings.backends[1].auth.client_secret.get_secret_value() == CLIENT_SECRET
    assert settings.security.secret.get_secret_value() == SECURITY_SECRET
    for shown in (repr(settings), str(settings), settings.model_dump_json(), repr(settings.backends),
                  str(settings.model_dump())):
        assert_no_secret(shown)


def test_check_config_never_shows_a_secret_passing_or_failing(tmp_path, secret_files):
    good = config("http://127.0.0.1:1/mcp", "http://127.0.0.1:1/token", secret_files)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(good))
    env = {"PATH": "/usr/bin:/bin", "TEST_SECURITY_SECRET": SECURITY_SECRET}
    run = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert_no_secret(run.stdout + run.stderr)

    # Broken around the secrets: a value of the wrong shape, a short HMAC key, a missing
    # variable, a missing file, a header name that is not one: each named, none echoed.
    bad = config("http://127.0.0.1:1/mcp", "http://127.0.0.1:1/token", secret_files)
    bad["backends"][0]["auth"]["headers"] = {"x-api-key": [HEADER_SECRET]}
    bad["backends"][1]["auth"]["client_secret"] = {"file": str(tmp_path / "absent")}
    bad["security"] = {"secret": {"env": "NOT_SET_ANYWHERE"}}
    bad["auth"]["hs256_secret"] = {"secret": HS256_SECRET, "extra": TLS_PASSWORD}
    path.write_text(yaml.safe_dump(bad))
    run = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], capture_output=True,
                         text=True, timeout=60, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 1
    assert "backends.0.auth.headers.x-api-key" in out and "NOT_SET_ANYWHERE" in out and "absent" in out
    assert "auth.hs256_secret" in out
    assert_no_secret(out)

    with pytest.raises(ConfigError) as exc:
        load_settings(None, **{**good, "auth": {**good["auth"], "hs256_secret": "short-" + HS256_SECRET[:8]}})
    assert_no_secret(str(exc.value), "short-" + HS256_SECRET[:8])


async def test_debug_logs_and_every_error_answer_never_show_a_secret_or_a_token(secret_files, caplog):
    caplog.set_level(logging.DEBUG)
    from tests.support.gateway import running_gateway

    authz = AuthorizationServer({CLIENT_ID: CLIENT_SECRET})
    backend = GuardedBackend()
    a, b = ServedApp(authz), ServedApp(backend)
    await a.start()
    await b.start()
    shown: list[str] = []
    client_token = jwt.encode({"iss": "https://idp.test", "aud": "https://mcp.test/mcp", "sub": "erin",
                               "exp": 2**31}, HS256_SECRET, algorithm="HS256")
    try:
        settings = config(f"{b.base}/mcp", f"{a.base}/token", secret_files)
        async with running_gateway(settings, discover=False) as gw, httpx.AsyncClient() as client:
            async def tool(name: str) -> httpx.Response:
                from tests.support import mcp_http

                response = await mcp_http.post(client, gw.url, "tools/call", {"name": name, "arguments": {}},
                                               extra_headers={"authorization": f"Bearer {client_token}"})
                shown.append(f"{response.status_code} {response.headers} {response.text}")
                return response

            assert (await tool("keyed__echo")).status_code == 200
            assert (await tool("oauth__echo")).status_code == 200
            issued = backend.bearer_tokens()[-1]
            backend.reject_all = True  # 401 to every token: one refresh, then the refusal
            assert (await tool("oauth__echo")).status_code == 502
            assert (await tool("keyed__echo")).status_code == 502
            backend.reject_all = False
            authz.clients[CLIENT_ID] = "rotated"  # the AS refuses the gateway's client now
            source = next(b for b in gw.app.runtime.backends if b.name == "oauth").credentials.source
            source.invalidate(source.header or "")
            assert (await tool("oauth__echo")).status_code == 502
            await a.stop()  # the AS is down
            assert (await tool("oauth__echo")).status_code == 502
            # A bad client token: 401, and its text is not echoed either.
            bad = await mcp_http_post_with(client, gw.url, client_token[:-4] + "AAAA")
            shown.append(bad.text + str(bad.headers))
    finally:
        await a.stop()
        await b.stop()
    everything = "\n".join(shown) + "\n" + "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
    assert any(r.levelno == logging.DEBUG for r in caplog.records)  # debug logging was on
    assert_no_secret(everything, client_token, issued)


async def mcp_http_post_with(client: httpx.AsyncClient, url: str, token: str) -> httpx.Response:
    from tests.support import mcp_http

    return await mcp_http.post(client, url, "tools/list", extra_headers={"authorization": f"Bearer {token}"})


def test_a_secret_file_and_variable_are_read_again_on_every_load(tmp_path, monkeypatch):
    path = tmp_path / "secret"
    path.write_text("first-value")
    monkeypatch.setenv("ROTATING", "env-first")
    data = {"backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp",
                          "auth": {"type": "headers", "headers": {"x-a": {"file": str(path)}, "x-b": {"env": "ROTATING"}}}}]}
    first = load_settings(None, **data)
    path.write_text("second-value\n")
    monkeypatch.setenv("ROTATING", "env-second")
    second = load_settings(None, **data)
    values = lambda s: {k: v.get_secret_value() for k, v in s.backends[0].auth.headers.items()}  # noqa: E731
    assert values(first) == {"x-a": "first-value", "x-b": "env-first"}
    assert values(second) == {"x-a": "second-value", "x-b": "env-second"}
