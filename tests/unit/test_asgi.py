"""The pure-ASGI helpers every step shares (gateway/asgi.py): headers decoded once, bodies read
whole under a limit."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import asgi


def test_header_dict_lowercases_names_and_trims_values() -> None:
    scope = {"headers": [(b"Mcp-Method", b" tools/call\t"), (b"content-type", b"application/json")]}
    assert asgi.header_dict(scope) == {"mcp-method": "tools/call", "content-type": "application/json"}


def test_repeated_field_lines_are_combined_in_order() -> None:
    # RFC 9110 §5.3: a second Mcp-Name can never pass for the one the body names.
    scope = {"headers": [(b"mcp-name", b"echo"), (b"accept", b"*/*"), (b"Mcp-Name", b" other ")]}
    assert asgi.header_dict(scope) == {"mcp-name": "echo, other", "accept": "*/*"}


def test_headers_given_as_any_iterable_are_read() -> None:
    scope = {"headers": iter([(b"a", b"1"), (b"a", b"2"), (b"b", b"3")])}
    assert asgi.header_dict(scope) == {"a": "1, 2", "b": "3"}


def test_request_headers_are_decoded_once_per_scope() -> None:
    scope: dict[str, Any] = {"headers": [(b"a", b"1")]}
    first = asgi.request_headers(scope)
    scope["headers"] = [(b"a", b"changed")]
    assert asgi.request_headers(scope) is first


def messages(*items: dict[str, Any]) -> asgi.Receive:
    pending = list(items)

    async def receive() -> dict[str, Any]:
        return pending.pop(0)

    return receive


async def test_a_body_in_one_message_is_returned_as_is() -> None:
    body = b'{"jsonrpc":"2.0"}'
    assert await asgi.read_body(messages({"type": "http.request", "body": body}), 100) is body


async def test_a_body_in_pieces_is_joined_and_empty_pieces_are_skipped() -> None:
    receive = messages({"type": "http.request", "body": b"ab", "more_body": True},
                       {"type": "http.request", "body": b"", "more_body": True},
                       {"type": "http.request", "body": b"cd"})
    assert await asgi.read_body(receive, 4) == b"abcd"


@pytest.mark.parametrize("pieces", [[b"abcde"], [b"abc", b"de"]], ids=["whole", "in pieces"])
async def test_a_body_over_the_limit_is_refused(pieces: list[bytes]) -> None:
    items = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    with pytest.raises(asgi.BodyTooLarge):
        await asgi.read_body(messages(*items), 4)


@pytest.mark.parametrize("first", [[], [{"type": "http.request", "body": b"ab", "more_body": True}]],
                         ids=["at once", "mid-body"])
async def test_a_client_that_leaves_is_told_apart_from_an_empty_body(first: list[dict[str, Any]]) -> None:
    with pytest.raises(asgi.ClientGone):
        await asgi.read_body(messages(*first, {"type": "http.disconnect"}), 100)
    assert await asgi.read_body(messages({"type": "http.request"}), 100) == b""


def test_header_names_are_decoded_alike_remembered_or_not(monkeypatch) -> None:
    """Names are remembered once seen (bounded): the dict is the same the first time, the
    second time, and past the bound, where a new name is decoded each time it comes."""
    monkeypatch.setattr(asgi, "header_names", asgi._Names())
    monkeypatch.setattr(asgi, "_MAX_NAMES", 3)
    raw = [(b"Host", b"gw"), (b"MCP-Method", b" tools/call\t"), (b"X-A", b"1"), (b"x-b", b"2"), (b"X-A", b"3")]
    expected = {"host": "gw", "mcp-method": "tools/call", "x-a": "1, 3", "x-b": "2"}
    for _ in range(3):
        assert asgi.header_dict({"headers": list(raw)}) == expected
    assert list(asgi.header_names) == [b"Host", b"MCP-Method", b"X-A"]
