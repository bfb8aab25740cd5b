"""gateway/config_env.py: `MCP_GATEWAY_*` variables that name no setting are refused by name,
and `MCP_GATEWAY_BACKENDS__<index>__<KEY>` sets one key of one backend of the file."""

from __future__ import annotations

import os

import pytest

from gateway.settings import ConfigError, load_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for key in list(os.environ):
        if key.startswith("MCP_GATEWAY_"):
            monkeypatch.delenv(key)



def env_problems(monkeypatch, variables: dict[str, str], path=None) -> dict[str, str]:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return dict(info.value.problems)


@pytest.mark.parametrize(("variable", "words"), [
    ("MCP_GATEWAY_CAHCE__STORE", "no 'cahce'"),
    ("MCP_GATEWAY_SERVER__PROT", "no 'prot' under server"),
    ("MCP_GATEWAY_CACHE__REDIS_URL__HOST", "no 'host' under cache.redis_url"),
    ("MCP_GATEWAY_SERVER___PORT", "no '_port' under server"),
    ("MCP_GATEWAY_BACKENDS__TIMEOUT_SECONDS", "MCP_GATEWAY_BACKENDS__<index>__<KEY>"),
    ("MCP_GATEWAY_BACKENDS__0__TIMEOUT", "no 'timeout' under backends.0"),
])
def test_an_unknown_variable_is_an_error_that_names_it(monkeypatch, variable, words):
    found = env_problems(monkeypatch, {variable: "1"})
    assert variable in found, found
    assert words in found[variable]


def test_known_variables_pass(monkeypatch):
    monkeypatch.setenv("MCP_GATEWAY_SERVER__OPS_PORT", "9090")
    monkeypatch.setenv("MCP_GATEWAY_CONFIG", "/not/read/by/load_settings")
    assert load_settings(None).server.ops_port == 9090


def test_a_per_key_backend_override_changes_that_backend_only(tmp_path, monkeypatch):
    config = tmp_path / "g.yaml"
    config.write_text("backends:\n  - {name: a, url: 'http://h/mcp'}\n  - {name: b, url: 'http://g/mcp'}\n")
    monkeypatch.setenv("MCP_GATEWAY_BACKENDS__1__TIMEOUT_SECONDS", "5")
    monkeypatch.setenv("MCP_GATEWAY_BACKENDS__1__HEADERS", '{"x-api-key": "k"}')
    monkeypatch.setenv("MCP_GATEWAY_BACKENDS__0__HEADERS__X-TENANT", "t1")
    settings = load_settings(config)
    assert [b.name for b in settings.backends] == ["a", "b"]  # the file's list stands
    assert settings.backends[1].timeout_seconds == 5.0 and settings.backends[0].timeout_seconds == 60.0
    assert {k: v.get_secret_value() for k, v in settings.backends[1].headers.items()} == {"x-api-key": "k"}
    assert {k: v.get_secret_value() for k, v in settings.backends[0].headers.items()} == {"x-tenant": "t1"}


def test_a_per_key_override_of_a_backend_the_file_lacks_says_which_form_to_use(tmp_path, monkeypatch):
    config = tmp_path / "g.yaml"
    config.write_text("backends:\n  - {name: a, url: 'http://h/mcp'}\n")
    found = env_problems(monkeypatch, {"MCP_GATEWAY_BACKENDS__3__TIMEOUT_SECONDS": "5"}, config)
    message = found["MCP_GATEWAY_BACKENDS__3__TIMEOUT_SECONDS"]
    assert "no backends.3" in message and "MCP_GATEWAY_BACKENDS as JSON" in message


def test_a_bad_per_key_value_is_reported_at_the_backend_field(tmp_path, monkeypatch):
    config = tmp_path / "g.yaml"
    config.write_text("backends:\n  - {name: a, url: 'http://h/mcp'}\n")
    monkeypatch.setenv("MCP_GATEWAY_BACKENDS__0__TIMEOUT_SECONDS", "-1")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert "backends.0.timeout_seconds" in dict(info.value.problems)


def test_an_empty_backend_list_from_the_environment_is_an_error(monkeypatch):
    found = env_problems(monkeypatch, {"MCP_GATEWAY_BACKENDS": "[]"})
    assert "backends" in found


def test_an_absent_backends_section_is_the_demo(monkeypatch):
    assert load_settings(None).backends == ()


@pytest.mark.parametrize(("value", "expected"), [("any", "any"), ("all", "all"), ("none", "none"), ("2", 2)])
def test_readiness_requirement_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("MCP_GATEWAY_SERVER__READINESS", value)
    assert load_settings(None).server.readiness == expected


@pytest.mark.parametrize(("variable", "list_path", "whole"), [
    ("MCP_GATEWAY_RATE_LIMITS__0__RATE", "rate_limits", "MCP_GATEWAY_RATE_LIMITS"),
    ("MCP_GATEWAY_AUTHORIZATION__RULES__0__EFFECT", "authorization.rules", "MCP_GATEWAY_AUTHORIZATION__RULES"),
    ("MCP_GATEWAY_SERVER__ALLOWED_HOSTS__0", "server.allowed_hosts", "MCP_GATEWAY_SERVER__ALLOWED_HOSTS"),
    ("MCP_GATEWAY_BACKENDS__0__ROOTS__0__URI", "backends.0.roots", "MCP_GATEWAY_BACKENDS__0__ROOTS"),
])
def test_an_entry_of_a_list_other_than_backends_is_refused_naming_the_whole_form(
        tmp_path, monkeypatch, variable, list_path, whole):
    # Only a backend of the file takes one key by index; any other indexed list entry used to
    # replace the whole list and fail as "Input should be a valid tuple", naming no variable.
    path = tmp_path / "gateway.yaml"
    path.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:9/mcp'}\nrate_limits:\n  - {rate: 10/s}\n")
    problems = env_problems(monkeypatch, {variable: "x"}, path)
    assert f"{list_path} is a list" in problems[variable] and whole in problems[variable]


def test_a_list_set_whole_from_the_environment_still_works(tmp_path, monkeypatch):
    path = tmp_path / "gateway.yaml"
    path.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:9/mcp'}\n")
    monkeypatch.setenv("MCP_GATEWAY_RATE_LIMITS", '[{"rate": "5/s"}]')
    monkeypatch.setenv("MCP_GATEWAY_BACKENDS__0__ROOTS", '[{"uri": "file:///srv"}]')
    settings = load_settings(path)
    assert settings.rate_limits[0].rate == "5/s" and settings.backends[0].roots[0].uri == "file:///srv"
