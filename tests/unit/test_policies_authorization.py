"""The compiled rule set: first match wins, the default, claims and scopes, the scope hint,
check-config's refusals, and a hypothesis fuzz that compares it with a plain reading of the
rules."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import asgi
from gateway.policies.authorization import Authorization, PrefixResolver, RuleSet, glob_literal_prefix
from gateway.protocol.principal import Principal
from gateway.settings import ConfigError, load_settings

BACKENDS = [{"name": "ledger", "url": "http://127.0.0.1:1/mcp"}, {"name": "github", "url": "http://127.0.0.1:2/mcp"}]


def rules_of(section: dict[str, Any], **extra: Any) -> RuleSet | None:
    config = {"backends": BACKENDS, "authorization": section, **extra}
    return RuleSet.from_settings(load_settings(None, **config))


def jwt_auth(claims: tuple[str, ...] = ("groups",)) -> dict[str, Any]:
    return {"mode": "jwt", "issuer": "https://idp.test", "audience": "https://mcp.test/mcp",
            "hs256_secret": "x" * 32, "authorization_servers": ["https://idp.test"], "claims": list(claims)}


def who(groups: Any = None, scopes: tuple[str, ...] = ()) -> Principal:
    return Principal("s", "https://idp.test", authenticated=True, scopes=frozenset(scopes),
                     claims={"groups": groups} if groups is not None else {})


def test_first_match_wins_and_the_default_decides_the_rest():
    rs = rules_of({"default": "deny", "rules": [
        {"effect": "deny", "names": ["*__delete_*"]},
        {"effect": "allow", "backends": ["ledger"]},
    ]}, auth=jwt_auth())
    assert rs.decide(who(), "tools/call", name="ledger__get", backend="ledger").rule == "rules.1"
    denied = rs.decide(who(), "tools/call", name="ledger__delete_all", backend="ledger")
    assert not denied.allowed and denied.rule == "rules.0"
    assert rs.decide(who(), "tools/call", name="github__get", backend="github") == rs.default


def test_claims_match_a_string_or_a_list_and_scopes_are_all_required():
    rs = rules_of({"default": "deny", "rules": [
        {"effect": "allow", "names": ["ledger__*"], "when": {"claims": {"groups": ["finance", "audit"]},
                                                          "scopes": ["ledger.read", "ledger.list"]}}]},
                  auth=jwt_auth())
    both = ("ledger.read", "ledger.list")
    assert rs.allows(who("finance", both), "tools/call", name="ledger__x")
    assert rs.allows(who(["staff", "audit"], both), "tools/call", name="ledger__x")
    assert not rs.allows(who("engineering", both), "tools/call", name="ledger__x")
    assert not rs.allows(who(None, both), "tools/call", name="ledger__x")
    hinted = rs.decide(who("finance", ("ledger.read",)), "tools/call", name="ledger__x")
    assert not hinted.allowed and hinted.missing_scopes == ("ledger.list",)
    # Not a member: a scope would not help, so none is hinted.
    assert rs.decide(who("engineering"), "tools/call", name="ledger__x").missing_scopes == ()


def test_a_rule_about_a_list_is_about_the_use_of_its_items():
    rs = rules_of({"default": "deny", "rules": [{"effect": "allow", "methods": ["tools/list"], "names": ["a*"]}]})
    assert rs.allows(who(), "tools/call", name="abc")
    assert not rs.allows(who(), "prompts/get", name="abc")


def test_uris_and_names_are_separate_targets():
    rs = rules_of({"default": "allow", "rules": [{"effect": "deny", "uris": ["file:///secret/*"]}]})
    assert not rs.allows(who(), "resources/read", uri="file:///secret/key")
    assert rs.allows(who(), "resources/read", uri="file:///public/key")
    assert rs.allows(who(), "tools/call", name="file:///secret/key")  # a name is not a URI


def test_the_fingerprint_follows_the_rules():
    one = rules_of({"default": "deny", "rules": [{"effect": "allow", "names": ["a*"]}]})
    same = rules_of({"default": "deny", "rules": [{"effect": "allow", "names": ["a*"]}]})
    other = rules_of({"default": "deny", "rules": [{"effect": "allow", "names": ["b*"]}]})
    assert one.fingerprint == same.fingerprint != other.fingerprint


def test_no_section_compiles_to_nothing():
    assert RuleSet.from_settings(load_settings(None, backends=BACKENDS)) is None


@pytest.mark.parametrize(("rule", "problem"), [
    ({"effect": "allow", "backends": ["nope"]}, "no backend is named 'nope'"),
    ({"effect": "allow", "methods": ["tools/cal"]}, "'tools/cal' is not an MCP method"),
    ({"effect": "allow", "methods": ["subscriptions/listen"]}, "never decided by a rule"),
    ({"effect": "allow", "methods": ["resources/read"], "names": ["x"]}, "names can never match"),
    ({"effect": "allow", "methods": ["tools/call"], "uris": ["x://*"]}, "uris can never match"),
    ({"effect": "allow", "backends": ["github"], "names": ["ledger__*"]}, "can never match a name of backends"),
    ({"effect": "allow", "methods": []}, "methods is empty"),
    ({"effect": "allow", "when": {"scopes": ["a"]}}, "callers have scopes only with auth.mode: jwt"),
    ({"effect": "allow", "when": {"claims": {"tenant": "x"}}}, "callers have claims only"),
])
def test_check_config_refuses_rules_that_can_never_match(rule, problem):
    with pytest.raises(ConfigError) as refused:
        load_settings(None, backends=BACKENDS, authorization={"rules": [rule]})
    assert problem in str(refused.value)
    assert "authorization.rules.0" in str(refused.value)


def test_check_config_refuses_a_claim_the_principal_does_not_keep():
    with pytest.raises(ConfigError, match="add 'tenant' to auth.claims"):
        load_settings(None, backends=BACKENDS, auth=jwt_auth(("groups",)),
                      authorization={"rules": [{"effect": "allow", "when": {"claims": {"tenant": "acme"}}}]})


def test_glob_literal_prefix():
    assert glob_literal_prefix("ledger__get_*") == "ledger__get_"
    assert glob_literal_prefix("*") == ""
    assert glob_literal_prefix("a?c") == "a"
    assert glob_literal_prefix("abc") == "abc"


# -- fuzz: the compiled rules decide what a plain reading of the rules decides ---------------

NAMES = ["ledger__get_a", "ledger__delete_b", "github__get_c", "github__search", "ledger__x"]
GLOBS = ["*", "ledger__*", "github__*", "*__get_*", "*__delete_*", "ledger__x", "github__sea?ch", "*_[ab]"]
GROUPS = ["finance", "eng", "audit"]

rule_strategy = st.fixed_dictionaries(
    {"effect": st.sampled_from(["allow", "deny"])},
    optional={
        "names": st.lists(st.sampled_from(GLOBS), min_size=1, max_size=3),
        "methods": st.sampled_from([["tools/call"], ["tools/call", "prompts/get"], ["tools/list"]]),
        "when": st.fixed_dictionaries({}, optional={
            "claims": st.fixed_dictionaries({"groups": st.sampled_from(GROUPS)}),
            "scopes": st.lists(st.sampled_from(["s1", "s2"]), min_size=1, max_size=2)}),
    })
principal_strategy = st.builds(lambda g, s: who(g, tuple(s)), st.sampled_from([None, *GROUPS, GROUPS[:2]]),
                               st.lists(st.sampled_from(["s1", "s2"]), max_size=2))


def plain_reading(rules: list[dict[str, Any]], default: str, p: Principal, name: str) -> bool:
    for rule in rules:
        methods = rule.get("methods")
        if methods is not None and "tools/call" not in methods and "tools/list" not in methods:
            continue
        if "names" in rule and not any(fnmatch.fnmatchcase(name, g) for g in rule["names"]):
            continue
        when = rule.get("when", {})
        if not set(when.get("scopes", ())) <= p.scopes:
            continue
        if "claims" in when:
            have = p.claims.get("groups")
            have = [have] if isinstance(have, str) else (have or [])
            if when["claims"]["groups"] not in have:
                continue
        return rule["effect"] == "allow"
    return default == "allow"


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(rule_strategy, max_size=6), default=st.sampled_from(["allow", "deny"]),
       principal=principal_strategy)
def test_fuzz_the_compiled_rules_agree_with_a_plain_reading(rules, default, principal):
    rs = rules_of({"default": default, "rules": rules}, auth=jwt_auth())
    for name in NAMES:
        backend = name.split("__")[0]
        if rs is None:  # allow-all without rules compiles to no rule set: everything passes
            assert plain_reading(rules, default, principal, name)
            continue
        assert rs.allows(principal, "tools/call", name=name, backend=backend) == \
            plain_reading(rules, default, principal, name), (rules, name)


@settings(max_examples=300, deadline=None)
@given(rules=st.lists(rule_strategy, max_size=6), default=st.sampled_from(["allow", "deny"]),
       principals=st.lists(principal_strategy, min_size=2, max_size=5))
def test_fuzz_a_plan_made_for_one_caller_decides_for_every_other(rules, default, principals):
    """A target's plan is worked out once (memoized) and then decides for every caller: when
    it is a fixed Decision, no caller may be decided otherwise than the rules say."""
    rs = rules_of({"default": default, "rules": rules}, auth=jwt_auth())
    if rs is None:
        return
    for principal in principals:
        for name in NAMES:
            backend = name.split("__")[0]
            plan = rs.plan("tools/call", name, None, backend)
            assert rs.plan("tools/call", name, None, backend) is plan  # memoized
            assert rs.verdict(plan, principal).allowed == plain_reading(rules, default, principal, name), \
                (rules, name, principal)


def test_a_plan_is_the_decision_itself_when_no_caller_can_change_it():
    rs = rules_of({"default": "deny", "rules": [
        {"effect": "allow", "names": ["ledger__get_*"], "when": {"claims": {"groups": "finance"}}},
        {"effect": "allow", "names": ["ledger__*"]},
    ]}, auth=jwt_auth())
    fixed = rs.plan("tools/call", "ledger__list", None, "ledger")  # only the unconditional rule
    assert fixed == rs.decide(who(), "tools/call", name="ledger__list", backend="ledger")
    assert fixed.rule == "rules.1"
    assert rs.plan("tools/call", "github__x", None, "github") is rs.default  # no rule about it
    # The first rule about it reads the caller: the rules are checked per request.
    assert [r.label for r in rs.plan("tools/call", "ledger__get_a", None, "ledger")] == ["rules.0", "rules.1"]
    assert rs.decide(who("finance"), "tools/call", name="ledger__get_a").rule == "rules.0"
    assert rs.decide(who("eng"), "tools/call", name="ledger__get_a").rule == "rules.1"


def head_scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/mcp", "headers": [
        (b"mcp-protocol-version", b"2026-07-28"), *headers]}


def test_the_head_phase_decides_on_the_header_values_the_body_is_held_to():
    """The header phase reads the values `parse_call` compares with the body (trimmed, repeated
    lines combined: asgi.request_headers), so it never decides on another name than the one
    the body must then carry (spec: SHTTP Server Validation)."""
    config = load_settings(None, backends=[{"name": "ledger", "url": "http://127.0.0.1:1/mcp", "prefix": "ledger__"}],
                           authorization={"default": "allow", "rules": [{"effect": "deny", "names": ["*__delete_*"]}]})
    head = Authorization(None, rules=RuleSet.from_settings(config), resolver=PrefixResolver(config),  # type: ignore[arg-type]
                         mcp_paths=["/mcp"])
    padded = head_scope((b"mcp-method", b" tools/call"), (b"mcp-name", b"ledger__delete_x\t"))
    refused = head.admit(padded)
    assert refused is not None and refused.status == 403 and refused.data["name"] == "ledger__delete_x"
    assert head.admit(head_scope((b"mcp-method", b"tools/call"), (b"mcp-name", b"ledger__get"))) is None
    # Two Mcp-Name lines: decided on what the body would have to equal, not on either line.
    for lines in ((b"ledger__get", b"ledger__delete_x"), (b"ledger__delete_x", b"ledger__get")):
        scope = head_scope((b"mcp-method", b"tools/call"), *((b"mcp-name", line) for line in lines))
        refused = head.admit(scope)
        assert refused is not None and refused.data["name"] == asgi.request_headers(scope)["mcp-name"]
        assert refused.data["name"] == b", ".join(lines).decode()
    assert head.admit(head_scope((b"mcp-method", b"tools/list"))) is None  # lists are cut, not refused
