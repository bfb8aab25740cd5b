"""A modern (2026-07-28) backend that ignores listen filters: every notification a test
`broadcast`s goes to every open `subscriptions/listen` stream it holds, whatever that stream
asked for, tagged with the backend's own (or a foreign) subscription id.

Real backends filter per listen; this one is as leaky as a backend can be, so a test can
prove the gateway's own per-client isolation (digest §d: "forward only the types that client
asked for and was acked", re-tagged with that client's id) rather than the backend's. Raw
ASGI over a real socket (tests/support/asgi.py `serving`); it imports nothing from the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from tests.support.asgi import read_body, serving

VERSION = "2026-07-28"
SUB = "io.modelcontextprotocol/subscriptionId"
CAPABILITIES = {"tools": {"listChanged": True}, "prompts": {"listChanged": True},
                "resources": {"listChanged": True, "subscribe": True}}


class BroadcastBackend:
    def __init__(self, name: str = "leaky") -> None:
        self.name = name
        # Each open listen: (its request id, its requested filter, its queue).
        self.listens: list[tuple[Any, dict[str, Any], asyncio.Queue[dict[str, Any]]]] = []
        self.filters: list[dict[str, Any]] = []  # every listen filter ever received
        self.changed = asyncio.Event()

    @property
    def open_listens(self) -> int:
        return len(self.listens)

    def broadcast(self, method: str, params: dict[str, Any] | None = None, *, meta: dict[str, Any] | None = None
                  ) -> None:
        for rid, _, queue in self.listens:
            p = dict(params or {})
            p["_meta"] = {SUB: rid, **(meta or {})}
            queue.put_nowait({"jsonrpc": "2.0", "method": method, "params": p})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        msg = orjson.loads(await read_body(receive))
        if "id" not in msg:
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        rid, method, params = msg["id"], msg.get("method"), msg.get("params") or {}
        if method == "subscriptions/listen":
            await self._listen(rid, params.get("notifications") or {}, receive, send)
            return
        if method == "server/discover":
            result: dict[str, Any] = {"supportedVersions": [VERSION], "capabilities": CAPABILITIES,
                                      "_meta": {"io.modelcontextprotocol/serverInfo": {"name": self.name,
                                                                                       "version": "1.0.0"}}}
        elif method in ("tools/list", "prompts/list", "resources/list", "resources/templates/list"):
            key = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources",
                   "resources/templates/list": "resourceTemplates"}[method]
            result = {key: []}
        else:
            body = orjson.dumps({"jsonrpc": "2.0", "id": rid,
                                 "error": {"code": -32601, "message": f"Method not found: {method}"}})
            await _json(send, body)
            return
        await _json(send, orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {"resultType": "complete", **result}}))

    async def _listen(self, rid: Any, wanted: dict[str, Any], receive: Any, send: Any) -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (rid, wanted, queue)
        self.filters.append(wanted)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        # The ack grants everything that was asked (the backend "supports" it all).
        await _event(send, {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                            "params": {"_meta": {SUB: rid}, "notifications": wanted}})
        self.listens.append(entry)
        self.changed.set()
        disconnected = asyncio.ensure_future(_disconnect(receive))
        try:
            while True:
                get = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({get, disconnected}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    return
                await _event(send, get.result())
        finally:
            disconnected.cancel()
            self.listens.remove(entry)
            self.changed.set()


async def _disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send: Any, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _event(send: Any, message: Any) -> None:
    await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(message) + b"\n\n",
                "more_body": True})


@contextlib.asynccontextmanager
async def served(name: str = "leaky") -> AsyncIterator[tuple[BroadcastBackend, str]]:
    """A `BroadcastBackend` on a real loopback socket: the backend and its /mcp URL."""
    backend = BroadcastBackend(name)
    async with serving(backend) as url:
        yield backend, url
