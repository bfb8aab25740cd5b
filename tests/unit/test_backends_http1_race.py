"""The keep-alive race (http1.py; docs/resilience.md "The keep-alive race"): a server closes a
pooled connection just as the gateway writes a request on it.

What the kernel says decides what happens next, and each case is played with a real server
in a thread (its own sockets, so that it closes while the gateway's loop is not looking):

- the server closed while idle and its FIN is already in the kernel: the connection is not
  used (the pool asks the kernel before each reuse);
- FIN, then a RST for the request that reached the closed socket: provably unread, so it is
  sent again on a fresh connection, whatever the method;
- a RST alone with no answer on a kept-alive connection (the server closed with the request
  unread in its socket): sent again likewise;
- the server read the request and then closed (a FIN and nothing after): it may have run, so
  it is not sent again and the caller hears the failure.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
import asyncio
import contextlib

import pytest

from gateway.backends.errors import RequestNotRead, UpstreamConnectionError
from gateway.backends import http1
from gateway.backends.http1 import Http1Client

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="the kernel's TCP_INFO is Linux's")

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
RESENT = "sending it again"

# What the server does on its n-th connection, with the connected socket.
Script = Callable[[socket.socket], None]


def read_one(sock: socket.socket) -> bytes:
    """One whole request (the gateway's: head and Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += sock.recv(65536)
    return data


def wait_readable(sock: socket.socket) -> None:
    """Until the next request's bytes are in the socket, unread."""
    select.select([sock], [], [], 5)


def answers(sock: socket.socket) -> None:
    while read_one(sock):
        sock.sendall(ANSWER)


@contextlib.contextmanager
def threaded_server(*scripts: Script) -> Iterator[tuple[str, list[int]]]:
    """A loopback server in a thread: connection n runs scripts[n] (the last one repeats)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[int] = []

    def run() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            script = scripts[min(len(accepted), len(scripts) - 1)]
            accepted.append(1)
            threading.Thread(target=_run_one, args=(script, sock), daemon=True).start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/mcp", accepted
    finally:
        listener.close()


def _run_one(script: Script, sock: socket.socket) -> None:
    try:
        script(sock)
    except OSError:
        pass
    finally:
        sock.close()


async def post(client: Http1Client, url: str) -> bytes:
    response = await client.request_raw("POST", url, {"content-type": "application/json"}, body=b'{"x": 1}',
                                        read_timeout=5)
    return await response.read()


def answer_once_then(then: Callable[[socket.socket], None]) -> Script:
    def script(sock: socket.socket) -> None:
        read_one(sock)
        sock.sendall(ANSWER)
        then(sock)
    return script


def fin_then_rst(sock: socket.socket) -> None:
    # Closed idle (a FIN) just after the answer, while the client waits to send its next
    # request on the pooled connection: the request reaches a closed socket, whose kernel
    # answers it with a RST (RFC 9293 §3.10.7.1) with no thread of this server involved.
    time.sleep(0.005)


def fin_then_rst_at_once(sock: socket.socket) -> None:
    # The request is in the socket, unread: a FIN, then the close resets it.
    wait_readable(sock)
    sock.shutdown(socket.SHUT_WR)
    sock.close()


def rst_unread(sock: socket.socket) -> None:
    wait_readable(sock)  # closed with the request unread: a RST, no FIN first


def read_then_close(sock: socket.socket) -> None:
    read_one(sock)  # read (it may have run), then a FIN and no answer


def close_at_once(sock: socket.socket) -> None:
    pass  # closed idle, right after the first answer


@pytest.mark.parametrize(("closing", "pause"), [(fin_then_rst, 0.03), (rst_unread, 0.0)],
                         ids=["fin-then-rst", "rst-unread"])
async def test_a_request_the_kernel_proves_unread_is_sent_again_on_a_fresh_connection(closing, pause, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.backends.http1")
    with threaded_server(answer_once_then(closing), answers) as (url, accepted):
        client = Http1Client("b", max_connections=4, connect_timeout=2)
        assert await post(client, url) == b"{}"
        # The loop does not run (a blocking sleep) while the server closes, and the pause is
        # shorter than the idle time after which the pool asks the kernel first: the request
        # is written on the closed connection, as in the race.
        time.sleep(pause)
        # A POST (not idempotent) on the pooled connection the server closes as it arrives.
        assert await post(client, url) == b"{}"
        await client.aclose()
    assert len(accepted) == 2
    assert RESENT in caplog.text


async def test_a_request_the_server_read_before_closing_is_not_sent_again(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.backends.http1")
    with threaded_server(answer_once_then(read_then_close), answers) as (url, accepted):
        client = Http1Client("b", max_connections=4, connect_timeout=2)
        assert await post(client, url) == b"{}"
        with pytest.raises(UpstreamConnectionError) as failure:
            await client.request_raw("POST", url, {}, body=b"{}", read_timeout=5)
        await client.aclose()
    assert not isinstance(failure.value, RequestNotRead)
    assert "(no answer)" in str(failure.value)
    assert len(accepted) == 1 and RESENT not in caplog.text


async def test_a_pooled_connection_the_server_closed_while_idle_is_not_used(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.backends.http1")
    with threaded_server(answer_once_then(close_at_once), answers) as (url, accepted):
        client = Http1Client("b", max_connections=4, connect_timeout=2)
        assert await post(client, url) == b"{}"
        # The server's FIN reaches the kernel while this loop is not running (a blocking
        # sleep): only the kernel knows the pooled connection is closed.
        time.sleep(0.1)
        assert await post(client, url) == b"{}"
        await client.aclose()
    assert len(accepted) == 2
    assert RESENT not in caplog.text  # never written on the closed one


async def test_a_fresh_connection_reset_unread_is_never_sent_and_not_resent_in_a_loop(monkeypatch) -> None:
    # FIN then RST on a fresh connection: unread, so marked never sent (another endpoint may
    # take it, errors.gateway_error), but not resent by the client itself (a server that
    # refuses every connection so would be asked forever). The RST comes from this server's
    # thread here, not from its kernel at once: the wait for it is stretched so that a
    # loaded machine's scheduling cannot pass for "no RST".
    monkeypatch.setattr(http1, "_RST_WAIT_MIN", 1.0)
    with threaded_server(fin_then_rst_at_once) as (url, accepted):
        client = Http1Client("b", max_connections=4, connect_timeout=2)
        with pytest.raises(RequestNotRead):
            await client.request_raw("POST", url, {}, body=b"{}", read_timeout=5)
        await client.aclose()
    assert len(accepted) == 1


async def test_a_pooled_connection_whose_fin_the_loop_just_read_is_not_used(caplog) -> None:
    # The FIN read while the connection is idle in the pool: the loop closes the transport at
    # once, but its connection_lost runs a loop pass later. A request taken from the pool in
    # between would be written to a closed transport (which drops it without a word) and then
    # fail with no answer and no proof of anything: the pool must not hand it out.
    with threaded_server(answer_once_then(close_at_once), answers) as (url, accepted):
        client = Http1Client("b", max_connections=4, connect_timeout=2)
        assert await post(client, url) == b"{}"
        (pool,) = client._pools.values()
        (connection, _), = pool._idle
        deadline = time.monotonic() + 5
        while not connection.transport.is_closing():  # the loop has read the FIN
            assert time.monotonic() < deadline, "the server's FIN never arrived"
            await asyncio.sleep(0)
        assert connection.response is None and connection.transport.get_extra_info("socket") is not None
        # connection_lost has not run yet: this request comes first.
        assert await post(client, url) == b"{}"
        await client.aclose()
    assert len(accepted) == 2
