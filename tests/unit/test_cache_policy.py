"""Freshness and scope rules (gateway/cache/policy.py) and their settings."""

from __future__ import annotations

import pytest

from gateway.cache.policy import CachePolicy, Decision, with_hints
from gateway.settings import CacheSettings, ConfigError, load_settings


def result(**fields):
    return {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "complete", "tools": [], **fields}}


def decide(settings: CacheSettings, message, backend="alpha", method="tools/list"):
    return CachePolicy(settings).decide(backend, method, message)


def test_backend_ttl_is_applied_within_bounds():
    s = CacheSettings(min_ttl_ms=1_000, max_ttl_ms=10_000)
    assert decide(s, result(ttlMs=5_000, cacheScope="public")) == Decision(True, 5_000, "public")
    assert decide(s, result(ttlMs=50, cacheScope="public")) == Decision(True, 1_000, "public")
    assert decide(s, result(ttlMs=99_000, cacheScope="public")) == Decision(True, 10_000, "public")


@pytest.mark.parametrize("ttl", [0, -5, 0.0])
def test_zero_or_negative_ttl_is_never_stored_even_with_a_minimum(ttl):
    s = CacheSettings(min_ttl_ms=5_000)
    assert decide(s, result(ttlMs=ttl, cacheScope="public")) == Decision(False, 0, "public")


def test_absent_ttl_uses_the_configured_default_and_is_otherwise_zero():
    assert decide(CacheSettings(), result(cacheScope="public")) == Decision(False, 0, "public")
    assert decide(CacheSettings(default_ttl_ms=2_000), result(cacheScope="public")) == Decision(
        True, 2_000, "public"
    )


@pytest.mark.parametrize("scope", [None, "private", "PUBLIC", 3])
def test_anything_but_public_is_private(scope):
    fields = {"ttlMs": 1_000} if scope is None else {"ttlMs": 1_000, "cacheScope": scope}
    assert decide(CacheSettings(), result(**fields)).scope == "private"


def test_input_required_and_plain_errors_carry_no_decision():
    s = CacheSettings(negative_ttl_ms=0)
    assert (
        decide(
            s,
            {"id": 1, "result": {"resultType": "input_required", "inputRequests": {}}},
            method="resources/read",
        )
        is None
    )
    assert decide(s, {"id": 1, "error": {"code": -32602, "message": "no"}}) is None
    assert decide(s, {"id": 1, "error": {"code": -32601, "message": "no"}}) is None


def test_method_not_found_is_remembered_only_when_configured():
    s = CacheSettings(negative_ttl_ms=3_000)
    # Private: an error says no cacheScope, so it is reused for its own principal only.
    assert decide(s, {"id": 1, "error": {"code": -32601, "message": "no"}}) == Decision(
        True, 3_000, "private", True
    )
    assert decide(s, {"id": 1, "error": {"code": -32603, "message": "boom"}}) is None


def test_the_most_specific_rule_wins_field_by_field():
    s = CacheSettings(
        max_ttl_ms=60_000,
        rules=[
            {"backend": "alpha", "method": "resources/read", "max_ttl_ms": 1_000},
            {"method": "resources/read", "max_ttl_ms": 5_000, "min_ttl_ms": 500},
            {"backend": "alpha", "force_private": True},
            {"backend": "beta", "enabled": False},
        ],
    )
    policy = CachePolicy(s)
    alpha_read = policy.freshness("alpha", "resources/read")
    assert (alpha_read.max_ttl_ms, alpha_read.min_ttl_ms, alpha_read.force_private) == (1_000, 500, True)
    assert policy.freshness("gamma", "resources/read").max_ttl_ms == 5_000
    assert policy.freshness("gamma", "tools/list").max_ttl_ms == 60_000
    assert policy.decide("alpha", "tools/list", result(ttlMs=9_000, cacheScope="public")) == Decision(
        True, 9_000, "private"
    )
    assert policy.decide("beta", "tools/list", result(ttlMs=9_000, cacheScope="public")).store is False


def test_with_hints_readdresses_and_rewrites_only_the_hints():
    original = result(ttlMs=60_000, cacheScope="public")
    answered = with_hints(original, 42, 1_234, "private")
    assert answered["id"] == 42
    assert answered["result"]["ttlMs"] == 1_234 and answered["result"]["cacheScope"] == "private"
    assert answered["result"]["tools"] is original["result"]["tools"]
    assert original["result"]["ttlMs"] == 60_000 and original["id"] == 1  # never mutated


def test_settings_reject_inverted_bounds_and_unknown_rule_backends():
    with pytest.raises(ConfigError) as exc:
        load_settings(None, cache={"min_ttl_ms": 10, "max_ttl_ms": 5})
    assert "min_ttl_ms" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_settings(
            None,
            cache={"rules": [{"backend": "alpha", "min_ttl_ms": 90_000_000}]},
            backends=[{"name": "alpha", "url": "http://127.0.0.1:1/mcp"}],
        )
    assert "rules.0" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_settings(
            None,
            cache={"rules": [{"backend": "nope"}]},
            backends=[{"name": "alpha", "url": "http://127.0.0.1:1/mcp"}],
        )
    assert "nope" in str(exc.value)
