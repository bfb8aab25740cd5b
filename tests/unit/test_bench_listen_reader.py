"""bench/listen_fanout.py's `paced` reader checks every notification it counts: the method and
the stream's own listen id, on the bytes the gateway writes (its splice and chunk framing).
Its fast path (a read equal to the last one that checked out) must count exactly what the
full parse counts, however the reads split the stream. The `epoll` reader does the same on raw
sockets, with a fast path of its own in front of the paced reader's."""

from __future__ import annotations

import asyncio
import socket
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


# The `epoll` reader: the same streams on raw sockets (a socket pair per stream, so that each
# write is one read), one epoll, its own fast path in front of `_CheckedStream.data_received`.


@pytest.fixture()
def epoll_reader():
    reader = listen_fanout.EpollReader()
    yield reader
    reader.close()


def epoll_stream(reader: listen_fanout.EpollReader, listen_id: str = "bench-7"):
    """A stream of `reader` and the gateway's end of its socket."""
    gateway_end, reader_end = socket.socketpair()
    return reader.add(reader_end, listen_id), gateway_end


def feed(reader: listen_fanout.EpollReader, end, *reads: bytes) -> None:
    """Each of `reads` written by the gateway's end and read by one poll."""
    for data in reads:
        end.sendall(data)
        assert reader.poll() == 1


def test_the_epoll_reader_checks_the_gateways_chunks_and_takes_its_fast_path(epoll_reader):
    s, end = epoll_stream(epoll_reader)
    one = notification_for("bench-7")
    feed(epoll_reader, end, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", ack_for("bench-7"),
         *[one] * 5)
    assert s.acked.done() and s.expected == one
    assert len(s.arrivals) == 5 and epoll_reader.tally == [5] and s.wrong == 0
    assert epoll_reader.poll() == 0  # nothing more to read
    end.close()


def test_the_epoll_reader_refuses_another_streams_id_and_counts_a_split_event_once(epoll_reader):
    s, end = epoll_stream(epoll_reader)
    other, other_end = epoll_stream(epoll_reader, "bench-8")
    one = notification_for("bench-7")
    feed(epoll_reader, end, ack_for("bench-7"), one, notification_for("bench-70"), one[:9], one[9:])
    feed(epoll_reader, other_end, ack_for("bench-8"), notification_for("bench-8"), one)
    assert len(s.arrivals) == 2 and s.wrong == 1
    assert len(other.arrivals) == 1 and other.wrong == 1
    assert epoll_reader.tally == [3]
    end.close()
    other_end.close()


def test_a_closed_stream_is_counted_as_closed(epoll_reader):
    s, end = epoll_stream(epoll_reader)
    end.close()
    assert epoll_reader.poll() == 1 and epoll_reader.closed == 1 and s.arrivals == []


@pytest.mark.parametrize("reads", [
    # Once the fast path is set: a read of exactly its bytes behind a partial event is not
    # that notification (the slow path refuses the event the two make).
    lambda one, wrong: [one, one, one[:10], one, one],
    lambda one, wrong: [one, wrong, one, one + one, one, one[:-3], one[-3:], one],
    lambda one, wrong: [one[:1], one[1:], one, b": keepalive\n\n", one, wrong[:5], wrong[5:], one],
])
def test_the_epoll_readers_fast_path_answers_what_the_full_parse_answers(epoll_reader, reads):
    one, wrong = notification_for("bench-7"), notification_for("bench-17")
    s, end = epoll_stream(epoll_reader)
    parsed = stream()
    for data in [ack_for("bench-7"), *reads(one, wrong)]:
        feed(epoll_reader, end, data)
        parsed.data_received(data)
    assert (len(s.arrivals), s.wrong, s.pending, s.expected) == (
        len(parsed.arrivals), parsed.wrong, parsed.pending, parsed.expected)
    assert epoll_reader.tally == parsed.tally
    end.close()


def test_the_epoll_reader_reads_a_socket_until_it_is_empty(epoll_reader):
    # Edge-triggered, a socket is ready once per arrival: what one read leaves (more than its
    # buffer holds) must be read in the same poll, or it waits for the next arrival.
    s, end = epoll_stream(epoll_reader)
    feed(epoll_reader, end, ack_for("bench-7"))
    many = notification_for("bench-7") * (2 * len(epoll_reader.buffer) // len(notification_for("bench-7")))
    end.sendall(many)
    assert epoll_reader.poll() == 1
    assert len(s.arrivals) == many.count(b"list_changed") and s.wrong == 0 and s.pending == b""
    assert epoll_reader.poll() == 0
    end.close()
