"""gateway/settings.py: YAML + environment into frozen settings, errors that name the field,
and the golden snapshots of every example config (a schema change shows up as a diff).

Regenerate the snapshots after an intended change with:
    UPDATE_GOLDEN=1 /work/.venv/bin/python -m pytest tests/unit/test_settings.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import ConfigError, GatewaySettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "config").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for key in list(os.environ):
        if key.startswith("MCP_GATEWAY_"):
            monkeypatch.delenv(key)


def normalized(settings: GatewaySettings) -> str:
    return json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


# -- golden example configs ----------------------------------------------------------------


def test_the_documented_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"single-backend.yaml", "fleet.yaml", "sidecar.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_matches_its_golden_snapshot(path, monkeypatch):
    # The secrets the examples read from the environment (their comments say which).
    monkeypatch.setenv("REDIS_PASSWORD", "example-only")
    actual = normalized(load_settings(path))
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(actual)
    assert golden.exists(), f"no snapshot for {path.name}; run with UPDATE_GOLDEN=1 to create it"
    assert actual == golden.read_text(), (
        f"{path.name} normalizes differently from {golden.name}; if the change is intended, "
        "regenerate with UPDATE_GOLDEN=1"
    )


def test_fleet_example_compiles_the_prefixes_it_documents():
    settings = load_settings(ROOT / "config" / "fleet.yaml")
    assert [settings.prefix_of(b) for b in settings.backends] == ["weather__", "fs.", "search__"]


def test_single_backend_names_pass_unchanged():
    settings = load_settings(ROOT / "config" / "single-backend.yaml")
    assert settings.prefix_of(settings.backends[0]) == ""
    assert settings.server.bound_to_loopback


# -- sources and overrides -----------------------------------------------------------------


def test_defaults_without_a_file():
    settings = load_settings(None)
    assert settings.server.host == "127.0.0.1" and settings.server.port == 8080 and settings.server.path == "/mcp"
    assert settings.backends == ()


def test_environment_overrides_the_file_key_by_key(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("server: {host: 127.0.0.1, port: 9000}\nbackends: [{name: a, url: 'http://127.0.0.1:1/mcp'}]\n")
    monkeypatch.setenv("MCP_GATEWAY_SERVER__PORT", "9100")
    monkeypatch.setenv("MCP_GATEWAY_CACHE__STORE", "none")
    settings = load_settings(config)
    assert settings.server.port == 9100
    assert settings.server.host == "127.0.0.1"  # the rest of the file's section stays
    assert settings.cache.store == "none"
    assert [b.name for b in settings.backends] == ["a"]


def test_backends_from_the_environment(monkeypatch):
    monkeypatch.setenv("MCP_GATEWAY_BACKENDS", '[{"name": "env", "url": "http://127.0.0.1:9/mcp"}]')
    assert [b.name for b in load_settings(None).backends] == ["env"]


def test_settings_are_frozen():
    settings = load_settings(None)
    with pytest.raises(ValidationError):
        settings.server.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                                ("0.0.0.0", False), ("10.1.2.3", False), ("gw.example", False)])
def test_bound_to_loopback(host, loopback):
    assert load_settings(None, server={"host": host}).server.bound_to_loopback is loopback


def test_prefix_defaults():
    one = load_settings(None, backends=[{"name": "a", "url": "http://127.0.0.1:1/mcp"}])
    assert one.prefix_of(one.backends[0]) == ""
    two = load_settings(None, backends=[{"name": "a", "url": "http://127.0.0.1:1/mcp"},
                                        {"name": "b", "url": "http://127.0.0.1:2/mcp", "prefix": "bee."}])
    assert [two.prefix_of(b) for b in two.backends] == ["a__", "bee."]


def test_allowed_origins_are_normalized():
    settings = load_settings(None, server={"allowed_origins": ["https://App.Example.com/"]})
    assert settings.server.allowed_origins == ("https://app.example.com",)


# -- errors name the field -----------------------------------------------------------------


def problems(**data) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_settings(None, **data)
    return dict(info.value.problems)


def test_every_bad_field_is_reported_with_its_path():
    found = problems(
        server={"port": 70000, "path": "mcp", "allowed_origins": ["not an origin"]},
        backends=[{"name": "Bad Name", "url": "http://127.0.0.1:1/mcp"}, {"name": "b", "url": "ftp://x"}],
        cache={"store": "disk"},
    )
    assert {"server.port", "server.path", "server.allowed_origins", "backends.0.name", "backends.1.url",
            "cache.store"} <= found.keys()
    assert "ftp://x" in found["backends.1.url"]


@pytest.mark.parametrize(
    ("data", "path", "words"),
    [
        ({"backends": [{"name": "a"}]}, "backends.0.url", "exactly one of 'url'"),
        ({"backends": [{"name": "a", "url": "http://h/mcp", "command": ["x"]}]}, "backends.0.url", "exactly one"),
        ({"backends": [{"name": "a", "command": []}]}, "backends.0.command", "non-empty"),
        # Cross-field rules name the field to fix, not the section (or the root).
        ({"backends": [{"name": "a", "url": "http://h/mcp"}, {"name": "a", "url": "http://g/mcp"}]},
         "backends.1.name", "unique"),
        ({"backends": [{"name": "a", "url": "http://h/mcp", "prefix": "x"},
                       {"name": "b", "url": "http://g/mcp", "prefix": "xy"}]}, "backends.1.prefix", "overlapping"),
        ({"backends": [{"name": "a", "command": ["x"], "transport": "sse"}]}, "backends.0.transport", "url"),
        ({"backends": [{"name": "a", "url": "http://h/mcp"}], "cache": {"rules": [{"backend": "zz"}]}},
         "cache.rules.0.backend", "'zz'"),
        ({"cache": {"min_ttl_ms": 5, "max_ttl_ms": 1}}, "cache.min_ttl_ms", "above"),
        ({"cache": {"rules": [{"min_ttl_ms": 9, "max_ttl_ms": 1}]}}, "cache.rules.0.min_ttl_ms", "above"),
        ({"server": {"path": "/sse"}}, "server.legacy_sse_path", "differ"),
        ({"server": {"port": 8080, "ops_port": 8080}}, "server.ops_port", "port of its own"),
        ({"server": {"readiness": "most"}}, "server.readiness", ""),
        ({"server": {"readiness": 0}}, "server.readiness", ""),
        # Only an absent section means the demo backend.
        ({"backends": []}, "backends", "remove the section"),
        ({"backends": [{"name": "a", "url": "http://h/mcp", "retries": 9}]}, "backends.0.retries", ""),
        ({"backends": [{"name": "a", "url": "http://h/mcp", "timeout_seconds": 0}]}, "backends.0.timeout_seconds",
         ""),
        ({"server": {"unknown_key": 1}}, "server.unknown_key", ""),
        ({"typo_section": {}}, "typo_section", ""),
        # Removed: the gateway forwards no caller identity, so one upstream listen per
        # (backend, filter) is exact (docs/subscriptions.md "Upstream listens").
        ({"backends": [{"name": "a", "url": "http://h/mcp"}], "subscriptions": {"principal_scoped_backends": ["a"]}},
         "subscriptions.principal_scoped_backends", ""),
    ],
)
def test_specific_problems(data, path, words):
    found = problems(**data)
    assert path in found, found
    assert words in found[path]


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "missing.yaml")
    assert info.value.problems[0][0] == "<file>"
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_settings(bad)
    assert "not valid YAML" in info.value.problems[0][1]
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError) as info:
        load_settings(scalar)
    assert "mapping" in info.value.problems[0][1]


def test_a_section_variable_that_is_not_json_is_a_config_error(monkeypatch):
    # e.g. a tool that exports MCP_GATEWAY_CACHE=/some/dir: say which variable, no traceback.
    monkeypatch.setenv("MCP_GATEWAY_CACHE", "/tmp/somewhere")
    with pytest.raises(ConfigError) as err:
        load_settings(None)
    assert err.value.problems[0][0] == "<environment>"
    assert "cache" in err.value.problems[0][1]


# -- backend transport ---------------------------------------------------------------------


def test_transport_sse_is_initialize_era_and_http_only():
    assert GatewaySettings(backends=[{"name": "old", "url": "http://127.0.0.1:1/sse", "transport": "sse"}])
    with pytest.raises(ConfigError) as modern:
        load_settings(None, backends=[{"name": "old", "url": "http://127.0.0.1:1/sse", "transport": "sse",
                                       "era": "modern"}])
    assert "initialize-era" in str(modern.value)
    with pytest.raises(ConfigError) as stdio:
        load_settings(None, backends=[{"name": "old", "command": ["x"], "transport": "sse"}])
    assert "'url' backends only" in str(stdio.value)


def test_the_http_sse_paths_must_not_shadow_the_endpoint():
    assert load_settings(None, server={"legacy_sse_path": None}).server.legacy_sse_path is None
    assert load_settings(None, server={"legacy_sse_path": "/events/"}).server.legacy_sse_path == "/events"
    for clash in ("/mcp", "/mcp/"):
        with pytest.raises(ConfigError) as info:
            load_settings(None, server={"path": "/mcp/messages", "legacy_sse_path": clash})
        assert "legacy_sse_path" in str(info.value)



def test_pin_off_written_bare_in_yaml_is_off(tmp_path):
    # YAML 1.1 reads `pin: off` as false; the README writes it so.
    path = tmp_path / "gateway.yaml"
    path.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:9/mcp', pin: off}\n"
                    "  - {name: b, url: 'http://127.0.0.1:9/mcp', pin: block}\n")
    settings = load_settings(path)
    assert [b.pin for b in settings.backends] == ["off", "block"]
    with pytest.raises(ConfigError, match=r"backends\.0\.pin"):
        load_settings(None, backends=[{"name": "a", "url": "http://127.0.0.1:9/mcp", "pin": True}])


def test_several_endpoints_serve_streamable_http_of_either_era_but_not_http_sse() -> None:
    urls = ["http://127.0.0.1:1/mcp", "http://127.0.0.1:2/mcp"]
    for era in ("modern", "legacy", "auto"):
        backend = load_settings(None, backends=[{"name": "a", "urls": urls, "era": era}]).backends[0]
        assert backend.endpoint_urls == tuple(urls)
    with pytest.raises(ConfigError, match="HTTP\\+SSE session is one GET stream"):
        load_settings(None, backends=[{"name": "a", "urls": urls, "transport": "sse"}])


def test_resolve_applies_to_url_backends_of_streamable_http() -> None:
    backend = load_settings(None, backends=[{"name": "a", "url": "http://svc.ns:80/mcp",
                                             "resolve": {"interval_seconds": 5}}]).backends[0]
    assert backend.resolve is not None and backend.resolve.interval_seconds == 5
    with pytest.raises(ConfigError, match="applies to 'url' backends only"):
        load_settings(None, backends=[{"name": "a", "command": ["x"], "resolve": {}}])
    with pytest.raises(ConfigError, match="HTTP\\+SSE session is one GET stream"):
        load_settings(None, backends=[{"name": "a", "url": "http://svc.ns:80/sse", "transport": "sse",
                                       "resolve": {}}])
    with pytest.raises(ConfigError):
        load_settings(None, backends=[{"name": "a", "url": "http://svc.ns:80/mcp", "resolve": {"interval_seconds": 0}}])
