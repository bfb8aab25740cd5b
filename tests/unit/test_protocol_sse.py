"""The SSE decoder against the framing rules of the event-stream format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol import sse


def decode_all(*chunks: bytes) -> list[tuple[str, str]]:
    decoder = sse.Decoder()
    out: list[tuple[str, str]] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


def test_one_event_with_default_type():
    assert decode_all(b'data: {"a":1}\n\n') == [("message", '{"a":1}')]


def test_named_event_and_multiline_data():
    assert decode_all(b"event: message\ndata: line1\ndata: line2\n\n") == [("message", "line1\nline2")]


def test_crlf_and_bare_cr_line_endings():
    assert decode_all(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n") == [("message", "a"), ("message", "b"),
                                                                   ("message", "c")]


def test_comments_ids_and_retry_are_not_events():
    assert decode_all(b":keepalive\n\nid: 7\nretry: 10\n\n") == []


def test_priming_event_with_empty_data_is_an_empty_event():
    # A legacy priming event: an id and an empty data line (digest §h.2).
    assert decode_all(b"id: 1\ndata:\n\n") == [("message", "")]


def test_event_without_trailing_blank_line_is_not_dispatched():
    assert decode_all(b"data: partial\n") == []


def test_field_without_space_after_colon():
    assert decode_all(b"data:x\n\n") == [("message", "x")]


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
                        min_size=1, max_size=20), min_size=1, max_size=5),
       st.integers(min_value=1, max_value=7))
def test_any_chunking_yields_the_same_events(payloads, step):
    stream = b"".join(f"data: {p}\r\n\r\n".encode() for p in payloads)
    whole = decode_all(stream)
    chunked = decode_all(*(stream[i : i + step] for i in range(0, len(stream), step)))
    assert whole == chunked == [("message", p) for p in payloads]


def test_last_event_id_and_retry_are_kept_for_resumption():
    # A legacy priming event (id, empty data, retry): an event with empty data, which readers
    # skip, and the id the stream resumes from.
    decoder = sse.Decoder()
    assert decoder.feed(b"id: 7\r\ndata: \r\nretry: 250\r\n\r\n") == [("message", "")]
    assert decoder.feed(b"id: 7b\r\n\r\n") == []  # no data: nothing dispatched, the id still counts
    assert decoder.last_event_id == "7b"
    decoder.feed(b"id: 7\r\n\r\n")
    assert (decoder.last_event_id, decoder.retry_ms) == ("7", 250)
    assert decoder.feed(b"id: 8\r\nevent: message\r\ndata: {}\r\n\r\n") == [("message", "{}")]
    assert decoder.last_event_id == "8"
    decoder.feed(b"id: 9\nretry: soon\n")  # not dispatched yet; a non-numeric retry is ignored
    assert (decoder.last_event_id, decoder.retry_ms) == ("8", 250)


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
                        min_size=1, max_size=20), min_size=1, max_size=5),
       st.integers(min_value=1, max_value=7))
def test_any_chunking_of_bare_cr_line_endings_yields_the_same_events(payloads, step):
    # A CR at the end of a chunk may be half of a CRLF: the line is held until the next byte.
    # (The stream's very last CR stays ambiguous for ever: the final blank line ends in CRLF.)
    stream = b"".join(f"data: {p}\r\r".encode() for p in payloads) + b"\n"
    chunked = decode_all(*(stream[i : i + step] for i in range(0, len(stream), step)))
    assert chunked == [("message", p) for p in payloads]


def test_pending_bytes_is_the_event_not_yet_dispatched():
    decoder = sse.Decoder()
    assert decoder.feed(b"data: abc") == [] and decoder.pending_bytes == 9  # a line not ended
    assert decoder.feed(b"def\ndata: gh\n") == [] and decoder.pending_bytes == len("abcdef") + len("gh")
    assert decoder.feed(b"\n") == [("message", "abcdef\ngh")] and decoder.pending_bytes == 0


async def test_json_payloads_refuses_an_event_past_its_bound():
    async def chunks(*parts: bytes):
        for part in parts:
            yield part

    small = [p async for p in sse.json_payloads(chunks(b'data: {"a": 1}\n\n'), "test", max_event_bytes=64)]
    assert small == [{"a": 1}]
    for parts in ([b"data: " + b"1" * 100], [b"data: " + b"1" * 100 + b"\n\n"]):  # growing, or whole
        with pytest.raises(sse.EventTooLarge):
            [p async for p in sse.json_payloads(chunks(*parts), "test", max_event_bytes=64)]


def test_a_held_cr_is_a_line_end_as_soon_as_the_next_byte_is_not_lf():
    decoder = sse.Decoder()
    assert decoder.feed(b"data: a\r\r") == []  # the last CR may be half of a CRLF
    assert decoder.feed(b"x") == [("message", "a")]  # it was not: the event ends here, not later
