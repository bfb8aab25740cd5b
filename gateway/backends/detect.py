"""Which era a backend speaks (digest §h.1), and the backend that finds out on first use.

The probe is `server/discover` with the full modern headers and `_meta`: a method no legacy
server implements and that changes nothing, so a legacy server that skips the "initialize
first" rule still cannot act on it. Only positive modern evidence counts as modern: a
DiscoverResult that lists a modern version, or one of the three modern error codes. Anything
else — 400 "Missing session ID", -32000 "Server not initialized", a 404 without a JSON-RPC
body, 405, a redirect, a connected server's silence — means legacy; and a 404/405 whose URL
answers GET with an `endpoint` event means legacy over HTTP+SSE (`sse.py`). A connection failure
(refused, reset, or no connection within connect_timeout_seconds) is no verdict at all: the
call fails with -31001 and the next one probes again.

The probe uses the same HTTP client and SSE parser as every backend call (`backends/http1.py`,
`protocol/sse.py`), with the lower layer's exceptions (`backends/errors.py`) rather than the
gateway's errors, because here the phase of a failure decides: no connection (refused, or
`ConnectTimeout`) is no verdict, while a connection that stays silent (a read timeout) is one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal

import orjson

from gateway.backends.errors import ConnectTimeout, UpstreamError, describe
from gateway.backends.base import Backend, Message, Reply, internal_call
from gateway.backends.stdio_process import stdio_process
from gateway.backends import http1, tls
from gateway.backends.credentials import credentials_for
from gateway.backends.http1 import Http1Client, UpstreamResponse
from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse
from gateway.protocol.request import Call
from gateway.protocol.versions import MODERN_VERSIONS
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.detect")

Era = Literal["modern", "legacy"]
# What the HTTP probe tells apart: the era, and for a legacy server, HTTP+SSE (2024-11-05).
Kind = Literal["modern", "legacy", "legacy-sse"]
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


async def probe_http(settings: BackendSettings) -> Kind:
    """Probe an HTTP backend; raises -31001 naming it when no connection could be made."""
    client = http1.for_backend(settings, tls.client_context(settings.tls), max_connections=1)
    # The gateway's own credentials (a token, for the token kinds: one fetch at start-up).
    credentials = credentials_for(settings)
    try:
        call = internal_call("server/discover")
        extra = credentials.static
        authorization = await credentials.authorization(call.principal)
        if authorization is not None:
            extra = {**extra, "authorization": authorization}
        return await _probe(client, settings, extra)
    finally:
        await client.aclose()
        await credentials.aclose()


async def _probe(client: Http1Client, settings: BackendSettings, credentials: dict[str, str]) -> Kind:
    assert settings.url is not None
    call = internal_call("server/discover")
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               h.PROTOCOL_VERSION: call.version, h.METHOD: call.method, **credentials}
    wait = settings.connect_timeout_seconds
    try:
        response = await client.request_raw("POST", settings.url, headers, body=call.wire_body(), read_timeout=wait)
    except ConnectTimeout as exc:
        raise rpc.backend_unavailable(settings.name, f"era probe: {exc}") from None
    except TimeoutError:
        return "legacy"  # connected, but a modern server answers discover at once (§h.1)
    except UpstreamError as exc:
        raise rpc.backend_unavailable(settings.name, f"era probe: {describe(exc)}") from None
    try:
        async with asyncio.timeout(wait):
            if response.status not in (404, 405) or settings.transport != "auto":
                return await _read_verdict(response)
            answer = await _json_rpc_answer(response)
            if answer is not None:
                return verdict(answer)  # a modern server may refuse with a modern error
    except TimeoutError:
        return "legacy"
    except UpstreamError as exc:
        raise rpc.backend_unavailable(settings.name, f"era probe: {describe(exc)}") from None
    finally:
        response.close()
    # A 404/405 without a JSON-RPC answer. 2025-03-26 transports §Backwards Compatibility: it
    # may be an HTTP+SSE server, which a GET on the same URL tells (first event `endpoint`).
    if await opens_sse_session(client, settings.url, credentials, wait):
        return "legacy-sse"
    return "legacy"


async def opens_sse_session(client: Http1Client, url: str, headers: dict[str, str], wait: float) -> bool:
    """Whether a GET on `url` opens an HTTP+SSE session: an event stream whose first event is
    `endpoint` (2025-03-26 transports §Backwards Compatibility). The stream is closed again."""
    try:
        response = await client.request_raw("GET", url, {**headers, "accept": "text/event-stream"},
                                            read_timeout=wait)
    except (UpstreamError, TimeoutError, rpc.McpError):
        return False
    try:
        if response.status != 200 or response.content_type != "text/event-stream":
            return False
        async with asyncio.timeout(wait):
            async for event, data in response.events(sse.Decoder()):
                return event == "endpoint" and bool(data.strip())
    except (UpstreamError, TimeoutError):
        return False
    finally:
        response.close()
    return False


async def _json_rpc_answer(response: UpstreamResponse) -> dict[str, Any] | None:
    body = await response.read()
    try:
        message = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) and ("result" in message or "error" in message) else None


async def _read_verdict(response: UpstreamResponse) -> Era:
    if response.content_type == "text/event-stream":
        async for event, data in response.events(sse.Decoder()):
            if event != "message" or not data:
                continue
            try:
                message = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue  # not a JSON-RPC message, so no modern evidence
            if isinstance(message, dict) and "method" not in message:
                return verdict(message)
        return "legacy"
    body = await response.read()
    try:
        return verdict(orjson.loads(body) if body else None)
    except orjson.JSONDecodeError:
        return "legacy"


class StdioAutoProbe:
    """Probes a process with server/discover (§h.1); the backend of its era adopts `process`:
    the process is started once and kept, whatever the verdict."""

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self._answer: asyncio.Future[Message] | None = None
        self.process = stdio_process(settings, on_message=self._probe_message, on_exit=lambda reason: None)

    def _probe_message(self, message: Message) -> None:
        if self._answer is not None and not self._answer.done() and message.get("id") == "gw-era-probe":
            self._answer.set_result(message)

    async def probe(self) -> Era:
        self._answer = asyncio.get_running_loop().create_future()
        call = internal_call("server/discover", request_id="gw-era-probe")
        await self.process.write(orjson.loads(call.wire_body()), wait=self.settings.connect_timeout_seconds)
        try:
            message = await asyncio.wait_for(self._answer, self.settings.connect_timeout_seconds)
        except TimeoutError:
            return "legacy"
        return verdict(message)


_SPOKEN: dict[str, str] = {
    "modern": "modern protocol",
    "legacy": "initialize-era protocol over Streamable HTTP (or stdio)",
    "legacy-sse": "initialize-era protocol over HTTP+SSE (2024-11-05 transport)",
}


class AutoBackend(Backend):
    """`era: auto`: probes on first use, then delegates to the modern or the legacy backend.
    The verdict is kept until it stops holding: when the delegate reports a protocol
    failure, the next call probes again (VER: cache per origin, re-probe if it fails)."""

    def __init__(self, settings: BackendSettings, *, probe: Callable[[], Any],
                 make: Callable[[Kind], Backend]) -> None:
        super().__init__(settings)
        self._probe = probe
        self._make = make
        self._delegates: dict[Kind, Backend] = {}
        self.era: Kind | None = None
        self._lock = asyncio.Lock()

    async def _delegate(self) -> Backend:
        if self.era is not None:
            return self._delegates[self.era]
        async with self._lock:
            if self.era is None:
                era: Kind = await self._probe()
                if era not in self._delegates:
                    backend = self._make(era)
                    # One remembered health for the backend, whoever serves it: the delegate
                    # reports its endpoints' outcomes (its URLs, its DNS answer's addresses
                    # (resolve.py), or its stdio instances) where the checks, the dispatcher
                    # and /metrics read and change them.
                    backend.health = self.health
                    await backend.start()
                    self._delegates[era] = backend
                log.info("backend %s: speaks the %s", self.name, _SPOKEN[era])
                self.era = era
            return self._delegates[self.era]

    async def round_trip(self) -> None:
        # The discovery just made went through the delegate, and for a legacy one reached
        # nothing once its session was open: the delegate's own check makes the round trip.
        if self.era is not None:
            await self._delegates[self.era].round_trip()

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

    async def check_endpoint(self, index: int) -> None:
        if len(self.health.endpoints) == 1:
            await self.health_check()
        else:
            await (await self._delegate()).check_endpoint(index)

    async def aclose(self) -> None:
        await asyncio.gather(*(b.aclose() for b in self._delegates.values()), return_exceptions=True)
