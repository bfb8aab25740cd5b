"""Sealed legacy-session tokens: only this gateway's own, for their own purpose, open."""

from __future__ import annotations

import base64

from gateway.legacy_clients.notifications import falls_short
from gateway.legacy_clients.sealed import INPUT_REQUEST, MAX_TOKEN_CHARS, SESSION, Sealer, principal_binding

FACTS = {"k": "key", "p": principal_binding("issuer|alice"), "v": "2025-11-25", "c": {"elicitation": {}}}


def test_a_sealed_id_opens_to_its_facts_and_is_visible_ascii() -> None:
    sealer = Sealer(b"secret")
    token = sealer.seal(SESSION, FACTS)
    assert sealer.open(SESSION, token) == FACTS
    assert token.isascii() and all(0x21 <= ord(c) <= 0x7E for c in token)
    assert "alice" not in token and "elicitation" not in base64.urlsafe_b64decode(token[3:] + "===").decode("latin-1")
    assert sealer.seal(SESSION, FACTS) != token  # a fresh nonce each time


def test_anything_altered_foreign_or_for_another_purpose_does_not_open() -> None:
    sealer = Sealer(b"secret")
    token = sealer.seal(SESSION, FACTS)
    flipped = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    assert sealer.open(SESSION, flipped) is None
    assert Sealer(b"another secret").open(SESSION, token) is None
    assert sealer.open(INPUT_REQUEST, token) is None  # one kind of token is never another
    for junk in ("", "v1.", "v1.!!!", "v2." + token[3:], "v1.AAAA", token + "=" * 3, "v1." + "A" * MAX_TOKEN_CHARS):
        assert sealer.open(SESSION, junk) is None, junk


def test_the_principal_binding_is_a_digest() -> None:
    assert principal_binding("issuer|alice") == principal_binding("issuer|alice")
    assert principal_binding("issuer|alice") != principal_binding("issuer|bob")
    assert "alice" not in principal_binding("issuer|alice")


def test_an_ack_falls_short_when_it_grants_less_than_was_wanted() -> None:
    wanted = {"toolsListChanged": True, "resourceSubscriptions": ["a://1"]}
    full = {"notifications": {"toolsListChanged": True, "resourceSubscriptions": ["a://1", "a://2"]}}
    assert not falls_short(wanted, full)
    assert falls_short(wanted, {"notifications": {"toolsListChanged": True}})
    assert falls_short(wanted, {"notifications": {"resourceSubscriptions": ["a://1"]}})
    assert falls_short(wanted, {})
    assert not falls_short({}, {"notifications": {}})
