"""bench/listen_fanout.py's `paced` reader checks every notification it counts: the method and
the stream's own listen id, on the bytes the gateway writes (its splice and chunk framing).
Its fast path (a read equal to the last one that checked out) must count exactly what the
full parse counts, however the reads split the stream."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gateway.http11 import _ChunkFraming
from gateway.protocol import sse
from gateway.subscriptions.encoding import Outgoing, encode_id

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import listen_fanout  # noqa: E402

CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def chunk(event: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(event), event)


def notification_for(listen_id: str, message: dict = CHANGED) -> bytes:
    """One stream's chunk as the gateway's fan-out writes it (encoding.py splice, http11 framing)."""
    outgoing = Outgoing(message)
    outgoing.encode()
    framing = _ChunkFraming(outgoing.before, outgoing.after)
    middle = encode_id(listen_id)
    return framing.head(len(middle)) + middle + framing.tail


def ack_for(listen_id: str) -> bytes:
    return chunk(sse.encode({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                             "params": {"_meta": {listen_fanout.SUBSCRIPTION_ID: listen_id}}}))


@pytest.fixture(scope="module", autouse=True)
def loop():
    global _loop
    _loop = asyncio.new_event_loop()
    yield _loop
    _loop.close()


def stream(listen_id: str = "bench-7") -> listen_fanout._CheckedStream:
    return listen_fanout._CheckedStream(b"", listen_id, _loop.create_future(), [0])


def test_the_gateways_chunk_checks_out_and_the_fast_path_counts_the_same():
    s = stream()
    s.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + ack_for("bench-7"))
    assert s.acked.done() and s.arrivals == []
    one = notification_for("bench-7")
    for _ in range(5):
        s.data_received(one)
    assert s.expected == one  # later reads of the same bytes take the fast path
    assert len(s.arrivals) == 5 and s.tally == [5] and s.wrong == 0


@pytest.mark.parametrize("other", ["bench-70", "bench-", "bench-8"])
def test_another_streams_id_is_refused_even_after_the_fast_path_is_set(other):
    s = stream()
    s.data_received(ack_for("bench-7"))
    s.data_received(notification_for("bench-7"))
    s.data_received(notification_for(other))
    assert len(s.arrivals) == 1 and s.wrong == 1


def test_an_integer_id_is_refused_for_a_string_listen():
    s = stream("7")
    s.data_received(ack_for("7"))
    s.data_received(chunk(sse.encode({**CHANGED, "params": {"_meta": {listen_fanout.SUBSCRIPTION_ID: 7}}})))
    assert s.arrivals == [] and s.wrong == 1


def test_another_method_and_a_request_are_refused():
    s = stream()
    s.data_received(ack_for("bench-7"))
    tagged = {"_meta": {listen_fanout.SUBSCRIPTION_ID: "bench-7"}}
    # The method's name in another field does not make it that notification.
    s.data_received(chunk(sse.encode({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed",
                                      "params": {**tagged, "note": "notifications/tools/list_changed"}})))
    s.data_received(chunk(sse.encode({**CHANGED, "id": 1, "params": tagged})))
    assert s.arrivals == [] and s.wrong == 2


def test_reads_split_anywhere_count_every_notification_once():
    whole = ack_for("bench-7") + b"".join(notification_for("bench-7") for _ in range(4)) + chunk(b": keepalive\n\n")
    for size in (1, 7, 50, 333):
        s = stream()
        for at in range(0, len(whole), size):
            s.data_received(whole[at:at + size])
        assert len(s.arrivals) == 4 and s.wrong == 0, size


def test_several_notifications_in_one_read_are_each_counted_and_leave_the_fast_path_alone():
    s = stream()
    s.data_received(ack_for("bench-7"))
    one = notification_for("bench-7")
    s.data_received(one + one)
    assert len(s.arrivals) == 2 and s.expected is None  # two in a read: not what one looks like
    s.data_received(one)
    s.data_received(one)
    assert len(s.arrivals) == 4 and s.expected == one
