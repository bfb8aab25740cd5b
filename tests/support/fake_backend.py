"""One in-process backend for unit tests of the request core, driven by a handler function.

The model is httpx's `MockTransport`: the test says what the backend answers, as a function
of the call it gets, and reads back the calls it got. Nothing about transports or eras is
simulated; what the dispatcher, the endpoint and `Backend.discover` do with an answer is what
these tests check. Over real sockets and processes, the integration tests do the rest.

    backend = FakeBackend(answers({"tools/list": {"tools": [...]}, "tools/call": {"content": []}}))
    backend = FakeBackend(lambda call: stream(progress(1), {"content": []}), name="slow")

A handler (sync or async) returns one of:

- a dict with "result" or "error": the JSON-RPC response, its id set to the call's;
- any other dict: a result (`resultType` is not added: `modernize` is under test);
- `stream(...)` of messages: an SSE answer whose last item is the final response;
- a `Reply`: relayed as it is;
- or raises `McpError` (a gateway-made failure: unreachable, timeout).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.backends.base import Backend, Message, Reply
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.settings import BackendSettings

Answer = Any  # Message | dict result | Stream | Reply
Handler = Callable[[Call], Answer | Awaitable[Answer]]


@dataclass(frozen=True)
class Stream:
    """An answer sent as a stream: notifications first, the final response last. `fail` is
    raised after the messages instead of ending the stream (a backend that broke mid-answer)."""

    messages: tuple[Any, ...]
    fail: BaseException | None = None


def stream(*messages: Any, fail: BaseException | None = None) -> Stream:
    return Stream(messages, fail)


def progress(value: float, token: str | int = "p") -> Message:
    return rpc.notification("notifications/progress", {"progressToken": token, "progress": value})


def answers(table: Mapping[str, Answer]) -> Handler:
    """A handler answering each method from `table` (an Answer, or a function of the call);
    any other method gets the backend's own -32601."""

    def handle(call: Call) -> Answer:
        answer = table.get(call.method)
        if answer is None:
            return {"error": {"code": rpc.METHOD_NOT_FOUND, "message": f"no {call.method} here"}}
        return answer(call) if callable(answer) else answer

    return handle


def discover_result(capabilities: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"supportedVersions": ["2026-07-28"], "capabilities": dict(capabilities or {}),
            "resultType": "complete", "ttlMs": 60_000, "cacheScope": "public", **extra}


class FakeBackend(Backend):
    def __init__(self, handler: Handler, *, name: str = "fake", url: str | None = None, **settings: Any) -> None:
        super().__init__(BackendSettings(name=name, url=url or f"http://127.0.0.1:1/{name}", **settings))
        self.handler = handler
        self.calls: list[Call] = []
        # Stream answers whose generator finished (ran its `finally`), and answers released
        # through `Reply.closers` (run by `Reply.aclose` even for a stream never read).
        self.closed_streams = 0
        self.released = 0

    @property
    def methods(self) -> list[str]:
        """The methods of the calls received, in order."""
        return [c.method for c in self.calls]

    async def send(self, call: Call) -> Reply:
        self.calls.append(call)
        answer = self.handler(call)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, Reply):
            return answer
        if isinstance(answer, Stream):
            return Reply(self.name, stream=self._stream(call, answer), closers=[self._release])
        return Reply(self.name, message=self._message(call, answer))

    def _release(self) -> None:
        self.released += 1

    def _message(self, call: Call, answer: Any) -> Message:
        if not isinstance(answer, dict):
            raise TypeError(f"FakeBackend handler answered {answer!r}")
        if "jsonrpc" in answer and "method" in answer:
            return answer  # a notification, inside a stream
        if "result" in answer or "error" in answer:
            return {"jsonrpc": "2.0", "id": call.id, **answer}
        return rpc.result_message(call.id if call.id is not None else 0, answer)

    async def _stream(self, call: Call, answer: Stream) -> AsyncIterator[Message]:
        try:
            for item in answer.messages:
                yield self._message(call, item)
            if answer.fail is not None:
                raise answer.fail
        finally:
            self.closed_streams += 1
