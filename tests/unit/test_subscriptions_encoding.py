"""encoding.Outgoing: one encoding per notification, each client's id spliced in, the bytes
the same as encoding that client's notification alone (ids keep their JSON type)."""

from __future__ import annotations

import orjson
import pytest

from gateway.protocol import sse
from gateway.subscriptions import encoding
from gateway.subscriptions.encoding import Outgoing, encode_id, tag
from gateway.subscriptions.filters import SubscriptionFilter

SUB = "io.modelcontextprotocol/subscriptionId"
UPDATED = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
           "params": {"uri": "file:///a", "_meta": {SUB: "the-backends-own", "other": 1}}}
IDS = [0, 7, -3, 2**53, "7", "", "a\"b\\c", "ünï", "x" * 300]


@pytest.mark.parametrize("listen_id", IDS, ids=repr)
def test_a_spliced_event_is_the_event_encoded_for_that_client_alone(listen_id):
    outgoing = Outgoing(UPDATED)
    before = outgoing.encode()
    assert before
    spliced = before + encode_id(listen_id) + outgoing.after
    assert spliced == sse.encode(tag(UPDATED, listen_id)) == outgoing.event_for(listen_id, encode_id(listen_id))
    data = orjson.loads(spliced.split(b"data: ", 1)[1])
    got = data["params"]["_meta"][SUB]
    assert got == listen_id and type(got) is type(listen_id)
    assert data["params"]["_meta"]["other"] == 1 and data["params"]["uri"] == "file:///a"


def test_a_notification_that_carries_the_placeholder_is_encoded_per_client():
    sneaky = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
              "params": {"uri": encoding._PLACEHOLDER}}
    outgoing = Outgoing(sneaky)
    assert outgoing.encode() == b""  # two occurrences: no splice
    event = outgoing.event_for(5, encode_id(5))
    assert event == sse.encode(tag(sneaky, 5))
    assert orjson.loads(event.split(b"data: ", 1)[1])["params"] == {"uri": encoding._PLACEHOLDER,
                                                                      "_meta": {SUB: 5}}


def test_admission_is_judged_per_filter_object():
    outgoing = Outgoing(UPDATED)
    covering = SubscriptionFilter(uris=frozenset({"file:///a"}))
    other = SubscriptionFilter(uris=frozenset({"file:///b"}))
    assert outgoing.admitted_by(covering) is True
    assert outgoing.admitted_by(other) is False
    assert outgoing.admitted_by(covering) is True


def test_an_id_is_encoded_with_its_json_type():
    assert encode_id(7) == b"7" and encode_id("7") == b'"7"' and encode_id("a\"b") == b'"a\\"b"'
