"""gateway/redis_client/plan.py through the settings model: every shape's URL and explicit
forms, the refusals (each names what is wrong, never a secret), secrets from the environment
or a file, and that no repr, error or check-config output shows a password."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gateway.redis_client.plan import plan_of
from gateway.settings import ConfigError, GatewaySettings, RedisSettings, load_settings


def plan(**fields):
    return plan_of(RedisSettings(**fields))


@pytest.mark.parametrize(("fields", "shape", "hosts", "extra"), [
    ({}, "standalone", (("127.0.0.1", 6379),), {"db": 0, "tls": False}),
    ({"url": "redis://cache.svc:6380/3"}, "standalone", (("cache.svc", 6380),), {"db": 3}),
    ({"url": "redis://cache.svc?db=2"}, "standalone", (("cache.svc", 6379),), {"db": 2}),
    ({"url": "rediss://cache.svc"}, "standalone", (("cache.svc", 6379),), {"tls": True}),
    ({"url": "redis://[::1]:7000/0"}, "standalone", (("::1", 7000),), {}),
    ({"url": "unix:///run/redis.sock?db=4"}, "standalone", (), {"unix_path": "/run/redis.sock", "db": 4}),
    ({"url": "redis+sentinel://s1:26379,s2,s3:26380/gw/2"}, "sentinel",
     (("s1", 26379), ("s2", 26379), ("s3", 26380)), {"service_name": "gw", "db": 2}),
    ({"url": "rediss+sentinel://s1/gw"}, "sentinel", (("s1", 26379),), {"tls": True, "db": 0}),
    ({"sentinels": ["s1:26379", "s2"], "service_name": "gw", "db": 1}, "sentinel",
     (("s1", 26379), ("s2", 26379)), {"service_name": "gw", "db": 1}),
    ({"url": "redis+cluster://n1:7000,n2:7001"}, "cluster", (("n1", 7000), ("n2", 7001)), {"db": 0}),
    ({"cluster": True, "nodes": ["n1:7000"]}, "cluster", (("n1", 7000),), {}),
    ({"cluster": True, "url": "rediss+cluster://n1"}, "cluster", (("n1", 6379),), {"tls": True}),
])
def test_every_shape_from_a_url_or_explicit_fields(fields, shape, hosts, extra):
    p = plan(**fields)
    assert (p.shape, p.hosts) == (shape, hosts)
    for name, value in extra.items():
        assert getattr(p, name) == value, name


@pytest.mark.parametrize(("fields", "message"), [
    ({"url": "http://cache.svc"}, "the scheme must be one of"),
    ({"url": "redis://a,b"}, "one host only"),
    ({"url": "redis://cache.svc/zero"}, "database number"),
    ({"url": "redis://cache.svc:99999"}, "port must be a number"),
    ({"url": "redis://cache.svc?timeout=3"}, "unsupported query parameter"),
    ({"url": "redis+sentinel://s1:26379"}, "/service_name"),
    ({"url": "redis+cluster://n1/3"}, "only database 0"),
    ({"cluster": True, "nodes": ["n1"], "db": 2}, "only database 0"),
    ({"sentinels": ["s1"]}, "need service_name"),
    ({"sentinels": ["s1"], "service_name": "gw", "cluster": True}, "exclude each other"),
    ({"url": "redis://x", "sentinels": ["s1"], "service_name": "gw"}, "not both"),
    ({"url": "redis://x", "service_name": "gw"}, "applies to Sentinel"),
    ({"url": "redis+sentinel://s1/gw", "service_name": "other"}, "differs from the one in the url"),
    ({"cluster": True}, "needs seed nodes"),
    ({"cluster": True, "url": "redis://x"}, "needs redis+cluster://"),
    ({"url": "redis://x/1", "db": 2}, "db differs"),
    ({"url": "rediss://x", "tls": False}, "contradicts"),
    ({"ca_file": "/etc/ssl/certs/ca-certificates.crt"}, "needs TLS"),
    ({"url": "rediss://x", "ca_file": "/nonexistent/ca.pem"}, "cannot read /nonexistent/ca.pem"),
    ({"url": "rediss://x", "cert_file": __file__}, "go together"),
    ({"url": "redis://x", "sentinel_password": "p"}, "Sentinel only"),
    ({"url": "redis://u:p@x", "password": "q"}, "both in the url and as a field"),
    ({"password": {"env": "I22A_SURELY_UNSET"}}, "environment variable I22A_SURELY_UNSET is not set"),
    ({"password": {"file": "/nonexistent/pw"}}, "cannot read /nonexistent/pw"),
    ({"password": {"env": "A", "file": "/b"}}, "exactly one of"),
])
def test_what_cannot_work_is_refused_with_the_reason(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RedisSettings(**fields)


def test_a_password_from_the_environment_or_a_file_is_resolved(monkeypatch, tmp_path):
    monkeypatch.setenv("I22A_REDIS_PW", "from-env")
    assert plan(password={"env": "I22A_REDIS_PW"}).password == "from-env"
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")  # a trailing newline, as `echo` and Kubernetes secrets leave
    assert plan(password={"file": str(secret)}, username="gw").password == "from-file"
    assert plan(url="redis://gw:in%40url@x/0").password == "in@url"
    assert plan(url="redis+sentinel://s1/gw", sentinel_password={"env": "I22A_REDIS_PW"}).sentinel_password \
        == "from-env"


def test_no_password_in_repr_or_description(monkeypatch):
    monkeypatch.setenv("I22A_REDIS_PW", "hunter2-env")
    settings = GatewaySettings(redis={"url": "redis://gw:hunter2-url@x/0"},
                               cache={"store": "redis", "redis": {"url": "redis+sentinel://s1/gw",
                                                                  "password": {"env": "I22A_REDIS_PW"}}})
    for shown in (repr(settings), str(settings), repr(plan_of(settings.redis)), plan_of(settings.redis).describe(),
                  repr(plan_of(settings.cache_redis()))):
        assert "hunter2" not in shown, shown
    assert plan_of(settings.redis).describe() == "redis://gw:***@x:6379/0"
    assert plan_of(settings.cache_redis()).describe() == "redis+sentinel://:***@s1:26379/gw/0"
    for where in ({"redis": {"url": "redis://gw:hunter2@x/zero"}},
                  {"cache": {"redis_url": "redis://gw:hunter2@x/zero"}},
                  {"subscriptions": {"redis_url": "redis://gw:hunter2@x/zero"}},
                  {"redis": {"url": "redis://x/0", "password": "hunter2", "cluster": True}}):
        with pytest.raises(ValueError) as refused:
            GatewaySettings(**where)
        assert "hunter2" not in str(refused.value)


def test_sections_share_the_block_unless_they_name_their_own():
    shared = {"url": "redis+cluster://n1:7000"}
    s = GatewaySettings(redis=shared, cache={"store": "redis"})
    assert plan_of(s.cache_redis()).shape == plan_of(s.bus_redis()).shape == "cluster"
    # A section's own Redis, long or short form.
    s = GatewaySettings(redis=shared, cache={"store": "redis", "redis_url": "redis://c:6379/1"},
                        subscriptions={"redis": {"url": "redis+sentinel://s/gw"}})
    assert plan_of(s.cache_redis()).describe() == "redis://c:6379/1"
    assert plan_of(s.bus_redis()).shape == "sentinel"
    # The listen bus: the block when it is set, the cache's Redis when the cache uses one,
    # otherwise none (each replica alone), as before the block existed.
    assert GatewaySettings(redis=shared).bus_redis() is not None
    assert GatewaySettings(cache={"store": "redis", "redis_url": "redis://c/0"}).bus_redis() == \
        RedisSettings(url="redis://c/0")
    assert GatewaySettings().bus_redis() is None
    with pytest.raises(ValueError, match="not both"):
        GatewaySettings(cache={"redis": {"url": "redis://a"}, "redis_url": "redis://b"})


def test_the_environment_sets_the_shared_block(monkeypatch):
    monkeypatch.setenv("MCP_GATEWAY_REDIS__URL", "redis+sentinel://s1,s2/gw/0")
    monkeypatch.setenv("MCP_GATEWAY_REDIS__PASSWORD", "env-pw")
    s = load_settings(None)
    p = plan_of(s.redis)
    assert (p.shape, p.service_name, p.password) == ("sentinel", "gw", "env-pw")


def test_errors_name_the_field_path():
    with pytest.raises(ConfigError) as refused:
        load_settings(None, cache={"redis_url": "redis+sentinel://s1"})
    [(where, message)] = refused.value.problems
    assert where == "cache" and "/service_name" in message


def test_check_config_refuses_a_redis_it_could_not_use_without_showing_secrets(tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("redis:\n  url: redis+sentinel://:hunter2@s1:26379\n")
    run = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "redis" in run.stdout + run.stderr and "/service_name" in run.stdout + run.stderr
    assert "hunter2" not in run.stdout + run.stderr
    config.write_text("redis:\n  url: redis+sentinel://s1:26379/gw/0\n  password: {env: I22A_SURELY_UNSET}\n")
    run = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "I22A_SURELY_UNSET is not set" in run.stdout + run.stderr
