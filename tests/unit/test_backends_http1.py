"""The lean HTTP/1.1 client (gateway/backends/http1.py) against real loopback servers.

Each server is a raw asyncio server (tests/support/raw_http.py) that answers with exactly the
bytes a test chooses, so the framings the client must handle (Content-Length, chunked,
streamed, cut short) are real socket traffic, not mocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.backends import http1
from gateway.backends.errors import ConnectError, ConnectTimeout
from gateway.backends.http1 import _HIGH_WATER, Http1Client, UpstreamConnectionError
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse
from tests.support.raw_http import full_backlog, json_answer, read_request, serve, sse_chunk


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive: answers every request on the connection with its own body."""
    while True:
        _, _, body = await read_request(reader)
        writer.write(json_answer(body))
        await writer.drain()


async def test_a_json_answer_is_read_and_the_connection_is_reused() -> None:
    async with serve(echo_forever) as (url, connections):
        client = Http1Client("b", max_connections=4, connect_timeout=5)
        for n in range(3):
            response = await client.post(url, b'{"n": %d}' % n, {"mcp-method": "tools/call"}, read_timeout=5)
            assert (response.status, response.content_type) == (200, "application/json")
            assert await response.read() == b'{"n": %d}' % n
        await client.aclose()
    assert len(connections) == 1


async def test_the_request_carries_the_headers_host_and_length() -> None:
    seen: list[tuple[bytes, dict[str, str], bytes]] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(json_answer(b"{}"))

    async with serve(record) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url + "?x=1", b"[1]", {"mcp-name": "echo"}, read_timeout=5)
        await response.read()
        await client.aclose()
    line, headers, body = seen[0]
    assert line == b"POST /mcp?x=1 HTTP/1.1"
    assert headers["host"] == url.split("/")[2]
    assert headers["mcp-name"] == "echo"
    assert headers["accept-encoding"] == "identity"
    assert body == b"[1]"


async def test_a_chunked_stream_arrives_piece_by_piece() -> None:
    release = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        first = b'event: message\ndata: {"method":"notifications/progress"}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(first), first))
        await writer.drain()
        await release.wait()
        last = b'event: message\ndata: {"id":1,"result":{}}\n\n'
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
        await writer.drain()

    async with serve(stream) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        assert response.content_type == "text/event-stream"
        messages = response.sse_messages()
        assert await anext(messages) == {"method": "notifications/progress"}  # before the rest is sent
        release.set()
        assert await anext(messages) == {"id": 1, "result": {}}
        with pytest.raises(StopAsyncIteration):
            await anext(messages)
        await client.aclose()


async def test_a_connection_cut_mid_body_is_a_connection_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"par")
        await writer.drain()

    async with serve(cut) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        with pytest.raises(UpstreamConnectionError, match="before the response was complete"):
            await response.read()
        # The only slot came back: the next request gets a new connection.
        again = await asyncio.wait_for(client.post(url, b"{}", {}, read_timeout=5), 5)
        assert again.status == 200
        again.close()
        await client.aclose()


async def test_a_silent_backend_times_out_and_an_absent_one_is_unavailable() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    async with serve(silent) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        with pytest.raises(rpc.McpError) as caught:
            await client.post(url, b"{}", {}, read_timeout=0.2)
        assert caught.value.code == rpc.BACKEND_TIMEOUT
        await client.aclose()
    client = Http1Client("b", max_connections=1, connect_timeout=5)
    with pytest.raises(rpc.McpError) as caught:
        await client.post(url, b"{}", {}, read_timeout=1)  # the server is gone
    assert caught.value.code == rpc.BACKEND_UNAVAILABLE
    assert "'b'" in caught.value.message and "cannot connect" in caught.value.message


async def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    async with serve(echo_forever) as (url, connections):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        with pytest.raises(rpc.McpError, match="line break"):
            await client.post(url, b"{}", {"mcp-param-x": "a\r\nx-injected: 1"}, read_timeout=5)
        await client.aclose()
    assert connections == []


async def test_a_coded_answer_is_refused() -> None:
    async def gzip_anyway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(json_answer(b"\x1f\x8b", extra=b"content-encoding: gzip\r\n"))

    async with serve(gzip_anyway) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        with pytest.raises(rpc.McpError, match="content-encoding 'gzip'") as caught:
            await client.post(url, b"{}", {}, read_timeout=5)
        assert caught.value.code == rpc.BACKEND_PROTOCOL_ERROR
        await client.aclose()


async def test_max_connections_bounds_the_connections_in_use() -> None:
    gate = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, _, body = await read_request(reader)
            await gate.wait()
            writer.write(json_answer(body))
            await writer.drain()

    async with serve(held) as (url, connections):
        client = Http1Client("b", max_connections=2, connect_timeout=5)

        async def call(n: int) -> bytes:
            response = await client.post(url, b"%d" % n, {}, read_timeout=5)
            return await response.read()

        calls = [asyncio.ensure_future(call(n)) for n in range(5)]
        for _ in range(500):
            if len(connections) >= 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert len(connections) == 2  # the other three wait for a slot
        assert not any(c.done() for c in calls)
        gate.set()
        assert sorted(await asyncio.gather(*calls)) == [b"0", b"1", b"2", b"3", b"4"]
        assert len(connections) == 2
        await client.aclose()


async def test_events_keep_the_last_event_id_and_finish_returns_the_connection() -> None:
    # The legacy transport reads a POST stream as events (priming event included), stops at
    # the response, then `finish` drains the rest so the connection is reused.
    async def stream_then_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(sse_chunk(b"id: e0\nretry: 250\ndata:\n\n"))
        writer.write(sse_chunk(b'id: e1\nevent: message\ndata: {"id":1,"result":{}}\n\n'))
        await writer.drain()
        await asyncio.sleep(0.05)  # the stream ends after the response, a little later
        writer.write(b"0\r\n\r\n")
        await echo_forever(reader, writer)

    async with serve(stream_then_echo) as (url, connections):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        decoder = sse.Decoder()
        seen = []
        async for event, data in response.events(decoder):
            seen.append((event, data))
            if data:
                break
        assert seen == [("message", ""), ("message", '{"id":1,"result":{}}')]
        assert (decoder.last_event_id, decoder.retry_ms) == ("e1", 250)
        await response.finish(5)
        again = await client.post(url, b"[2]", {}, read_timeout=5)
        assert await again.read() == b"[2]"
        await client.aclose()
    assert len(connections) == 1


async def test_finish_closes_a_stream_that_does_not_end() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(sse_chunk(b'data: {"id":1,"result":{}}\n\n'))
        await writer.drain()
        await echo_forever(reader, writer)  # never ends the stream: what it reads is garbage to it

    async with serve(endless) as (url, connections):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        await response.finish(0.05)
        # The slot is free again and the next request gets a new connection.
        again = await client.post(url, b"[3]", {}, read_timeout=5)
        assert again.status == 200
        again.close()
        await client.aclose()
    assert len(connections) == 2


async def test_finish_soon_drops_the_rest_and_returns_the_connection_without_a_task() -> None:
    # What the legacy transport does after the response event: no reader waits for the end;
    # the connection's callbacks drop the rest (one more event here) and pool it at the end.
    async def stream_then_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(sse_chunk(b'data: {"id":1,"result":{}}\n\n'))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(sse_chunk(b'data: {"method":"notifications/message"}\n\n'))
        writer.write(b"0\r\n\r\n")
        await echo_forever(reader, writer)

    async with serve(stream_then_echo) as (url, connections):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        async for _event, data in response.events(sse.Decoder()):
            if data:
                break
        tasks = len(asyncio.all_tasks())
        response.finish_soon(5)
        assert len(asyncio.all_tasks()) == tasks
        # The one slot comes back when the stream ends; the next request reuses the connection.
        again = await client.post(url, b"[2]", {}, read_timeout=5)
        assert await again.read() == b"[2]"
        await client.aclose()
    assert len(connections) == 1


@pytest.mark.parametrize("ending", ["never", "connection closed"])
async def test_finish_soon_closes_a_stream_that_does_not_end(ending) -> None:
    async def unended(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(sse_chunk(b'data: {"id":1,"result":{}}\n\n'))
        await writer.drain()
        if ending == "connection closed":
            await asyncio.sleep(0.05)
            writer.close()
            return
        await echo_forever(reader, writer)

    async with serve(unended) as (url, connections):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        response.finish_soon(0.2 if ending == "never" else 5)
        # The slot is free again once the stream is given up (timer) or lost, and the next
        # request gets a new connection.
        again = await client.post(url, b"[3]", {}, read_timeout=5)
        assert again.status == 200
        again.close()
        await client.aclose()
    assert len(connections) == 2


async def test_a_body_larger_than_the_flow_control_mark_is_read_whole() -> None:
    # read() must keep taking bytes as they come: a 4 MiB answer once paused the socket at
    # 256 KiB and waited for a read timeout.
    big = b'{"x":"' + b"a" * (4 * 1024 * 1024) + b'"}'

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(json_answer(big))
        await writer.drain()

    async with serve(answer) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        assert await asyncio.wait_for(response.read(), 20) == big
        await client.aclose()


async def test_a_stream_nobody_reads_pauses_the_socket_and_loses_nothing_when_read() -> None:
    # A relayed stream whose client reads slowly: past the flow-control mark the client stops
    # reading the socket (the backend is held back by TCP, the gateway's memory by the mark),
    # and reading again resumes it with every byte in order.
    events = [b"data: %d %s\n\n" % (n, b"x" * 16 * 1024) for n in range(64)]  # ~1 MiB

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for data in events:
            writer.write(sse_chunk(data))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # the connection stays open: its end is no reason to stop reading

    async with serve(flood) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        opened = track_connections(client)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        await until(lambda: response._buffered > _HIGH_WATER)
        assert not opened[0].transport.is_reading()  # paused, not buffering without end
        body = b"".join([chunk async for chunk in response.iter_chunks()])
        assert body == b"".join(events)
        response.release()
        await client.aclose()


async def test_a_body_delimited_by_the_end_of_the_connection() -> None:
    # No Content-Length, not chunked: the body ends when the server closes (RFC 9112 §6.3).
    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"ok\":true}")
        await writer.drain()

    async with serve(close_delimited) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.post(url, b"{}", {}, read_timeout=5)
        assert await asyncio.wait_for(response.read(), 10) == b'{"ok":true}'
        # That connection is not reused; the next request opens another and succeeds.
        again = await asyncio.wait_for(client.post(url, b"{}", {}, read_timeout=5), 5)
        assert await asyncio.wait_for(again.read(), 10) == b'{"ok":true}'
        await client.aclose()


async def test_a_full_pool_refuses_clearly_instead_of_queueing_forever() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(30)  # the stream never ends

    async with serve(hold) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=0.5)
        held = await client.post(url, b"{}", {}, read_timeout=None)
        with pytest.raises(rpc.McpError) as refused:
            await client.post(url, b"{}", {}, read_timeout=5)
        assert refused.value.code == rpc.GATEWAY_OVERLOADED
        assert refused.value.data["backend"] == "b"
        held.close()
        await client.aclose()


async def test_a_stream_reply_closed_unread_gives_its_connection_back() -> None:
    # An async generator that never started runs no `finally` when closed: the Reply's closers
    # release the upstream response anyway (gateway/backends/base.py Reply.closers).
    from gateway.backends.base import internal_call
    from gateway.backends.modern import ModernHttpBackend
    from gateway.settings import BackendSettings

    async def sse_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()

    async with serve(sse_forever) as (url, _):
        backend = ModernHttpBackend(BackendSettings(name="s", url=url, max_connections=1,
                                                    connect_timeout_seconds=0.5))
        for _ in range(3):  # with the slot leaked, the second call would be refused
            reply = await backend.send(internal_call("tools/call", {"name": "x"}))
            assert reply.stream is not None
            await reply.aclose()
        await backend.aclose()


async def test_an_idle_connection_past_its_keepalive_expiry_is_not_reused() -> None:
    # Servers drop idle connections after their own keep-alive timeout; a request written
    # into one that is closing fails. The pool retires them first (http1._Pool).
    async with serve(echo_forever) as (url, connections):
        client = Http1Client("b", max_connections=4, connect_timeout=5, keepalive_expiry=0.2)
        for pause in (0.0, 0.05, 0.3, 0.0):
            await asyncio.sleep(pause)
            response = await client.post(url, b"{}", {}, read_timeout=5)
            assert await response.read() == b"{}"
        await client.aclose()
    # Reused after 0 s and 0.05 s, a new one after 0.3 s, reused again right after.
    assert len(connections) == 2


async def test_a_body_of_known_length_is_waited_for_with_its_head_and_a_stream_is_not() -> None:
    """A head that arrives alone (uvicorn writes it at http.response.start) does not wake the
    caller when a Content-Length body follows: post() returns with the body in, one wakeup
    instead of two. A stream without a length is handed over at its head, before any event."""
    head_sent: asyncio.Queue[bool] = asyncio.Queue()
    go_on = asyncio.Event()

    async def head_then_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers, _ = await read_request(reader)
        streamed = headers.get("mcp-method") == "subscriptions/listen"
        if streamed:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n")
        await writer.drain()
        await head_sent.put(streamed)
        await go_on.wait()
        writer.write(sse_chunk(b"data: {}\n\n") + b"0\r\n\r\n" if streamed else b'{"ok":true}')
        await writer.drain()

    async with serve(head_then_body) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        opened = track_connections(client)
        pending = asyncio.ensure_future(client.post(url, b"{}", {"mcp-method": "tools/call"}, read_timeout=5))
        assert await asyncio.wait_for(head_sent.get(), 5) is False
        await until(lambda: opened[0].response is not None and opened[0].response.headers_received)
        await asyncio.sleep(0)  # a wakeup of the caller would have run by now
        assert not pending.done(), "post() returned on a head whose body was still to come"
        go_on.set()
        response = await asyncio.wait_for(pending, 5)
        assert response.complete  # the body came with the return: read() will not wait
        assert await response.read() == b'{"ok":true}'

        go_on.clear()
        stream = await asyncio.wait_for(
            client.post(url, b"{}", {"mcp-method": "subscriptions/listen"}, read_timeout=5), 5)
        assert await asyncio.wait_for(head_sent.get(), 5) is True
        assert stream.content_type == "text/event-stream" and not stream.complete
        go_on.set()
        assert [data async for _, data in stream.events(sse.Decoder())] == ["{}"]
        stream.release()
        await client.aclose()




async def test_a_head_whose_body_never_follows_times_out() -> None:
    async def head_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    async with serve(head_only) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        with pytest.raises(rpc.McpError) as caught:
            await client.post(url, b"{}", {}, read_timeout=0.2)
        assert caught.value.code == rpc.BACKEND_TIMEOUT and "'b'" in caught.value.message
        await client.aclose()


def track_connections(client: Http1Client) -> list[Any]:
    """The connections `client` opens, in order (to look at a response while it is read)."""
    opened: list[Any] = []
    connect = client._connect

    async def tracking(*args: Any) -> Any:
        connection = await connect(*args)
        opened.append(connection)
        return connection

    client._connect = tracking  # type: ignore[method-assign]
    return opened


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


@pytest.mark.parametrize("when", ["with the answer", "once idle"])
async def test_bytes_after_the_answer_retire_the_connection(when: str) -> None:
    """A server that writes more than the answer (a `408` before it closes, a broken one) has
    left the connection in an unknown state: a partial head kept in the parser would become the
    start of the next request's answer. Whether the bytes come in the answer's segment or
    while the connection idles in the pool, it is closed, and the next request gets a new
    connection and its own answer."""
    answered = asyncio.Event()
    closed_by_client = asyncio.Event()
    stray = b"HTTP/1.1 408 Request Timeout\r\ncontent-"  # cut: the rest never comes

    async def answers_then_babbles(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, _, body = await read_request(reader)
        if len(connections) > 1:
            writer.write(json_answer(body))
            await echo_forever(reader, writer)
            return
        if when == "with the answer":
            writer.write(json_answer(body) + stray)
        else:
            writer.write(json_answer(body))
            await answered.wait()
            writer.write(stray)
        await writer.drain()
        if await reader.read() == b"":
            closed_by_client.set()

    async with serve(answers_then_babbles) as (url, connections):
        client = Http1Client("b", max_connections=4, connect_timeout=5)
        first = await client.post(url, b'{"n": 1}', {}, read_timeout=5)
        assert await first.read() == b'{"n": 1}'
        answered.set()
        await asyncio.wait_for(closed_by_client.wait(), 5)
        second = await client.post(url, b'{"n": 2}', {}, read_timeout=5)
        assert (second.status, await second.read()) == (200, b'{"n": 2}')
        await client.aclose()
    assert len(connections) == 2


# -- every method the gateway sends upstream (GET streams, DELETE; the era probe's phases) ----


async def test_get_and_delete_carry_no_body_and_reuse_the_connection() -> None:
    seen: list[tuple[bytes, dict[str, str], bytes]] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            seen.append(request)
            writer.write(json_answer(b"{}"))
            await writer.drain()

    async with serve(record) as (url, connections):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        for method in ("GET", "DELETE", "POST"):
            response = await client.request(method, url, {"mcp-session-id": "s1"},
                                            body=b"{}" if method == "POST" else None, read_timeout=5)
            assert response.status == 200 and await response.read() == b"{}"
        await client.aclose()
    assert [line for line, _, _ in seen] == [b"GET /mcp HTTP/1.1", b"DELETE /mcp HTTP/1.1", b"POST /mcp HTTP/1.1"]
    assert "content-length" not in seen[0][1] and "content-length" not in seen[1][1]
    assert seen[2][1]["content-length"] == "2"
    assert all(headers["mcp-session-id"] == "s1" for _, headers, _ in seen)
    assert len(connections) == 1


async def test_a_get_stream_without_a_read_timeout_waits_for_its_events() -> None:
    async def slow_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(0.3)  # longer than any read timeout would allow
        writer.write(sse_chunk(b"event: endpoint\ndata: /messages?s=1\n\n"))
        await writer.drain()
        await asyncio.sleep(30)

    async with serve(slow_stream) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.request("GET", url, {"accept": "text/event-stream"}, read_timeout=None)
        events = response.events(sse.Decoder())
        assert await asyncio.wait_for(anext(events), 5) == ("endpoint", "/messages?s=1")
        response.close()
        await client.aclose()


async def test_request_raw_tells_the_phase_of_a_failure() -> None:
    client = Http1Client("b", max_connections=1, connect_timeout=0.3)
    with full_backlog() as url, pytest.raises(ConnectTimeout):
        await client.request_raw("POST", url, {}, body=b"{}", read_timeout=5)
    async with serve(echo_forever) as (url, _):
        pass  # closed again: nothing listens there now
    with pytest.raises(ConnectError, match="cannot connect"):
        await client.request_raw("GET", url, {}, read_timeout=5)

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    async with serve(silent) as (url, _):
        with pytest.raises(TimeoutError) as read_timeout:
            await client.request_raw("POST", url, {}, body=b"{}", read_timeout=0.2)
        assert not isinstance(read_timeout.value, ConnectTimeout)
    await client.aclose()


async def test_closing_a_stream_wakes_the_task_that_reads_it() -> None:
    # A legacy session that ends closes its GET stream from another task than the reader's;
    # the reader waited for ever (no read timeout on a GET stream), and the listen never moved
    # to the renewed session.
    async def stream_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    async with serve(stream_forever) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        response = await client.request("GET", url, {}, read_timeout=None)

        async def read_all() -> None:
            async for _ in response.events(sse.Decoder()):
                pass

        reading = asyncio.ensure_future(read_all())
        await asyncio.sleep(0.05)
        response.close()
        with pytest.raises(UpstreamConnectionError, match="closed before it was complete"):
            await asyncio.wait_for(reading, 2)
        await client.aclose()


def _serialized_header_by_header(head: bytes, headers: dict[str, str], body: bytes | None) -> bytes:
    """The request as the header-by-header loop wrote it, before `_serialize` joined first."""
    lines = []
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} has a line break in its value")
        lines.append(f"{name}: {value}\r\n")
    if body is None:
        return head + ("".join(lines) + "\r\n").encode("latin-1")
    return head + ("".join(lines) + f"content-length: {len(body)}\r\n\r\n").encode("latin-1") + body


@pytest.mark.parametrize("body", [b'{"jsonrpc":"2.0"}', b"", None])
def test_serialize_writes_what_a_check_per_header_wrote_and_finds_every_line_break(body: bytes | None) -> None:
    head = b"POST /mcp HTTP/1.1\r\nhost: b\r\n"
    plain = {"content-type": "application/json", "mcp-name": "caf\u00e9", "x-request-id": "abc", "empty": ""}
    assert http1._serialize(head, plain, body) == _serialized_header_by_header(head, plain, body)
    assert http1._serialize(head, {}, body) == _serialized_header_by_header(head, {}, body)
    for broken in ("a\rb", "a\nb", "\r\n", "a\r\n\r\nx", "\n"):
        for headers in ({**plain, "mcp-param-x": broken}, {**plain, f"x{broken}": "v"}):
            with pytest.raises(ValueError, match="line break") as caught:
                http1._serialize(head, headers, body)
            bad = next(n for n in headers if n.startswith("mcp-param-x") or "\r" in n or "\n" in n)
            assert repr(bad) in str(caught.value)


async def test_answer_headers_lower_case_names_keep_the_first_of_a_repeated_one_and_read_the_media_type() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Type: Application/JSON; charset=utf-8\r\nX-Seen: first\r\nx-seen: second\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nCONTENT-TYPE: Text/Event-Stream \r\ncontent-length: 2\r\n\r\n{}",
    ]

    async def answer_in_turn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers * 2:  # the second time from the remembered names and media types
            await read_request(reader)
            writer.write(answer)
            await writer.drain()

    async with serve(answer_in_turn) as (url, _):
        client = Http1Client("b", max_connections=1, connect_timeout=5)
        seen = []
        for _ in range(len(answers) * 2):
            response = await client.post(url, b"{}", {}, read_timeout=5)
            seen.append((response.content_type, response.headers.get("x-seen"), sorted(response.headers)))
            await response.read()
        await client.aclose()
    first = ("application/json", "first", ["content-length", "content-type", "x-seen"])
    plain = ("application/json", None, ["content-length", "content-type"])
    stream = ("text/event-stream", None, ["content-length", "content-type"])
    assert seen == [first, plain, stream] * 2


async def test_the_connection_slots_behave_as_the_semaphore_they_replace() -> None:
    """http1 `_Slots` (a free slot taken without a coroutine): the same grants, in the same
    order, as an asyncio.Semaphore of that size for a script of takes, waits, releases and
    waiters that give up, a slot handed over just as its waiter gave up included."""
    from gateway.backends.http1 import _Slots

    async def run(kind: str) -> list[str]:
        seen: list[str] = []
        slots = _Slots(2) if kind == "slots" else asyncio.Semaphore(2)

        async def caller(name: str, hold: float) -> None:
            if kind == "slots":
                if not slots.take():
                    await slots.wait()
            else:
                await slots.acquire()
            seen.append(f"+{name}")
            await asyncio.sleep(hold)
            seen.append(f"-{name}")
            slots.release()

        tasks = {n: asyncio.create_task(caller(n, h)) for n, h in
                 [("a", 0.05), ("b", 0.2), ("c", 0.05), ("d", 0.05), ("e", 0.05)]}
        await asyncio.sleep(0.01)
        tasks["d"].cancel()  # gives up while waiting: never granted, nothing lost
        await asyncio.sleep(0.035)  # a's slot goes to c (the oldest waiter)
        tasks["e"].cancel()  # cancelled as the slot may be changing hands: passed on, not lost
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        late = asyncio.create_task(caller("f", 0))
        await late
        free = slots.free if kind == "slots" else slots._value
        return seen + [f"free={free}"]

    assert await run("slots") == await run("semaphore")
    assert (await run("slots"))[-1] == "free=2"


async def test_a_slot_handed_to_a_waiter_that_gives_up_is_passed_on() -> None:
    from gateway.backends.http1 import _Slots

    slots = _Slots(1)
    assert slots.take() and not slots.take()
    first = asyncio.create_task(slots.wait())
    second = asyncio.create_task(slots.wait())
    await asyncio.sleep(0)
    slots.release()  # handed to `first`...
    first.cancel()  # ...which gives up before it runs: `second` gets it
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)
    assert slots.free == 0
    slots.release()
    assert slots.free == 1 and slots.take()
