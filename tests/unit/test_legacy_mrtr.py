"""The sealed requestState and the continuation registry (gateway/backends/legacy/mrtr.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.backends.base import internal_call
from gateway.backends.legacy import mrtr
from gateway.settings import load_settings


def test_seal_round_trip_and_tamper_detection() -> None:
    sealer = mrtr.StateSealer(b"secret")
    token = sealer.seal({"c": "abc", "exp": time.time() + 60})
    assert sealer.open(token)["c"] == "abc"
    head, body, mac = token.split(".")
    forged_body = mrtr.StateSealer(b"other").seal({"c": "evil", "exp": time.time() + 60}).split(".")[1]
    for bad in (f"{head}.{forged_body}.{mac}", f"{head}.{body}.{mac[:-1]}A" if mac[-1] != "A" else f"{head}.{body}.{mac[:-1]}B",
                "g0." + body + "." + mac, "not-a-state", 42):
        with pytest.raises(mrtr.StateError):
            sealer.open(bad)
    with pytest.raises(mrtr.StateError):
        mrtr.StateSealer(b"other").open(token)


def test_expired_state_is_rejected() -> None:
    sealer = mrtr.StateSealer(b"secret")
    token = sealer.seal({"c": "abc", "exp": 100.0})
    with pytest.raises(mrtr.StateError, match="expired"):
        sealer.open(token, now=101.0)
    assert sealer.open(token, now=99.0)["c"] == "abc"


def test_digest_ignores_what_a_retry_may_change() -> None:
    original = internal_call("tools/call", {"name": "t", "arguments": {"a": 1}})
    retry = internal_call("tools/call", {"name": "t", "arguments": {"a": 1}, "inputResponses": {"k": {}},
                                         "requestState": "s", "_meta": {"progressToken": 5}})
    other = internal_call("tools/call", {"name": "t", "arguments": {"a": 2}})
    assert mrtr.request_digest(original) == mrtr.request_digest(retry)
    assert mrtr.request_digest(original) != mrtr.request_digest(other)


def test_shared_secret_and_owner_from_settings() -> None:
    settings = load_settings(None, server={"host": "0.0.0.0", "port": 9000},
                             security={"secret": "s3cret"})
    a, b = mrtr.sealer_from_settings(settings), mrtr.StateSealer(b"s3cret")
    assert b.open(a.seal({"exp": time.time() + 5})) is not None
    assert mrtr.owner_url(settings) == "http://127.0.0.1:9000/mcp"
    pinned = load_settings(None, security={"advertise_url": "http://10.0.0.7:8080/mcp"})
    assert mrtr.owner_url(pinned) == "http://10.0.0.7:8080/mcp"


async def test_continuations_are_single_use_and_expire() -> None:
    registry = mrtr.Continuations()
    expired: list[str] = []
    kept = mrtr.Continuation("one", "b", None, None, {}, time.time() + 60, on_expire=lambda c: expired.append(c.id))
    short = mrtr.Continuation("two", "b", None, None, {}, time.time() + 0.01,
                              on_expire=lambda c: expired.append(c.id))
    registry.park(kept)
    registry.park(short)
    assert registry.take("one") is kept
    assert registry.take("one") is None
    for _ in range(100):
        if expired:
            break
        await asyncio.sleep(0.01)
    assert expired == ["two"]
    assert registry.take("two") is None
