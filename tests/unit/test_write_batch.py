"""WriteBatch on real sockets: writes held to the end of the loop pass, in order, flushed at
once when large or before a close, dropped when the transport closed first. Run on asyncio's
loop and on uvloop (the server's), whose pass boundaries are what the batching relies on."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop

from gateway import write_batch
from gateway.write_batch import FLUSH_BYTES, WriteBatch
from tests.support.sockets import read_now


async def _pair(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Transport, socket.socket]:
    """A transport on one end of a connected socket pair, and the raw peer socket."""
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    return transport, peer


async def _next_passes(n: int = 2) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _on_each_loop(scenario):
    """Run `scenario(loop)` once on asyncio's loop and once on uvloop's."""
    @pytest.mark.parametrize("factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
    def test(factory):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(scenario(runner.get_loop()))
    test.__name__ = scenario.__name__
    return test


@_on_each_loop
async def test_writes_are_held_until_the_pass_ends_then_sent_in_order(loop):
    batch = WriteBatch(loop)
    first, first_peer = await _pair(loop)
    second, second_peer = await _pair(loop)
    batch.write(first, b"one ")
    batch.write(second, b"alpha ")
    batch.write(first, b"two")
    assert batch.holds(first) == 7 and batch.holds(second) == 6
    await _next_passes()
    assert read_now(first_peer) == b"one two"
    assert read_now(second_peer) == b"alpha "
    assert batch.holds(first) == 0


@_on_each_loop
async def test_nothing_reaches_the_peer_before_the_pass_ends(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    batch.write(transport, b"held")
    # Still inside the writing callback: the socket has not been written.
    assert read_now(peer) == b""
    await _next_passes()
    assert read_now(peer) == b"held"


@_on_each_loop
async def test_a_large_write_goes_out_at_once_with_what_was_held_before_it(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    big = b"x" * FLUSH_BYTES
    batch.write(transport, b"head|")
    batch.write(transport, big)
    assert batch.holds(transport) == 0
    received = b""
    for _ in range(50):
        received += read_now(peer)
        if len(received) >= len(big) + 5:
            break
        await asyncio.sleep(0.01)
    assert received == b"head|" + big


@_on_each_loop
async def test_write_now_sends_at_once_behind_what_was_held(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    other, other_peer = await _pair(loop)
    batch.write(transport, b"held ")
    batch.write(other, b"other")
    batch.write_now(transport, b"now")
    # Still inside the writing callback: this transport's bytes are out, in order; the
    # other transport's wait for the end of the pass as before.
    assert read_now(peer) == b"held now"
    assert batch.holds(transport) == 0 and read_now(other_peer) == b""
    await _next_passes()
    assert read_now(other_peer) == b"other" and read_now(peer) == b""


@_on_each_loop
async def test_flush_before_close_delivers_everything_then_eof(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    batch.write(transport, b"last words")
    batch.flush(transport)
    transport.close()
    await _next_passes()
    assert read_now(peer) == b"last words<EOF>"


@_on_each_loop
async def test_bytes_held_for_a_transport_closed_in_the_same_pass_are_dropped(loop):
    batch = WriteBatch(loop)
    closed, closed_peer = await _pair(loop)
    open_, open_peer = await _pair(loop)
    batch.write(closed, b"never sent")
    batch.write(open_, b"sent")
    closed.close()  # without flushing: the close wins, the other transport is unaffected
    await _next_passes()
    assert read_now(closed_peer) == b"<EOF>"
    assert read_now(open_peer) == b"sent"


@_on_each_loop
async def test_one_batch_per_loop(loop):
    assert write_batch.for_loop(loop) is write_batch.for_loop(loop)
    other = asyncio.new_event_loop()
    try:
        assert write_batch.for_loop(other) is not write_batch.for_loop(loop)
    finally:
        other.close()


@_on_each_loop
async def test_a_transport_that_refuses_its_write_costs_the_others_nothing(loop):
    batch = WriteBatch(loop)
    refusing, refusing_peer = await _pair(loop)
    healthy, healthy_peer = await _pair(loop)
    refusing.write_eof()  # a later write() raises on both loops
    batch.write(refusing, b"too late")
    batch.write(healthy, b"fine")
    await _next_passes()
    assert read_now(healthy_peer) == b"fine"
    assert refusing.is_closing()  # aborted rather than left half-open with its bytes lost
    assert read_now(refusing_peer) == b"<EOF>"


@_on_each_loop
async def test_write_through_sends_the_first_write_of_a_pass_at_once_and_joins_the_rest(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    other, other_peer = await _pair(loop)
    batch.write(other, b"held ")
    batch.write_through(transport, b"first ")
    assert read_now(peer) == b"first "  # sent in the pass that wrote it
    batch.write_through(transport, b"second ")
    batch.write_through(transport, b"third")
    assert read_now(peer) == b""  # the rest of the pass is held, in order
    await _next_passes()
    assert read_now(peer) == b"second third"
    assert read_now(other_peer) == b"held "
    # A new pass: the first write goes at once again.
    batch.write_through(transport, b"next")
    assert read_now(peer) == b"next"


class _Marked:
    written_in = -1


@_on_each_loop
async def test_a_marked_writer_sends_its_first_write_of_a_pass_at_once_and_joins_the_rest(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    other, other_peer = await _pair(loop)
    writer, other_writer = _Marked(), _Marked()
    batch.write_through_marked(writer, transport, b"first ")
    batch.write_through_marked(other_writer, other, b"alpha")
    assert read_now(peer) == b"first " and read_now(other_peer) == b"alpha"
    assert batch.held == {}  # the first writes of the pass leave no entry behind
    batch.write_through_marked(writer, transport, b"second ")
    batch.write_through_marked(writer, transport, b"third")
    assert read_now(peer) == b""  # the rest of the pass is held, in order
    await _next_passes()
    assert read_now(peer) == b"second third"
    # A new pass: the first write goes at once again.
    batch.write_through_marked(writer, transport, b"next")
    assert read_now(peer) == b"next"


@_on_each_loop
async def test_a_marked_writer_goes_behind_what_others_wrote_to_its_transport_in_the_pass(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    batch.write(transport, b"head ")
    batch.write_through_marked(_Marked(), transport, b"body")
    assert read_now(peer) == b""
    await _next_passes()
    assert read_now(peer) == b"head body"
    batch.write_through(transport, b"once ")  # written at once, marked in `held`
    batch.write_through_marked(_Marked(), transport, b"then")
    assert read_now(peer) == b"once "
    await _next_passes()
    assert read_now(peer) == b"then"


@_on_each_loop
async def test_write_through_goes_behind_what_was_held_for_that_transport(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    batch.write(transport, b"head ")
    batch.write_through(transport, b"body")
    assert read_now(peer) == b""
    await _next_passes()
    assert read_now(peer) == b"head body"


@_on_each_loop
async def test_a_burst_sends_the_first_writes_back_to_back_when_it_ends(loop):
    batch = WriteBatch(loop)
    pairs = [await _pair(loop) for _ in range(3)]
    writers = [_Marked() for _ in pairs]
    with batch.burst():
        for (transport, _), writer, data in zip(pairs, writers, (b"a", b"b", b"c"), strict=True):
            batch.write_through_marked(writer, transport, data)
        assert [read_now(peer) for _, peer in pairs] == [b"", b"", b""]  # collected, not yet sent
    assert [read_now(peer) for _, peer in pairs] == [b"a", b"b", b"c"]  # sent as the burst ends
    assert batch.held == {}
    # A later write of the same pass is held behind the burst's, to the end of the pass.
    batch.write_through_marked(writers[0], pairs[0][0], b" later")
    assert read_now(pairs[0][1]) == b""
    await _next_passes()
    assert read_now(pairs[0][1]) == b" later"


@_on_each_loop
async def test_a_burst_sends_every_burst_writes_without_waiting_for_its_end(loop):
    batch = WriteBatch(loop)
    pairs = [await _pair(loop) for _ in range(write_batch.BURST_WRITES + 1)]
    with batch.burst():
        for i, (transport, _) in enumerate(pairs):
            batch.write_through_marked(_Marked(), transport, b"%d" % i)
        # The first BURST_WRITES went out when the burst had collected that many; the last waits.
        assert read_now(pairs[0][1]) == b"0" and read_now(pairs[-2][1]) == b"%d" % (len(pairs) - 2)
        assert read_now(pairs[-1][1]) == b""
    assert read_now(pairs[-1][1]) == b"%d" % (len(pairs) - 1)
    for transport, peer in pairs:
        transport.close()
        peer.close()


@_on_each_loop
async def test_flush_and_write_now_in_a_burst_send_what_it_collected_first(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    other, other_peer = await _pair(loop)
    with batch.burst():
        batch.write_through_marked(_Marked(), transport, b"collected ")
        batch.write_now(transport, b"direct")  # must not overtake the collected bytes
        assert read_now(peer) == b"collected direct"
        batch.write_through_marked(_Marked(), other, b"one")
        batch.flush(other)  # before a close, say
        assert read_now(other_peer) == b"one"
    assert read_now(peer) == b"" and read_now(other_peer) == b""  # nothing sent twice


@_on_each_loop
async def test_a_burst_that_raises_still_sends_what_it_collected_and_ends(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    with pytest.raises(RuntimeError), batch.burst():
        batch.write_through_marked(_Marked(), transport, b"made before the fault")
        raise RuntimeError("a fault in the fan-out")
    assert read_now(peer) == b"made before the fault"
    batch.write_through_marked(_Marked(), transport, b" and after it")  # no burst now: at once
    assert read_now(peer) == b" and after it"


@_on_each_loop
async def test_a_burst_drops_the_bytes_of_a_transport_closed_before_it_ends(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    other, other_peer = await _pair(loop)
    with batch.burst():
        batch.write_through_marked(_Marked(), transport, b"lost")
        batch.write_through_marked(_Marked(), other, b"kept")
        transport.abort()  # gone without a flush: its collected bytes are dropped, as held ones are
    assert read_now(other_peer) == b"kept"
    await _next_passes()
    assert peer.recv(100) == b""  # end of stream, nothing before it


@_on_each_loop
async def test_nested_bursts_send_when_the_outermost_ends(loop):
    batch = WriteBatch(loop)
    transport, peer = await _pair(loop)
    with batch.burst():
        with batch.burst():
            batch.write_through_marked(_Marked(), transport, b"inner")
        assert read_now(peer) == b""
    assert read_now(peer) == b"inner"
