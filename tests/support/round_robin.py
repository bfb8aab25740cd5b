"""A round-robin HTTP reverse proxy on loopback: each request goes to the next upstream in
turn, as a load balancer without affinity does (a Kubernetes Service without
`sessionAffinity`). Responses are streamed through, SSE included. An upstream that refuses the
connection is skipped (the balancer's health check, instantly) and the request goes to the
next one. Every request is recorded, so a test can prove where each one went.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.asgi import read_body, serving

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
               "content-length"}


@dataclass
class Routed:
    upstream: int  # index into the proxy's upstreams
    http_method: str
    rpc_method: str | None  # None for a JSON-RPC response (the client answering the server)
    rpc_id: Any


class RoundRobinProxy:
    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = upstreams  # base URLs, e.g. http://127.0.0.1:8080
        self.log: list[Routed] = []
        self._next = 0
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(60, read=None))

    def where(self, rpc_method: str | None = None, *, http_method: str = "POST", rpc_id: Any = None) -> list[int]:
        """The upstreams that got the matching requests, in order."""
        return [r.upstream for r in self.log if r.http_method == http_method and r.rpc_method == rpc_method
                and (rpc_id is None or r.rpc_id == rpc_id)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await read_body(receive)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k.decode().lower() not in _HOP_BY_HOP]
        target = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        rpc_method, rpc_id = _describe(body)
        response: httpx.Response | None = None
        for _ in range(len(self.upstreams)):
            index = self._next
            self._next = (self._next + 1) % len(self.upstreams)
            request = self._client.build_request(scope["method"], self.upstreams[index] + target, headers=headers,
                                                 content=body)
            try:
                response = await self._client.send(request, stream=True)
            except httpx.ConnectError:
                continue  # down: the next one takes it
            self.log.append(Routed(index, scope["method"], rpc_method, rpc_id))
            break
        if response is None:
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k.encode(), v.encode()) for k, v in response.headers.items()
                                    if k.lower() not in _HOP_BY_HOP]})
            gone = asyncio.ensure_future(_disconnected(receive))
            relay = asyncio.ensure_future(_relay(response.aiter_raw(), send))
            await asyncio.wait((gone, relay), return_when=asyncio.FIRST_COMPLETED)
            for task in (gone, relay):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


async def _relay(chunks: AsyncIterator[bytes], send: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _describe(body: bytes) -> tuple[str | None, Any]:
    try:
        message = json.loads(body) if body else None
    except ValueError:
        return None, None
    if not isinstance(message, dict):
        return None, None
    return message.get("method"), message.get("id")


@contextlib.asynccontextmanager
async def round_robin(upstreams: list[str]) -> AsyncIterator[tuple[RoundRobinProxy, str]]:
    """The proxy served on loopback; yields it and its base URL."""
    proxy = RoundRobinProxy(upstreams)
    try:
        async with serving(proxy) as url:
            yield proxy, url.removesuffix("/mcp")
    finally:
        await proxy.aclose()
