"""Which era a backend speaks (digest §h.1), and the backend that finds out on first use.

The probe is `server/discover` with the full modern headers and `_meta`: a method no legacy
server implements and that changes nothing, so a legacy server that skips the "initialize
first" rule still cannot act on it. Only positive modern evidence counts as modern: a
DiscoverResult that lists a modern version, or one of the three modern error codes. Anything
else — 400 "Missing session ID", -32000 "Server not initialized", a 404 without a JSON-RPC
body, 405, a redirect, a timeout — means legacy. A connection failure is no verdict at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal

import httpx
import orjson
from httpx_sse import EventSource

from gateway.backends.base import Backend, Reply, internal_call
from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.protocol.versions import MODERN_VERSIONS
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.detect")

Era = Literal["modern", "legacy"]
MODERN_ERRORS = frozenset({rpc.HEADER_MISMATCH, rpc.MISSING_REQUIRED_CLIENT_CAPABILITY,
                           rpc.UNSUPPORTED_PROTOCOL_VERSION})


def verdict(message: Any) -> Era:
    """The era a probe answer shows (the JSON-RPC message, or None when there was none)."""
    if not isinstance(message, dict):
        return "legacy"
    result = message.get("result")
    if isinstance(result, dict):
        versions = result.get("supportedVersions")
        # A discover answer that lists no modern version is a legacy advertisement (VER).
        if isinstance(versions, list) and any(v in MODERN_VERSIONS for v in versions):
            return "modern"
        return "legacy"
    error = message.get("error")
    if isinstance(error, dict) and error.get("code") in MODERN_ERRORS:
        return "modern"
    return "legacy"


async def probe_http(client: httpx.AsyncClient, settings: BackendSettings) -> Era:
    assert settings.url is not None
    call = internal_call("server/discover")
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               h.PROTOCOL_VERSION: call.version, h.METHOD: call.method, **settings.headers}
    timeout = httpx.Timeout(settings.connect_timeout_seconds)
    try:
        async with client.stream("POST", settings.url, content=call.wire_body(), headers=headers,
                                 timeout=timeout) as response:
            content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if content_type == "text/event-stream":
                async for event in EventSource(response).aiter_sse():
                    if event.data:
                        message = orjson.loads(event.data)
                        if isinstance(message, dict) and "method" not in message:
                            return verdict(message)
                return "legacy"
            body = await response.aread()
    except httpx.TimeoutException:
        return "legacy"  # a modern server answers discover at once; silence is legacy (§h.1)
    except httpx.HTTPError as exc:
        raise rpc.backend_unavailable(settings.name, f"era probe: {type(exc).__name__}: {exc}") from None
    try:
        return verdict(orjson.loads(body) if body else None)
    except orjson.JSONDecodeError:
        return "legacy"


class AutoBackend(Backend):
    """`era: auto`: probes on first use, then delegates to the modern or the legacy backend.
    The verdict is kept until it stops holding: when the delegate reports a protocol
    failure, the next call probes again (VER: cache per origin, re-probe if it fails)."""

    def __init__(self, settings: BackendSettings, *, probe: Callable[[], Any],
                 make: Callable[[Era], Backend]) -> None:
        super().__init__(settings)
        self._probe = probe
        self._make = make
        self._delegates: dict[Era, Backend] = {}
        self.era: Era | None = None
        self._lock = asyncio.Lock()

    async def _delegate(self) -> Backend:
        if self.era is not None:
            return self._delegates[self.era]
        async with self._lock:
            if self.era is None:
                era: Era = await self._probe()
                if era not in self._delegates:
                    backend = self._make(era)
                    await backend.start()
                    self._delegates[era] = backend
                log.info("backend %s: speaks the %s protocol", self.name, era)
                self.era = era
            return self._delegates[self.era]

    async def send(self, call: Call) -> Reply:
        delegate = await self._delegate()
        try:
            return await delegate.send(call)
        except rpc.McpError as exc:
            if exc.code == rpc.BACKEND_PROTOCOL_ERROR:
                log.info("backend %s: %s; the era will be probed again", self.name, exc.message)
                self.era = None
            self.last_error = exc.message
            raise

    async def aclose(self) -> None:
        await asyncio.gather(*(b.aclose() for b in self._delegates.values()), return_exceptions=True)
