"""A raw `subscriptions/listen` reader over httpx: every SSE message and comment line as it
arrives, for tests and the benchmark that must see the exact bytes a client gets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import orjson

from tests.support import mcp_http


class ListenReader:
    def __init__(self, client: httpx.AsyncClient, url: str, notifications: dict[str, Any], *,
                 id: Any = 1, headers: dict[str, str] | None = None, meta: dict[str, Any] | None = None) -> None:
        self.client, self.url, self.id = client, url, id
        self.body = orjson.dumps(mcp_http.body("subscriptions/listen", {"notifications": notifications}, id=id,
                                               meta=meta))
        self.headers = {**mcp_http.headers("subscriptions/listen"), **(headers or {})}
        self.status: int | None = None
        self.error: dict[str, Any] | None = None  # a JSON (non-stream) answer
        self.messages: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # perf_counter() of each message, for the benchmark
        self.comments = 0
        self.ended = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, *, wait_ack: bool = True, timeout: float = 20.0) -> ListenReader:
        self._task = asyncio.create_task(self._read())
        if wait_ack:
            await self.wait(lambda: self.messages or self.error is not None or self.ended, timeout)
        return self

    async def _read(self) -> None:
        try:
            async with self.client.stream("POST", self.url, content=self.body, headers=self.headers) as response:
                self.status = response.status_code
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    self.error = orjson.loads(await response.aread())
                    return
                data: list[str] = []
                async for line in response.aiter_lines():
                    if line.startswith(":"):
                        self.comments += 1
                        self._changed.set()
                    elif line.startswith("data:"):
                        data.append(line[5:].lstrip())
                    elif not line and data:
                        self.messages.append(orjson.loads("\n".join(data)))
                        self.arrived.append(time.perf_counter())
                        data = []
                        self._changed.set()
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            self.ended = True
            self._changed.set()

    async def wait(self, predicate: Any, timeout: float = 20.0) -> None:
        async def loop() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)

    async def wait_count(self, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        await self.wait(lambda: len(self.messages) >= n or self.ended, timeout)
        return self.messages

    @property
    def ack(self) -> dict[str, Any]:
        return self.messages[0]

    @property
    def notifications(self) -> list[dict[str, Any]]:
        return [m for m in self.messages[1:] if "method" in m]

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


MARK = b"event: message"


class RawListen:
    """One listen stream over a raw socket: light enough for thousands in one test. `events`
    counts SSE message events as they arrive; `messages()` parses what came so far."""

    def __init__(self, listen_id: int | str, notifications: dict[str, Any]) -> None:
        self.id = listen_id
        self.notifications = notifications
        self.data = bytearray()
        self.events = 0
        self.changed = asyncio.Event()
        self.writer: asyncio.StreamWriter | None = None

    async def run(self, port: int) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        body = orjson.dumps(mcp_http.body("subscriptions/listen", {"notifications": self.notifications},
                                          id=self.id))
        head = "".join(f"{k}: {v}\r\n" for k, v in mcp_http.headers("subscriptions/listen").items())
        self.writer.write(f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}content-length: {len(body)}\r\n\r\n"
                          .encode() + body)
        tail = b""
        while chunk := await reader.read(65536):  # until the gateway closes
            self.data += chunk
            # A mark may straddle two reads: counted over the last bytes before this one too
            # (too few to hold a whole mark, so none is counted twice).
            seen = tail + chunk
            self.events += seen.count(MARK)
            tail = seen[-(len(MARK) - 1):]
            self.changed.set()

    def messages(self) -> list[dict]:
        return [orjson.loads(line[6:]) for line in bytes(self.data).split(b"\n") if line.startswith(b"data: ")]

    async def wait_events(self, n: int) -> None:
        while self.events < n:
            self.changed.clear()
            await self.changed.wait()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def close_all(streams: list[RawListen], tasks: list[asyncio.Task[Any]]) -> None:
    """A test's raw streams closed and their reader tasks ended (its `finally`)."""
    for s in streams:
        s.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def eventually(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> None:
    """Poll until `predicate()` (sync or async) is true; fail after `timeout` seconds."""
    async def loop() -> None:
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            await asyncio.sleep(interval)

    await asyncio.wait_for(loop(), timeout)
