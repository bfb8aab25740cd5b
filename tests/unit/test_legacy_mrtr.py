"""The sealed requestState and the continuation registry (gateway/backends/legacy/mrtr.py)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import time

import pytest

from gateway.backends.base import internal_call
from gateway.backends import replica
from gateway.backends.legacy import mrtr
from gateway.backends.replica import ReplicaContext
from gateway.backends.exchange import Exchange
from gateway.backends.legacy.session import LegacySession
from gateway.observability import metrics
from gateway.protocol import jsonrpc as rpc
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
    settings = load_settings(None, server={"host": "10.0.0.9", "port": 9000},
                             security={"secret": "s3cret"})
    a, b = mrtr.StateSealer(ReplicaContext.from_settings(settings).secret), mrtr.StateSealer(b"s3cret")
    assert b.open(a.seal({"exp": time.time() + 5})) is not None
    assert replica.owner_url(settings) == "http://10.0.0.9:9000/mcp"
    pinned = load_settings(None, server={"host": "0.0.0.0"}, security={"advertise_url": "http://10.0.0.7:8080/mcp"})
    assert replica.owner_url(pinned) == "http://10.0.0.7:8080/mcp"


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_bind_never_advertises_a_loopback_owner(host: str) -> None:
    # Every replica bound to 0.0.0.0 used to call itself http://127.0.0.1:8080/mcp, so each
    # believed it owned every continuation and answered a foreign retry with -32602.
    settings = load_settings(None, server={"host": host, "port": 8080}, security={"secret": "s"})
    owner = replica.owner_url(settings)
    assert owner.startswith(replica.UNADVERTISED)
    assert "127.0.0.1" not in owner


def test_replica_problems_name_the_missing_settings() -> None:
    ((level, message),) = replica.replica_problems(load_settings(None))
    assert level == logging.WARNING and "security.secret" in message
    fleet = load_settings(None, server={"host": "0.0.0.0"}, security={"secret": "s"})
    ((level, message),) = replica.replica_problems(fleet)
    assert level == logging.ERROR
    assert "MCP_GATEWAY_SECURITY__ADVERTISE_URL" in message and "status.podIP" in message
    advertised = load_settings(None, server={"host": "0.0.0.0"},
                               security={"secret": "s", "advertise_url": "http://10.0.0.7:8080/mcp"})
    assert replica.replica_problems(advertised) == []


async def test_forwarding_to_an_unadvertised_owner_says_which_setting_is_missing() -> None:
    forwarder = mrtr.Forwarder("old", 5.0, 1.0)
    call = internal_call("tools/call", {"name": "t", "requestState": "s"})
    with pytest.raises(rpc.McpError) as caught:
        await forwarder.forward(call, f"{replica.UNADVERTISED}abc")
    assert caught.value.code == rpc.BACKEND_UNAVAILABLE and caught.value.status == 502
    assert "security.advertise_url" in caught.value.message and caught.value.data == {"backend": "old"}
    await forwarder.aclose()


def _continuation(cid: str, principal: str) -> mrtr.Continuation:
    return mrtr.Continuation(cid, "old", None, None, {}, time.time() + 60, principal=principal)


async def test_parked_calls_are_capped_per_principal_and_in_total() -> None:
    registry = mrtr.Continuations("old", max_total=3, max_per_principal=2)
    registry.park(_continuation("a1", "alice"))
    registry.park(_continuation("a2", "alice"))
    refusal = registry.refusal("alice")
    assert refusal is not None and refusal.code == rpc.GATEWAY_OVERLOADED
    assert "backends[].max_parked_calls_per_principal" in refusal.message and "'old'" in refusal.message
    assert refusal.data == {"limit": "backends[].max_parked_calls_per_principal", "backend": "old", "max": 2}
    assert registry.refusal("bob") is None
    registry.park(_continuation("b1", "bob"))
    total = registry.refusal("carol")
    assert total is not None and "backends[].max_parked_calls)" in total.message
    # Taking one out (a retry) frees its place for its principal and in the total.
    assert registry.take("a1") is not None
    assert registry.refusal("alice") is None and registry.refusal("carol") is None
    parked = metrics.MRTR_PARKED.labels("old")._value.get()
    assert parked == 2
    registry.close_all()
    assert len(registry) == 0


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


def test_an_authentic_state_with_a_malformed_payload_is_refused_as_malformed() -> None:
    """The MAC proves only who sealed a state. A payload that verifies but is no JSON object
    with an expiry (only a holder of the secret can make one) is a StateError, which the
    retry turns into -32602, not an exception escaping as a 500."""
    sealer = mrtr.StateSealer(b"secret")

    def sealed(encoded: bytes) -> str:  # what StateSealer.seal does, around any body
        mac = base64.urlsafe_b64encode(hmac.new(sealer._key, encoded, hashlib.sha256).digest()).rstrip(b"=")
        return f"{mrtr.STATE_VERSION}.{encoded.decode()}.{mac.decode()}"

    def b64(body: bytes) -> bytes:
        return base64.urlsafe_b64encode(body).rstrip(b"=")

    tokens = [sealed(b64(b"not json")), sealed(b64(b"\xff\xfe")), sealed(b"a"),  # "a" is no base64
              sealer.seal([1, 2]),  # type: ignore[arg-type]
              sealer.seal({"c": "abc"}), sealer.seal({"c": "abc", "exp": "tomorrow"})]
    for token in tokens:
        with pytest.raises(mrtr.StateError, match="requestState is malformed"):
            sealer.open(token)


# -- a backend withdraws its own request (session.py `_withdrawn`, §h.5, L-CAN) -------------------


class _Session(LegacySession):
    """A session with no transport: what it answers is recorded."""

    def __init__(self) -> None:
        super().__init__("old", {}, lambda message: None)
        self.sent: list[dict] = []

    async def _send_request(self, exchange: Exchange, message: dict) -> None:
        pass

    async def _send(self, message: dict) -> None:
        self.sent.append(message)

    async def _initialize(self, message: dict) -> dict:
        return {}


def _asks(request_id: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create", "params": {"message": "?"}}


def _cancels(request_id: object) -> dict:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}


async def test_a_backend_cancellation_takes_its_request_off_the_call_that_carried_it() -> None:
    session = _Session()
    call = await session.request("tools/call", {"name": "ask"})
    other = await session.request("tools/call", {"name": "echo"})
    session.route(_asks("e1"), call)
    session.route(_asks("e2"), call)
    assert [call.ready()["id"], call.ready()["id"]] == ["e1", "e2"]
    assert call.open_requests == {"e1", "e2"}
    # From a stream credited to no call (the GET stream; a shared one when ambiguous), or
    # to another call: it reaches the call that carried the request, and is queued there
    # only to wake a reader gathering an InputRequiredResult.
    session.route(_cancels("e1"), None)
    assert call.open_requests == {"e2"}
    assert call.ready() == _cancels("e1") and other.ready() is None
    pending = {"re1": _asks("e1"), "re2": _asks("e2")}
    call.prune(pending)
    assert list(pending) == ["re2"]
    # Answered by the gateway: no longer open, so a late cancellation of it finds nothing,
    # and neither do ones naming no request at all; none is queued anywhere.
    await session.respond("e2", result={"action": "accept"})
    assert call.open_requests == set() and session.sent[-1]["id"] == "e2"
    for stray in (_cancels("e2"), _cancels("e9"), _cancels({"not": "an id"}), _cancels(None),
                  {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "junk"}):
        session.route(stray, other)
    assert call.ready() is None and other.ready() is None
