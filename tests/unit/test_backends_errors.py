"""The one map from upstream failures to the gateway's errors (gateway/backends/errors.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.backends.errors import (ConnectError, ConnectTimeout, ResponseTooLarge, UpstreamConnectionError,
                                     upstream_errors)
from gateway.protocol import jsonrpc as rpc


@pytest.mark.parametrize(("raised", "code", "status", "says"), [
    (ConnectError("cannot connect to 127.0.0.1:1: Connection refused"), rpc.BACKEND_UNAVAILABLE, 502,
     "is unavailable: cannot connect to 127.0.0.1:1"),
    (UpstreamConnectionError("connection closed before the response was complete"), rpc.BACKEND_UNAVAILABLE, 502,
     "is unavailable: connection closed before the response was complete"),
    (ConnectTimeout(0.5), rpc.BACKEND_TIMEOUT, 504, "did not answer within 0.5s"),
    (TimeoutError("no data"), rpc.BACKEND_TIMEOUT, 504, "did not answer within 7s"),
    (ResponseTooLarge(10), rpc.BACKEND_PROTOCOL_ERROR, 502, "exceeds 10 bytes (backends[].max_response_bytes)"),
])
def test_each_lower_layer_failure_becomes_the_gateway_error_naming_the_backend(
        raised: Exception, code: int, status: int, says: str) -> None:
    with pytest.raises(rpc.McpError) as caught, upstream_errors("b1", timeout=7, request_id=42):
        raise raised
    error = caught.value
    assert (error.code, error.status, error.data) == (code, status, {"backend": "b1"})
    assert error.message.startswith("Backend 'b1'") and says in error.message
    assert error.to_message()["id"] == 42
    assert error.__suppress_context__  # the lower layer's traceback is not the client's business


def test_what_says_what_broke_before_the_lower_layers_words() -> None:
    with pytest.raises(rpc.McpError) as caught, upstream_errors("b1", timeout=1, what="stream broke"):
        raise UpstreamConnectionError("reset")
    assert caught.value.message == "Backend 'b1' is unavailable: stream broke: reset"


def test_gateway_errors_and_bugs_pass_through_untouched() -> None:
    mine = rpc.backend_protocol_error("b1", "not JSON")
    with pytest.raises(rpc.McpError) as caught, upstream_errors("b1", timeout=1):
        raise mine
    assert caught.value is mine
    with pytest.raises(KeyError), upstream_errors("b1", timeout=1):
        raise KeyError("a bug is not a backend failure")
    with upstream_errors("b1", timeout=1):
        pass  # nothing raised, nothing mapped


async def test_the_map_spans_a_streams_iteration_but_not_what_is_thrown_in_at_a_yield() -> None:
    async def stream() -> AsyncIterator[int]:
        with upstream_errors("b1", timeout=1, what="stream broke"):
            yield 1
            raise UpstreamConnectionError("reset after the first event")

    events = stream()
    assert await anext(events) == 1
    with pytest.raises(rpc.McpError, match="stream broke: reset after the first event"):
        await anext(events)
    closing = stream()
    await anext(closing)
    await closing.aclose()  # GeneratorExit at the yield is not a failure to map
