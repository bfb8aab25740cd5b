"""The MCP endpoint: the body phase of the pipeline and the writing of answers.

POST only (GET/DELETE → 405, SHTTP §Earlier revisions). The body is read under a size cap,
validated into a `Call` (protocol/request.py), dispatched, and answered as
`application/json` or as `text/event-stream` relayed event by event. The revision has
neither sessions nor resumable streams; requests of initialize-era clients (an `initialize`,
a legacy `MCP-Protocol-Version`, an `Mcp-Session-Id`) and GET/DELETE go to the
`legacy_clients` seam when it is configured (gateway/legacy_clients/).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway import asgi, direct_stream
from gateway.backends.base import Message, Reply, aclose
from gateway.dispatch import Dispatcher
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse
from gateway.protocol.principal import principal_of
from gateway.protocol.request import Call, parse_call

log = logging.getLogger("gateway.endpoint")

_ALLOW = [(b"allow", b"POST")]


class McpEndpoint:
    def __init__(self, dispatcher: Dispatcher, *, max_body_bytes: int, keepalive_seconds: float,
                 legacy_clients: Any = None) -> None:
        self.dispatcher = dispatcher
        self.max_body_bytes = max_body_bytes
        self.keepalive_seconds = keepalive_seconds
        # The seam for serving initialize-era clients (digest §h.9); None = modern only.
        self.legacy_clients = legacy_clients

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        method = scope["method"]
        if method != "POST":
            if self.legacy_clients is not None and method in ("GET", "DELETE"):
                await self.legacy_clients(scope, receive, send)
                return
            await asgi.send_json(
                send, 405, rpc.error_message(None, rpc.INVALID_REQUEST, f"Method Not Allowed: {method}; use POST"),
                _ALLOW,
            )
            return
        headers = asgi.request_headers(scope)
        body = await asgi.read_body_or_refuse(receive, send, self.max_body_bytes)
        if body is None:
            return

        # Legacy clients are claimed before modern validation so that they never see a modern
        # error (digest §h.9); a modern request costs one header lookup here.
        if self.legacy_clients is not None and self.legacy_clients.claims(body, headers):
            await self.legacy_clients.handle(scope, body, headers, receive, send)
            return
        try:
            call = parse_call(body, headers, principal_of(scope))
        except rpc.McpError as exc:
            await asgi.send_error(send, exc)
            return
        if call.is_notification:
            await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return

        spec = call.spec
        assert spec is not None  # a request's method is in the table (parse_call, step 9)
        if spec.long_running:  # a client that goes away cancels the backend's work
            await self._answer_cancellable(call, receive, send)
        elif spec.stream_only:
            await self._answer_watching(call, receive, send, direct_stream.handover(scope))
        else:
            await self._answer(call, send)

    async def _answer(self, call: Call, send: asgi.Send) -> None:
        try:
            reply = await self.dispatcher.dispatch(call)
        except rpc.McpError as exc:
            await asgi.send_error(send, exc.with_id(call.id))
            return
        except Exception:
            log.exception("internal error answering %s", call.method)
            await asgi.send_json(send, 500, rpc.error_message(call.id, rpc.INTERNAL_ERROR,
                                                               "Internal error in the gateway"))
            return
        await self._write(reply, call, send)

    async def _answer_cancellable(self, call: Call, receive: asgi.Receive, send: asgi.Send) -> None:
        """Answer in this task, and cancel it (upstream included) when the client disconnects:
        closing the response stream is the modern cancellation (SHTTP §Cancellation).

        Nobody listens for the disconnect during the first `_WATCH_GRACE_SECONDS`: a watcher
        task is started only for calls that take longer. Most calls end well within it, and
        for them this saves two tasks and an `asyncio.wait`, many times what the grace timer
        costs (bench/README.md "Profile"). A client that leaves
        sooner is noticed when the grace ends; its call is cancelled all the same."""
        # One lookup of the loop: on Python 3.11 each `get_running_loop()` (which
        # `current_task()` without a loop makes too) is a getpid() system call.
        loop = asyncio.get_running_loop()
        request_task = asyncio.current_task(loop)
        assert request_task is not None
        watch = _DisconnectWatch(receive, request_task)
        timer = loop.call_later(_WATCH_GRACE_SECONDS, watch.start)
        try:
            await self._answer(call, send)
        except asyncio.CancelledError:
            if not watch.fired:
                raise  # the server's own cancellation (shutdown): not ours to swallow
        finally:
            timer.cancel()
            watch.stop()
            if watch.fired:
                request_task.uncancel()  # the cancellation was ours, and it is handled

    async def _answer_watching(self, call: Call, receive: asgi.Receive, send: asgi.Send,
                               handover: direct_stream.Handover | None) -> None:
        """Answer in a task of its own, and cancel everything (upstream included) when the
        client disconnects. Used for `subscriptions/listen`, whose hub cancels the answering
        task to cut a stalled reader (hub.py `ClientListen._owner`): that must end this
        request quietly, so the work cannot run in the request task itself. Its cost is
        paid once per stream, not per message; with a `handover` both tasks end once the
        ack is written (`_answer_listen`)."""
        work = asyncio.ensure_future(self._answer(call, send) if handover is None
                                     else self._answer_listen(call, send, handover))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancelled here too when the server itself cancels this request (shutdown).
            for task in (work, watcher):
                if not task.done():
                    task.cancel()
            for task in (work, watcher):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if work in done and not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]

    async def _answer_listen(self, call: Call, send: asgi.Send, handover: direct_stream.Handover) -> None:
        """A listen under a server that can hand its response body over (direct_stream.py):
        the stream's head goes through `send`, then the hub's client stream takes the
        connection and writes the ack and every later notification itself, and this request
        ends. An idle stream then holds no task, coroutine or queue (docs/subscriptions.md
        "Delivery")."""
        try:
            reply = await self.dispatcher.dispatch(call)
        except rpc.McpError as exc:
            await asgi.send_error(send, exc.with_id(call.id))
            return
        except Exception:
            log.exception("internal error answering %s", call.method)
            await asgi.send_json(send, 500, rpc.error_message(call.id, rpc.INTERNAL_ERROR,
                                                               "Internal error in the gateway"))
            return
        stream = reply.stream
        deliver_to = getattr(stream, "deliver_to", None)
        if deliver_to is None:
            await self._write(reply, call, send)
            return
        try:
            await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS + (reply.headers or [])})
            channel = handover.take_over()
        except BaseException:
            await reply.aclose()
            raise
        if channel is None:  # the client left before its ack
            await reply.aclose()
            return
        try:
            deliver_to(channel, self.keepalive_seconds)
        except BaseException:
            channel.cut()  # nobody else would ever end a body taken over
            await reply.aclose()
            raise

    async def _write(self, reply: Reply, call: Call, send: asgi.Send) -> None:
        extra = reply.headers or []
        if reply.stream is None:
            assert reply.message is not None
            body = reply.raw if reply.raw is not None else orjson.dumps(reply.message)
            await asgi.send_bytes(send, reply.status, body, asgi.JSON_HEADERS + extra)
            return
        await self._write_stream(reply, call, send, extra)

    async def _write_stream(self, reply: Reply, call: Call, send: asgi.Send,
                            extra: list[tuple[bytes, bytes]]) -> None:
        """Relay a stream event by event, with keep-alive comments on quiet stretches: one
        writer for every stream, a backend's made cancel-safe by `_PumpedStream` first."""
        stream = reply.stream
        assert stream is not None
        if not getattr(stream, "cancel_safe_next", False):
            stream = _PumpedStream(reply, call.id)
        await self._write_cancel_safe_stream(stream, call, send, extra)

    async def _write_cancel_safe_stream(self, stream: AsyncIterator[Message], call: Call, send: asgi.Send,
                                        extra: list[tuple[bytes, bytes]]) -> None:
        """Relay a stream whose `__anext__` may be cancelled and called again without losing
        a message (it sets `cancel_safe_next`; the hub's `ClientListen` does). It is read in
        this task under the keep-alive timeout, with no pump task and no queue hop: at
        10,000 listen streams that hop was most of the per-notification cost."""
        try:
            # Inside the try, as in `_write_stream`: a client gone (or a request cancelled) at
            # the very first write still closes the stream, so a listen is never left counted
            # and attached in the hub.
            await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS + extra})
            while True:
                try:
                    async with asyncio.timeout(self.keepalive_seconds):
                        item = await anext(stream)
                except TimeoutError:
                    await send({"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True})
                    continue
                except StopAsyncIteration:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                except rpc.McpError as exc:
                    # Headers are sent: the error travels as the stream's final message.
                    await send({"type": "http.response.body", "body": sse.encode(exc.with_id(call.id).to_message()),
                                "more_body": False})
                    return
                final = "method" not in item
                await send({"type": "http.response.body", "body": sse.encode(item), "more_body": not final})
                if final:
                    return
        finally:
            await aclose(stream)


class _PumpedStream:
    """A backend's stream, readable under a timeout. A generator cannot be awaited under one:
    cancelling its `__anext__` finishes it. So a task reads it into a bounded queue, and
    `__anext__` takes from the queue, which a timeout may cancel and call again without losing
    a message. A backend's failure ends the stream as an `McpError` (a broken backend must not
    break the client's stream framing); `aclose` stops the task and releases the reply."""

    cancel_safe_next = True
    __slots__ = ("_reply", "_queue", "_pump")

    def __init__(self, reply: Reply, call_id: rpc.RequestId | None) -> None:
        assert reply.stream is not None
        self._reply = reply
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=64)
        self._pump = asyncio.ensure_future(self._run(reply.stream, reply.backend, call_id))

    async def _run(self, stream: AsyncIterator[Message], backend: str, call_id: rpc.RequestId | None) -> None:
        queue = self._queue
        try:
            async for message in stream:
                await queue.put(("msg", message))
            await queue.put(("end", None))
        except rpc.McpError as exc:
            await queue.put(("err", exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("stream from backend failed")
            await queue.put(("err", rpc.backend_protocol_error(backend, repr(exc), call_id)))

    def __aiter__(self) -> _PumpedStream:
        return self

    async def __anext__(self) -> Message:
        kind, item = await self._queue.get()
        if kind == "msg":
            return item  # type: ignore[no-any-return]
        if kind == "err":
            raise item
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._pump
        await self._reply.aclose()


# How long a call runs before a watcher task listens for its client's disconnect.
_WATCH_GRACE_SECONDS = 0.05


class _DisconnectWatch:
    """Cancels `task` when the client disconnects, once started (see `_answer_cancellable`)."""

    __slots__ = ("_receive", "_task", "_watcher", "fired")

    def __init__(self, receive: asgi.Receive, task: asyncio.Task[Any]) -> None:
        self._receive = receive
        self._task = task
        self._watcher: asyncio.Task[None] | None = None
        self.fired = False

    def start(self) -> None:
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        await _wait_disconnect(self._receive)
        if not self._task.done():
            self.fired = True
            self._task.cancel()

    def stop(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()


async def _wait_disconnect(receive: asgi.Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
