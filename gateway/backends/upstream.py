"""The HTTP client for upstream MCP calls: one pooled aiohttp session per backend.

Why not httpx here: a profile of the pass-through path (bench/README.md) showed ~85 % of the
gateway's CPU inside httpx/httpcore, whose pool scans every connection (a `select()` per
idle connection) on each request, so cost grows with concurrency; aiohttp's connector hands
out keep-alive connections in O(1) and its C-accelerated parser does the rest. httpx stays
where speed does not matter (JWKS, tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from gateway.backends.http1 import DEFAULT_MAX_RESPONSE_BYTES, ResponseTooLarge
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse

log = logging.getLogger("gateway.backends.upstream")


class UpstreamResponse:
    __slots__ = ("_response", "backend", "content_type", "max_bytes", "status")

    def __init__(self, response: aiohttp.ClientResponse, backend: str, max_bytes: int) -> None:
        self._response = response
        self.backend = backend
        self.max_bytes = max_bytes  # a whole body, or one SSE event (http1.ResponseTooLarge)
        self.status = response.status
        self.content_type = (response.content_type or "").lower()

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    async def read(self) -> bytes:
        body = bytearray()
        try:
            async for chunk in self._response.content.iter_any():
                body += chunk
                if len(body) > self.max_bytes:
                    self._response.close()  # the rest is not read
                    raise ResponseTooLarge(self.max_bytes)
            return bytes(body)
        finally:
            self._response.release()

    async def sse_messages(self) -> AsyncIterator[Any]:
        """Parsed JSON payloads of the stream's `message` events, as they arrive. Closing the
        iterator closes the connection (the backend sees the modern cancellation)."""
        try:
            async with contextlib.aclosing(sse.json_payloads(
                    self._response.content.iter_any(), f"backend {self.backend}", self.max_bytes)) as payloads:
                async for payload in payloads:
                    yield payload
        except sse.EventTooLarge:
            raise ResponseTooLarge(self.max_bytes, "an SSE event") from None
        finally:
            self._response.close()

    async def events(self, decoder: sse.Decoder) -> AsyncIterator[tuple[str, str]]:
        """(event type, data) pairs of an SSE body as they arrive; `decoder` keeps the last
        event id and `retry:` for a reader that resumes. Ends at the end of the body; the
        caller releases or closes the response."""
        decoder.max_event_bytes = self.max_bytes
        try:
            async for chunk in self._response.content.iter_any():
                for event in decoder.feed(chunk):
                    yield event
        except sse.EventTooLarge:
            raise ResponseTooLarge(self.max_bytes, "an SSE event") from None

    async def finish(self, timeout: float) -> None:
        """Read what is left of the body and give the connection back to the pool, or close
        it when the body does not end within `timeout` (a stream the backend keeps open)."""
        try:
            await asyncio.wait_for(self._response.read(), timeout)
        except (asyncio.TimeoutError, aiohttp.ClientError):
            self._response.close()
        except asyncio.CancelledError:
            self._response.close()
            raise
        else:
            self._response.release()

    def close(self) -> None:
        self._response.close()


class UpstreamClient:
    """POSTs to one backend over a keep-alive pool."""

    def __init__(self, backend: str, *, max_connections: int, connect_timeout: float,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.backend = backend
        self.max_response_bytes = max_response_bytes
        self._max_connections = max_connections
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running loop (aiohttp binds the session to it).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, ttl_dns_cache=60),
            auto_decompress=True,
            trust_env=False,
            skip_auto_headers=("User-Agent",),
        )
        return self._session

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *, read_timeout: float | None,
                   request_id: rpc.RequestId | None = None) -> UpstreamResponse:
        """Send the request and return once the response headers are in. Raises McpError
        (-31001 unavailable, -31002 timeout) naming the backend."""
        return await self.request("POST", url, headers, body=body, read_timeout=read_timeout, request_id=request_id)

    async def request_raw(self, method: str, url: str, headers: Mapping[str, str], *, body: bytes | None = None,
                          read_timeout: float | None) -> UpstreamResponse:
        """`request` without the error mapping: aiohttp's own exceptions, for a caller to whom
        the phase of a failure matters (the era probe: no connection is no verdict, a
        connection that stays silent is one). `aiohttp.ConnectionTimeoutError` = connecting."""
        session = self._session or self._open()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout, sock_read=read_timeout)
        response = await session.request(method, url, data=body, headers=headers, timeout=timeout,
                                         allow_redirects=False)
        return UpstreamResponse(response, self.backend, self.max_response_bytes)

    async def request(self, method: str, url: str, headers: Mapping[str, str], *, body: bytes | None = None,
                      read_timeout: float | None, request_id: rpc.RequestId | None = None) -> UpstreamResponse:
        """Any method (the legacy transport also GETs its streams and DELETEs its session)."""
        session = self._session or self._open()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout, sock_read=read_timeout)
        try:
            response = await session.request(method, url, data=body, headers=headers, timeout=timeout,
                                             allow_redirects=False)
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            connecting = isinstance(exc, aiohttp.ConnectionTimeoutError)
            raise rpc.backend_timeout(
                self.backend, self._connect_timeout if connecting else (read_timeout or 0), request_id
            ) from None
        except aiohttp.ClientError as exc:
            raise rpc.backend_unavailable(self.backend, describe(exc), request_id) from None
        return UpstreamResponse(response, self.backend, self.max_response_bytes)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
