"""gateway/routing/cursor.py: the opaque gateway cursor that carries each backend's own."""

from __future__ import annotations

import base64

import orjson
import pytest

from gateway.protocol import jsonrpc as rpc
from gateway.routing import cursor as gw_cursor


# -- cursor ------------------------------------------------------------------------------


def test_cursor_round_trip():
    token = gw_cursor.encode("tools/list", {"a": "opaque/+=", "b": "2"})
    assert gw_cursor.decode("tools/list", token, 1) == {"a": "opaque/+=", "b": "2"}
    assert "=" not in token and "+" not in token and "/" not in token  # url-safe, unpadded


@pytest.mark.parametrize(
    "token",
    [
        None, 42, "", "%%%", "bm90IGpzb24",  # "not json"
        base64.urlsafe_b64encode(orjson.dumps({"v": 2, "m": "tools/list", "p": {}})).decode(),
        base64.urlsafe_b64encode(orjson.dumps({"v": 1, "m": "tools/list", "p": {"a": 1}})).decode(),
        base64.urlsafe_b64encode(orjson.dumps([1, 2])).decode(),
        gw_cursor.encode("prompts/list", {"a": "x"}),  # another list's cursor
    ],
)
def test_invalid_cursors_are_invalid_params(token):
    with pytest.raises(rpc.McpError) as info:
        gw_cursor.decode("tools/list", token, 5)
    assert (info.value.code, info.value.request_id) == (rpc.INVALID_PARAMS, 5)


def test_failed_backends_travel_with_their_retry_count():
    token = gw_cursor.encode("tools/list", {"a": "2", "b": None}, {"b": 1})
    assert gw_cursor.decode_position("tools/list", token, 1) == ({"a": "2", "b": None}, {"b": 1})
    # Over budget, or counted for a backend not in the cursor: not a cursor this gateway made.
    for retries in ({"b": gw_cursor.RETRY_BUDGET + 1}, {"c": 1}, {"b": True}):
        with pytest.raises(rpc.McpError):
            gw_cursor.decode_position("tools/list", gw_cursor.encode("tools/list", {"b": None}, retries), 1)
