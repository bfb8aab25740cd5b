"""Every secret setting, in every form (inline, {env}, {file}), grepped for in everything the
gateway shows: `repr`/`str`/JSON of its settings, `check-config` output (passing and failing),
debug-level logs of real traffic, and the error answers of every credential failure (token
endpoint refusing, down, backend refusing every token). Redis passwords too (in a URL, as a
field, Sentinel's own), the TLS key passphrase and clients' JWTs, through a real `serve` run
against a redis-server that wants a password: once refused, once connected, then reloads
refused and restart-only; its log, answers, /readyz and /metrics. None may appear."""

from __future__ import annotations

import logging
import ssl
import subprocess
import sys
from typing import Any

import httpx
import jwt
import orjson
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
                         text=True, timeout=60, env=env, check=False)
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
                         text=True, timeout=60, env=env, check=False)
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
    values = lambda s: {k: v.get_secret_value() for k, v in s.backends[0].auth.headers.items()}
    assert values(first) == {"x-a": "first-value", "x-b": "env-first"}
    assert values(second) == {"x-a": "second-value", "x-b": "env-second"}


# -- Redis passwords, the TLS key passphrase, and a real `serve` run ----------------------------

REDIS_PASSWORD = "redis-SECRET-a9b8c7d6e5f4"
WRONG_REDIS_PASSWORD = "wrong-redis-SECRET-13579"  # in a URL: a secret all the same
SENTINEL_PASSWORD = "sentinel-SECRET-0a1b2c3d4e"
URL_PASSWORDS = ("url-SECRET-cache-1111", "url-SECRET-bus-2222", "url-SECRET-shared-3333")
REDIS_SECRETS = (REDIS_PASSWORD, WRONG_REDIS_PASSWORD, SENTINEL_PASSWORD, *URL_PASSWORDS)


def assert_nothing_secret(text: str, *extra: str) -> None:
    assert_no_secret(text, *REDIS_SECRETS, *extra)


@pytest.fixture(scope="module")
def guarded_redis(tmp_path_factory) -> Any:
    """A redis-server that wants a password (`requirepass`), and a Sentinel in front of it
    that wants its own (`requirepass` there too; `auth-pass` toward the master)."""
    from tests.support.procs import Proc, free_port, redis_server_binary
    from tests.support.redis_shapes import sentinel_binary

    binary, sentinel = redis_server_binary(), sentinel_binary()
    if binary is None or sentinel is None:
        pytest.fail("redis-server / redis-sentinel are not installed; run the tests through scripts/test.sh")
    workdir = tmp_path_factory.mktemp("guarded-redis")
    port = free_port()
    master = Proc([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--requirepass", REDIS_PASSWORD], port, name="redis-guarded").start()
    sentinel_port = free_port()
    conf = workdir / "sentinel.conf"
    conf.write_text(f"port {sentinel_port}\nbind 127.0.0.1\ndir {workdir}\n"
                    f"sentinel monitor gw 127.0.0.1 {port} 1\nsentinel auth-pass gw {REDIS_PASSWORD}\n"
                    f"requirepass {SENTINEL_PASSWORD}\n")
    sentinel_proc = Proc([*sentinel, str(conf)], sentinel_port, name="redis-sentinel-guarded").start()
    try:
        yield {"port": port, "sentinel_port": sentinel_port}
    finally:
        sentinel_proc.stop()
        master.stop()


def redis_forms(tmp_path, monkeypatch, redis_port: int, sentinel_port: int) -> list[dict[str, Any]]:
    """Settings that hold every Redis secret in every place it may be written."""
    (tmp_path / "sentinel-password").write_text(SENTINEL_PASSWORD + "\n")
    monkeypatch.setenv("TEST_REDIS_PASSWORD", REDIS_PASSWORD)
    cache_url, bus_url, shared_url = URL_PASSWORDS
    return [
        # Passwords in URLs: the shared block, and both short forms.
        {"redis": {"url": f"redis://default:{shared_url}@127.0.0.1:{redis_port}/0"},
         "cache": {"store": "redis", "redis_url": f"redis://:{cache_url}@127.0.0.1:{redis_port}/1"},
         "subscriptions": {"redis_url": f"redis://gw:{bus_url}@127.0.0.1:{redis_port}/2"}},
        # Fields: a plain value, an env variable, a file; Sentinel's own password.
        {"redis": {"url": f"redis+sentinel://127.0.0.1:{sentinel_port}/gw/0", "password": {"env": "TEST_REDIS_PASSWORD"},
                   "sentinel_password": {"file": str(tmp_path / "sentinel-password")}},
         "cache": {"store": "redis", "redis": {"url": f"redis://127.0.0.1:{redis_port}/1",
                                               "password": WRONG_REDIS_PASSWORD}}},
    ]


def test_redis_passwords_never_show_in_settings_plans_or_clients(tmp_path, monkeypatch):
    from gateway.redis_client import plan_of
    from gateway.redis_client.clients import client_for

    for form in redis_forms(tmp_path, monkeypatch, 6390, 26390):
        settings = load_settings(None, **form)
        sections = [settings.redis, settings.cache, settings.subscriptions, settings.cache_redis(), settings.bus_redis()]
        for shown in (repr(settings), str(settings), settings.model_dump_json(), *map(repr, sections),
                      *map(str, sections)):
            assert_nothing_secret(shown)
        for redis_settings in (settings.redis, settings.cache_redis(), settings.bus_redis()):
            plan = plan_of(redis_settings)
            assert plan.password is not None  # it was read, and is only hidden
            client = client_for(plan, timeout=1, connect_timeout=1)
            assert_nothing_secret(f"{plan!r} {plan} {plan.describe()} {client!r} {client}")
            assert ":***@" in plan.describe()


def test_check_config_never_shows_a_redis_password_passing_or_failing(tmp_path, monkeypatch):
    env = {"PATH": "/usr/bin:/bin", "TEST_REDIS_PASSWORD": REDIS_PASSWORD}
    path = tmp_path / "gateway.yaml"

    def check(data: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        path.write_text(yaml.safe_dump(data))
        return subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], capture_output=True,
                              text=True, timeout=60, env=env, check=False)

    for form in redis_forms(tmp_path, monkeypatch, 6390, 26390):
        run = check(form)
        assert run.returncode == 0, run.stdout + run.stderr
        assert_nothing_secret(run.stdout + run.stderr)
    cache_url, bus_url, shared_url = URL_PASSWORDS
    broken = [
        # A URL that does not parse or validate, with the password in it.
        ({"redis": {"url": f"redis://default:{shared_url}@127.0.0.1:6390/0?timeout=1"}}, "redis"),
        ({"redis": {"url": f"redis+cluster://:{shared_url}@127.0.0.1:6390/3"}}, "redis"),
        ({"cache": {"store": "redis", "redis_url": f"rediz://:{cache_url}@127.0.0.1:6390/0"}}, "cache"),
        ({"subscriptions": {"redis_url": f"redis://:{bus_url}@h1:1,h2:2/0"}}, "subscriptions"),
        # Set twice; of the wrong shape; a variable or a file that is not there.
        ({"redis": {"url": f"redis://:{shared_url}@127.0.0.1:6390/0", "password": REDIS_PASSWORD}}, "redis"),
        ({"redis": {"url": "redis://127.0.0.1:6390/0", "password": [REDIS_PASSWORD]}}, "redis.password"),
        ({"redis": {"url": "redis+sentinel://127.0.0.1:26390/gw", "sentinel_password": {"env": "NOT_SET_X"}}},
         "NOT_SET_X"),
        ({"redis": {"url": "redis://127.0.0.1:6390/0", "password": REDIS_PASSWORD, "sentinel_password": SENTINEL_PASSWORD}},
         "redis"),
    ]
    for data, named in broken:
        run = check(data)
        out = run.stdout + run.stderr
        assert run.returncode == 1 and named in out, out
        assert_nothing_secret(out)


def _encrypted_tls(tmp_path) -> Any:
    from cryptography.hazmat.primitives import serialization

    from tests.support.tls import loopback_certificates

    files = loopback_certificates(tmp_path)
    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(TLS_PASSWORD.encode())))
    return files


def _served_config(tmp_path, demo_url: str, ops_port: int, redis: dict[str, Any]) -> dict[str, Any]:
    tls = _encrypted_tls(tmp_path)
    return {
        "server": {"ops_port": ops_port, "readiness": "all",
                   "tls": {"cert_file": str(tls.cert), "key_file": str(tls.key),
                           "key_password": {"env": "TEST_TLS_PASSWORD"}}},
        "backends": [{"name": "demo", "url": demo_url, "era": "modern",
                      "headers": {"x-api-key": {"env": "TEST_HEADER_SECRET"}}}],
        "redis": redis,
        "cache": {"store": "redis", "default_ttl_ms": 60000},
        "rate_limits": [{"rate": "1000/s"}],  # Redis-shared: one more client that must fail politely
        "security": {"secret": {"env": "TEST_SECURITY_SECRET"}},
        "auth": {"mode": "jwt", "issuer": "https://idp.test", "audience": "https://mcp.test/mcp",
                 "hs256_secret": {"env": "TEST_HS256_SECRET"}, "authorization_servers": ["https://idp.test"]},
        "observability": {"log_level": "debug", "log_format": "json", "access_log": True},
    }


def _serve_env() -> dict[str, str]:
    return {"TEST_TLS_PASSWORD": TLS_PASSWORD, "TEST_HEADER_SECRET": HEADER_SECRET,
            "TEST_SECURITY_SECRET": SECURITY_SECRET, "TEST_HS256_SECRET": HS256_SECRET,
            "TEST_REDIS_PASSWORD": REDIS_PASSWORD}


def _traffic(gateway_port: int, ops_port: int, ca: str, token: str) -> list[str]:
    """Calls (cacheable and not), a refused token, and what the probes and /metrics show."""
    from tests.support import mcp_http

    shown = []
    url = f"https://127.0.0.1:{gateway_port}/mcp"
    with httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=20) as client:
        for method, params in (("tools/list", None), ("tools/list", None), ("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}})):
            name = params["name"] if params else None
            response = client.post(url, content=orjson.dumps(mcp_http.body(method, params)),
                                   headers=mcp_http.headers(method, name, authorization=f"Bearer {token}"))
            assert response.status_code == 200, response.text
            shown.append(f"{response.headers} {response.text}")
        refused = client.post(url, content=orjson.dumps(mcp_http.body("tools/list")),
                              headers=mcp_http.headers("tools/list", authorization=f"Bearer {token[:-4]}AAAA"))
        assert refused.status_code == 401
        shown.append(f"{refused.headers} {refused.text}")
    for path in ("/readyz", "/metrics", "/healthz"):
        response = httpx.get(f"http://127.0.0.1:{ops_port}{path}", timeout=10)
        shown.append(response.text)
    return shown


def _wait_for(proc: Any, text: str, timeout: float = 20) -> None:
    import time

    deadline = time.monotonic() + timeout
    while text not in proc.output():
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{proc.output()[-3000:]}"
        time.sleep(0.1)


def test_a_real_serve_run_against_a_password_protected_redis_never_shows_a_secret(guarded_redis, tmp_path):
    """`serve` at DEBUG level, its MCP listener on TLS with an encrypted key, a backend with a
    credential header, JWT clients; Redis behind `requirepass`: once with a wrong password in
    the URL (every Redis user fails: cache, rate limiter, listen bus), once through Sentinel
    with the right ones as fields (it works: keys land in Redis); then a reload refused and a
    reload that changes the Redis password (restart-only). The whole log, every answer,
    /readyz and /metrics: no secret, no token."""
    import os
    import signal

    import redis as redis_py

    from tests.support.procs import Proc, free_port, gateway_process

    port, sentinel_port = guarded_redis["port"], guarded_redis["sentinel_port"]
    demo_port = free_port()

    demo = Proc([sys.executable, "-m", "gateway", "demo-backend", "--port", str(demo_port)], demo_port,
                name="demo-backend").start()
    token = jwt.encode({"iss": "https://idp.test", "aud": "https://mcp.test/mcp", "sub": "erin", "exp": 2**31},
                       HS256_SECRET, algorithm="HS256")
    (tmp_path / "sentinel-password").write_text(SENTINEL_PASSWORD + "\n")
    shown: list[str] = []
    outputs: list[str] = []
    try:
        # 1. The wrong password, in the URL.
        ops_port = free_port()
        config = _served_config(tmp_path, f"http://127.0.0.1:{demo_port}/mcp", ops_port,
                                {"url": f"redis://default:{WRONG_REDIS_PASSWORD}@127.0.0.1:{port}/0"})
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        gw = gateway_process(path, env=_serve_env()).start()
        try:
            shown += _traffic(gw.port, ops_port, str(tmp_path / "ca.pem"), token)
        finally:
            gw.stop()
        outputs.append(gw.output())
        assert "WRONGPASS" in outputs[-1] or "invalid username-password" in outputs[-1], outputs[-1][-3000:]

        # 2. The right passwords, as fields ({env}, {file}), through Sentinel.
        ops_port = free_port()
        config = _served_config(tmp_path, f"http://127.0.0.1:{demo_port}/mcp", ops_port,
                                {"url": f"redis+sentinel://127.0.0.1:{sentinel_port}/gw/0",
                                 "password": {"env": "TEST_REDIS_PASSWORD"},
                                 "sentinel_password": {"file": str(tmp_path / "sentinel-password")}})
        path.write_text(yaml.safe_dump(config))
        with redis_py.Redis(port=port, password=REDIS_PASSWORD) as direct:
            direct.flushall()
            gw = gateway_process(path, env=_serve_env()).start()
            try:
                shown += _traffic(gw.port, ops_port, str(tmp_path / "ca.pem"), token)
                assert direct.dbsize() > 0  # the cache (and the limiter) wrote to Redis: it connected
                # A reload refused around the secrets, then one that changes the Redis password.
                broken = {**config, "redis": {**config["redis"], "password": [REDIS_PASSWORD]},
                          "backends": [{**config["backends"][0], "headers": {"x-api-key": {"env": "NOT_SET_Y"}}}]}
                path.write_text(yaml.safe_dump(broken))
                os.kill(gw.proc.pid, signal.SIGHUP)
                _wait_for(gw, "NOT_SET_Y")
                changed = {**config, "redis": {**config["redis"], "password": WRONG_REDIS_PASSWORD}}
                path.write_text(yaml.safe_dump(changed))
                os.kill(gw.proc.pid, signal.SIGHUP)
                _wait_for(gw, "redis.password")
                shown += _traffic(gw.port, ops_port, str(tmp_path / "ca.pem"), token)
            finally:
                gw.stop()
        outputs.append(gw.output())
    finally:
        demo.stop()
    log = "\n".join(outputs)
    (tmp_path / "serve.log").write_text(log)
    assert '"level":"debug"' in log, log[-2000:]  # debug logging was on
    assert "redis.password" in log and "NOT_SET_Y" in log
    assert_nothing_secret(log + "\n".join(shown), token)


def _reachable(root: Any, limit: int = 20_000) -> list[Any]:
    """Every object reachable from `root` through attributes, slots and containers (not
    into modules, classes or functions): what the built gateway holds."""
    import types

    seen: set[int] = set()
    found: list[Any] = []
    stack = [root]
    opaque = (str, bytes, int, float, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    while stack and len(found) < limit:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, opaque):
            continue
        if isinstance(obj, dict):
            stack += list(obj.values())
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
            continue
        stack += list(getattr(obj, "__dict__", {}).values())
        for klass in type(obj).__mro__:
            stack += [getattr(obj, s) for s in getattr(klass, "__slots__", ()) if isinstance(s, str) and hasattr(obj, s)]
    return found


async def test_no_object_of_the_built_gateway_shows_a_secret_in_its_repr(tmp_path, monkeypatch, secret_files):
    """repr() of everything `build_app` compiles from settings holding every kind of secret
    (backends' headers and client credentials, identity header, Redis passwords in a URL and
    as fields, Sentinel's, security.secret, auth.hs256_secret): pools, clients, sealers,
    verifiers, stores, the settings inside them."""
    from gateway.app import build_app

    monkeypatch.setenv("TEST_REDIS_PASSWORD", REDIS_PASSWORD)
    data = config("http://127.0.0.1:1/mcp", "http://127.0.0.1:1/token", secret_files)
    data["backends"][0].update(identity_header="x-mcp-user")
    data["backends"].append({"name": "legacy", "url": "http://127.0.0.1:1/mcp", "era": "legacy",
                             "headers": {"authorization": f"Bearer {HEADER_SECRET}"}})
    data |= {"redis": {"url": "redis+sentinel://127.0.0.1:1/gw/0", "password": {"env": "TEST_REDIS_PASSWORD"},
                       "sentinel_password": SENTINEL_PASSWORD},
             "cache": {"store": "redis", "redis_url": f"redis://:{URL_PASSWORDS[0]}@127.0.0.1:2/0"},
             "subscriptions": {"redis_url": f"redis://gw:{URL_PASSWORDS[1]}@127.0.0.1:3/0"},
             "rate_limits": [{"rate": "10/s"}]}
    app = build_app(load_settings(None, **data))
    try:
        held = _reachable(app)
        kinds = {type(o).__name__ for o in held}
        assert {"RedisStore", "RedisBus", "Sealer", "JwtVerifier", "BackendCredentials", "ReplicaContext"} <= kinds
        for obj in held:
            if not isinstance(obj, (str, bytes, dict, list, tuple, set, frozenset)):
                shown = repr(obj)
                assert_nothing_secret(shown)
    finally:
        await app.runtime.aclose()


def test_secrets_given_by_environment_variables_never_show_in_check_config(tmp_path):
    """Per-key variables carrying secrets (a backend's client secret and headers, the HMAC key,
    a Redis URL with its password), valid and broken: named, never echoed."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"backends": [{
        "name": "a", "url": "http://127.0.0.1:1/mcp",
        "auth": {"type": "oauth_client_credentials", "token_url": "http://127.0.0.1:1/t", "client_id": "c",
                 "client_secret": "placeholder"}}]}))
    base = {"PATH": "/usr/bin:/bin", "MCP_GATEWAY_BACKENDS__0__AUTH__CLIENT_SECRET": CLIENT_SECRET,
            "MCP_GATEWAY_SECURITY__SECRET": SECURITY_SECRET}
    runs = [
        ({}, 0, ""),
        ({"MCP_GATEWAY_BACKENDS__0__HEADERS": f'{{"x-api-key": "{HEADER_SECRET}"'}, 1, "MCP_GATEWAY_BACKENDS__0__HEADERS"),
        ({"MCP_GATEWAY_BACKENDS__0__HEADERS": f'["{HEADER_SECRET}"]'}, 1, "backends.0.headers"),
        ({"MCP_GATEWAY_REDIS__URL": f"redis://:{URL_PASSWORDS[2]}@127.0.0.1:1/0?x=1"}, 1, "redis"),
        ({"MCP_GATEWAY_AUTH__MODE": "jwt", "MCP_GATEWAY_AUTH__ISSUER": "https://i", "MCP_GATEWAY_AUTH__AUDIENCE":
          "https://a/mcp", "MCP_GATEWAY_AUTH__AUTHORIZATION_SERVERS": '["https://i"]',
          "MCP_GATEWAY_AUTH__HS256_SECRET": "short-" + HS256_SECRET[:8]}, 1, "auth"),
    ]
    for extra, code, named in runs:
        run = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], capture_output=True,
                             text=True, timeout=60, env={**base, **extra}, check=False)
        out = run.stdout + run.stderr
        assert run.returncode == code and named in out, out
        assert_nothing_secret(out, "short-" + HS256_SECRET[:8])


def test_credentials_written_into_a_backend_or_token_url_are_refused_and_never_echoed(tmp_path):
    """A password in a backend's URL would never be sent (the upstream client reads host and
    port) and its origin names the endpoint in logs and /metrics labels: check-config refuses
    it, and no URL error (a bad scheme, say) echoes a password."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"backends": [
        {"name": "a", "url": f"http://bob:{HEADER_SECRET}@127.0.0.1:1/mcp"},
        {"name": "b", "url": f"ftp://bob:{CLIENT_SECRET}@127.0.0.1:1/mcp"},
        {"name": "c", "url": "http://127.0.0.1:1/mcp",
         "auth": {"type": "oauth_client_credentials", "token_url": f"ftp://c:{SECURITY_SECRET}@h/t",
                  "client_id": "c", "client_secret": "s"}},
        {"name": "d", "era": "modern", "urls": ["http://127.0.0.1:1/mcp", f"http://x:{TLS_PASSWORD}@127.0.0.1:2/mcp"]},
    ]}))
    run = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    for field in ("backends.0.url", "backends.1.url", "backends.2.auth.token_url", "backends.3.urls"):
        assert field in out, out
    assert out.count("carries credentials") == 2 and "bob:***@" in out
    assert_nothing_secret(out)
