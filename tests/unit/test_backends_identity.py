"""The identity header: its documented format, verified as a backend would."""

from __future__ import annotations

import base64
import hashlib
import hmac

import orjson

from gateway.backends.identity import IdentitySigner, verify
from gateway.protocol.principal import Principal
from tests.support.clock import ManualClock

SECRET = b"a-shared-secret-of-the-fleet-0123"


def test_the_format_is_what_docs_auth_md_says():
    value = IdentitySigner(SECRET, clock=lambda: 1_700_000_000.4).value(
        Principal("alice", issuer="https://idp.test", authenticated=True))
    version, payload, signature = value.split(".")
    assert version == "v1"
    claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims == {"sub": "alice", "iss": "https://idp.test", "authenticated": True, "iat": 1_700_000_000}
    expected = hmac.new(SECRET, f"v1.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)) == expected


def test_verify_refuses_another_key_a_changed_payload_and_an_old_value():
    clock = ManualClock(1_700_000_000)
    value = IdentitySigner(SECRET, clock=clock).value(Principal("bob", authenticated=True))
    assert verify(SECRET, value, max_age=60, now=clock.now)["sub"] == "bob"
    assert verify(b"other", value, max_age=60, now=clock.now) is None
    _, payload, signature = value.split(".")
    forged = base64.urlsafe_b64encode(orjson.dumps({"sub": "root", "iss": "", "authenticated": True,
                                                    "iat": 1_700_000_000})).rstrip(b"=").decode()
    assert verify(SECRET, f"v1.{forged}.{signature}", max_age=60, now=clock.now) is None
    assert verify(SECRET, value, max_age=60, now=clock.now + 61) is None


def test_one_hmac_per_principal_and_second():
    clock = ManualClock(1_700_000_000)
    signer = IdentitySigner(SECRET, clock=clock)
    a = Principal("a", authenticated=True)
    first = signer.value(a)
    assert signer.value(a) is first
    clock.now += 1
    assert signer.value(a) != first
