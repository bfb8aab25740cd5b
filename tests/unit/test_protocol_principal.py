"""protocol/principal.py: the one Principal, its two keys and its claims."""

from __future__ import annotations

import pytest

from gateway.protocol.principal import ANONYMOUS, Principal, credential_principal, principal_of
from gateway.protocol.request import parse_call

ISSUER = "https://idp.test"


def test_every_caller_has_a_binding_key_and_only_an_authenticated_one_a_cache_key():
    alice = Principal("alice", ISSUER, authenticated=True)
    presented = credential_principal(b"Bearer not-verified")
    assert alice.key == alice.cache_key == f"{ISSUER}|alice"
    assert presented.key and presented.cache_key is None
    assert ANONYMOUS.key and ANONYMOUS.cache_key is None
    assert len({alice.key, presented.key, ANONYMOUS.key}) == 3


def test_the_credential_of_mode_none_is_hashed_never_kept():
    token = b"Bearer s3cret-token-value"
    principal = credential_principal(token)
    assert principal == credential_principal(token) != credential_principal(b"Bearer other")
    for text in (principal.key, principal.subject, repr(principal)):
        assert "s3cret" not in text
    assert credential_principal(None) is ANONYMOUS and credential_principal(b"") is ANONYMOUS


def test_claims_are_a_frozen_copy():
    source = {"tenant": "acme"}
    principal = Principal("alice", ISSUER, True, claims=source)
    source["tenant"] = "other"
    assert principal.claims == {"tenant": "acme"}
    with pytest.raises(TypeError):
        principal.claims["tenant"] = "x"  # type: ignore[index]
    assert hash(principal) == hash(Principal("alice", ISSUER, True))  # claims do not break hashing
    assert ANONYMOUS.claims == {}


def test_principal_of_reads_the_scope_and_defaults_to_anonymous():
    alice = Principal("alice", ISSUER, True)
    assert principal_of({"auth": alice}) is alice
    assert principal_of({}) is ANONYMOUS
    assert principal_of({"auth": "not a principal"}) is ANONYMOUS


def test_parse_call_carries_the_principal():
    alice = Principal("alice", ISSUER, True)
    body = b'{"jsonrpc":"2.0","method":"notifications/x"}'
    assert parse_call(body, {}, alice).principal is alice
    assert parse_call(body, {}).principal is ANONYMOUS
