"""The era probe's failure modes and the legacy GET stream's reconnect pacing, against real
sockets and tiny real HTTP servers on loopback (gateway/backends/detect.py, legacy/http.py)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from gateway.backends.detect import probe_http
from gateway.backends.http1 import Http1Client
from gateway.backends.legacy import http as legacy_http
from gateway.protocol import jsonrpc as rpc
from gateway.settings import BackendSettings
from tests.support.asgi import App, serving
from tests.support.raw_http import full_backlog


def sse_app(body: bytes) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": body})
    return app


async def test_an_unreachable_backend_is_no_verdict() -> None:
    # httpx's TimeoutException covered ConnectTimeout, so a modern backend that could not be
    # reached at start-up was classified legacy for good.
    with full_backlog() as url:
        settings = BackendSettings(name="far", url=url, connect_timeout_seconds=0.3)
        with pytest.raises(rpc.McpError) as caught:
            await probe_http(settings)
    assert caught.value.code == rpc.BACKEND_UNAVAILABLE and caught.value.data == {"backend": "far"}
    assert "era probe" in caught.value.message


async def test_a_refused_connection_is_no_verdict() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    with pytest.raises(rpc.McpError) as caught:
        await probe_http(BackendSettings(name="gone", url=f"http://127.0.0.1:{port}/mcp"))
    assert caught.value.code == rpc.BACKEND_UNAVAILABLE


async def test_non_json_sse_data_is_not_a_crash() -> None:
    async with serving(sse_app(b"event: message\ndata: this is not json\n\n")) as url:
        assert await probe_http(BackendSettings(name="odd", url=url)) == "legacy"
    modern = (b"data: not json either\n\n"
              b'data: {"jsonrpc":"2.0","id":"x","result":{"supportedVersions":["2026-07-28"],"capabilities":{}}}\n\n')
    async with serving(sse_app(modern)) as url:
        assert await probe_http(BackendSettings(name="odd", url=url)) == "modern"


class _Stop(Exception):
    pass


class _RecordingAsyncio:
    """http.py's view of asyncio with `sleep` recorded instead of slept (after N, stop)."""

    def __init__(self, limit: int) -> None:
        self.delays: list[float] = []
        self.limit = limit

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) >= self.limit:
            raise _Stop()
        await asyncio.sleep(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


async def _reconnect_delays(body: bytes, monkeypatch: pytest.MonkeyPatch, count: int = 8) -> list[float]:
    """The waits between GET streams of a backend whose every stream ends at once."""
    recorder = _RecordingAsyncio(count)
    monkeypatch.setattr(legacy_http, "asyncio", recorder)
    async with serving(sse_app(body)) as url:
        client = Http1Client("old", max_connections=4, connect_timeout=1.0)
        session = legacy_http.HttpSession("old", {}, lambda m: None, client=client, url=url, headers={}, timeout=5,
                                          connect_timeout=1.0)
        try:
            with pytest.raises(_Stop):
                await session.listen_stream(asyncio.Event())
        finally:
            await client.aclose()
    return recorder.delays


async def test_a_stream_that_ends_at_once_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # The delay used to reset after every connect, so such a backend was hit every 100 ms.
    delays = await _reconnect_delays(b"retry: 100\n\n", monkeypatch)
    assert delays == sorted(delays) and delays[-1] > 4 * delays[0]
    assert max(delays) <= 30


async def test_a_huge_retry_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    delays = await _reconnect_delays(b"retry: 999999999999\n\n", monkeypatch, count=3)
    assert delays == [30.0, 30.0, 30.0]


def test_a_stream_that_stayed_up_resets_the_backoff() -> None:
    backoff = legacy_http.ReconnectBackoff()
    quick = [backoff.ended(0.0, None) for _ in range(4)]
    assert quick == [0.1, 0.2, 0.4, 0.8]
    assert backoff.ended(60.0, None) == 0.1
    assert backoff.ended(60.0, 2500) == 2.5
