"""Legacy Streamable HTTP (2025-03-26 … 2025-11-25) as a client, for one session (digest §h.2).

Every message is a POST carrying `MCP-Session-Id` (once the backend minted one) and
`MCP-Protocol-Version: <negotiated>`; a request is answered with JSON or with an SSE stream
that may carry notifications and backend requests before the response. A stream that ends
before its response is resumed with GET + `Last-Event-ID`, honouring `retry:` (L-TR
§Resumability), so that the modern client never notices. The optional GET stream carries
messages unrelated to any request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import orjson
from httpx_sse import EventSource

from gateway.backends.legacy.session import Exchange, LegacySession, Message, NotificationSink, SessionExpired
from gateway.protocol import jsonrpc as rpc

log = logging.getLogger("gateway.backends.legacy.http")

_ACCEPT = "application/json, text/event-stream"
# The header only exists from 2025-06-18 on (0326-TR); older sessions get none.
_VERSIONED = frozenset({"2025-06-18", "2025-11-25"})
_MAX_RESUMES = 3


class NoListenStream(Exception):
    """The backend offers no GET stream (405)."""


class HttpSession(LegacySession):
    def __init__(self, backend: str, capabilities: dict[str, Any], on_notification: NotificationSink, *,
                 client: httpx.AsyncClient, url: str, headers: dict[str, str], timeout: float,
                 connect_timeout: float) -> None:
        super().__init__(backend, capabilities, on_notification)
        self.client = client
        self.url = url
        self.static_headers = headers
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.session_id: str | None = None
        self._readers: dict[int, asyncio.Task[None]] = {}

    def _headers(self, *, initialize: bool = False) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": _ACCEPT, **self.static_headers}
        if not initialize:
            if self.session_id is not None:
                headers["mcp-session-id"] = self.session_id
            if self.version in _VERSIONED:
                headers["mcp-protocol-version"] = self.version
        return headers

    async def _post(self, message: Message, *, initialize: bool = False,
                    read_timeout: float | None = None) -> httpx.Response:
        request = self.client.build_request(
            "POST", self.url, content=orjson.dumps(message), headers=self._headers(initialize=initialize),
            timeout=httpx.Timeout(read_timeout if read_timeout is not None else self.timeout,
                                  connect=self.connect_timeout))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.TimeoutException:
            raise rpc.backend_timeout(self.backend, self.connect_timeout) from None
        except httpx.HTTPError as exc:
            raise rpc.backend_unavailable(self.backend, f"{type(exc).__name__}: {exc}") from None
        if response.status_code == 404 and self.session_id is not None and not initialize:
            await response.aclose()
            raise SessionExpired(self.session_id)
        return response

    # -- LegacySession transport ------------------------------------------------------------

    async def _initialize(self, message: Message) -> Message:
        response = await self._post(message, initialize=True)
        session_id = response.headers.get("mcp-session-id")
        if session_id:
            self.session_id = session_id
        holder = Exchange(message["id"], "initialize")
        self._exchanges[holder.backend_id] = holder
        await self._consume(response, holder, resume=False)
        return await holder.next(self.timeout)

    async def _send_request(self, exchange: Exchange, message: Message) -> None:
        response = await self._post(message)
        if _is_sse(response):
            task = asyncio.ensure_future(self._read_stream(response, exchange))
            self._readers[exchange.backend_id] = task
            task.add_done_callback(lambda _t, bid=exchange.backend_id: self._readers.pop(bid, None))
            return
        await self._consume(response, exchange, resume=False)

    async def _send(self, message: Message) -> None:
        response = await self._post(message)
        try:
            if response.status_code >= 400:
                body = await response.aread()
                raise rpc.backend_protocol_error(
                    self.backend, f"HTTP {response.status_code} for {message.get('method') or 'a response'}: "
                                  f"{body[:200]!r}")
        finally:
            await response.aclose()

    def mark_expired(self) -> None:
        self.session_id = None

    async def _abandon(self, exchange: Exchange) -> None:
        task = self._readers.pop(exchange.backend_id, None)
        if task is not None:
            task.cancel()

    async def _terminate(self) -> None:
        for task in list(self._readers.values()):
            task.cancel()
        if self.session_id is None:
            return
        # L-TR: SHOULD DELETE when done; 405 (termination not allowed) is fine.
        try:
            await self.client.delete(self.url, headers=self._headers(), timeout=self.connect_timeout)
        except httpx.HTTPError as exc:
            log.debug("backend %s: DELETE of session failed: %s", self.backend, exc)

    # -- reading ----------------------------------------------------------------------------

    async def _consume(self, response: httpx.Response, exchange: Exchange, *, resume: bool) -> None:
        """A POST answer: JSON (read whole), SSE (read to the response) or an HTTP error."""
        if _is_sse(response):
            await self._read_stream(response, exchange, resume=resume)
            return
        try:
            body = await response.aread()
        except httpx.HTTPError as exc:
            exchange.fail(rpc.backend_unavailable(self.backend, f"{type(exc).__name__}: {exc}"))
            return
        finally:
            await response.aclose()
        status = response.status_code
        try:
            message: Any = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            message = None
        if isinstance(message, dict) and ("result" in message or "error" in message):
            self.route(message, exchange)
            if not exchange.done:  # an answer with someone else's id
                exchange.fail(rpc.backend_protocol_error(self.backend, f"HTTP {status} answered another request"))
            return
        if status >= 500:
            exchange.fail(rpc.backend_unavailable(self.backend, f"HTTP {status} for {exchange.method}"))
        else:
            exchange.fail(rpc.backend_protocol_error(
                self.backend, f"HTTP {status} without a JSON-RPC answer for {exchange.method}"))

    async def _read_stream(self, response: httpx.Response, exchange: Exchange, *, resume: bool = True) -> None:
        last_event_id: str | None = None
        retry_ms: int | None = None
        for attempt in range(_MAX_RESUMES + 1):
            try:
                async for event in EventSource(response).aiter_sse():
                    if event.id:
                        last_event_id = event.id
                    if event.retry is not None:
                        retry_ms = event.retry
                    if not event.data or event.event not in ("message", ""):
                        continue  # priming events (id, empty data), unknown types
                    self._deliver(event.data, exchange)
                    if exchange.done:
                        return
            except httpx.TimeoutException:
                exchange.fail(rpc.backend_timeout(self.backend, self.timeout))
                return
            except httpx.HTTPError as exc:
                log.info("backend %s: stream for %s broke: %s", self.backend, exchange.method, exc)
            finally:
                await response.aclose()
            if exchange.done or not resume or last_event_id is None or attempt == _MAX_RESUMES:
                break
            # L-TR: the server may close the connection without ending the stream; poll with
            # GET + Last-Event-ID after the `retry` it asked for.
            await asyncio.sleep((retry_ms or 0) / 1000)
            try:
                response = await self._get(last_event_id)
            except (rpc.McpError, SessionExpired, NoListenStream) as exc:
                exchange.fail(rpc.backend_unavailable(self.backend, f"could not resume the stream: {exc}"))
                return
        if not exchange.done:
            exchange.fail(rpc.backend_protocol_error(
                self.backend, f"the stream for {exchange.method} ended without a response"))
            self.forget(exchange)

    def _deliver(self, data: str, origin: Exchange | None) -> None:
        try:
            payload: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            log.warning("backend %s sent a non-JSON SSE event; dropped", self.backend)
            return
        # 2025-03-26 allowed batches; accept arrays (§h.2).
        for item in payload if isinstance(payload, list) else (payload,):
            if isinstance(item, dict):
                self.route(item, origin)

    async def _get(self, last_event_id: str | None = None) -> httpx.Response:
        headers = self._headers()
        headers["accept"] = "text/event-stream"
        headers.pop("content-type", None)
        if last_event_id is not None:
            headers["last-event-id"] = last_event_id
        request = self.client.build_request("GET", self.url, headers=headers,
                                            timeout=httpx.Timeout(None, connect=self.connect_timeout))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise rpc.backend_unavailable(self.backend, f"GET stream: {type(exc).__name__}: {exc}") from None
        if response.status_code == 404 and self.session_id is not None:
            await response.aclose()
            raise SessionExpired(self.session_id)
        if response.status_code == 405 or (response.status_code < 300 and not _is_sse(response)):
            await response.aclose()
            raise NoListenStream()
        if response.status_code >= 300:
            await response.aclose()
            raise rpc.backend_unavailable(self.backend, f"GET stream: HTTP {response.status_code}")
        return response

    async def listen_stream(self, connected: asyncio.Event) -> None:
        """Hold the GET stream open (L-TR §Listening) until cancelled, reconnecting with
        Last-Event-ID. Raises NoListenStream (405) or SessionExpired (404)."""
        last_event_id: str | None = None
        delay = 0.1
        while not self.closed:
            try:
                response = await self._get(last_event_id)
            except rpc.McpError as exc:
                log.info("backend %s: GET stream unavailable: %s", self.backend, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            connected.set()
            delay = 0.1
            try:
                async for event in EventSource(response).aiter_sse():
                    if event.id:
                        last_event_id = event.id
                    if event.retry is not None:
                        delay = event.retry / 1000
                    if event.data and event.event in ("message", ""):
                        self._deliver(event.data, None)
            except httpx.HTTPError as exc:
                log.info("backend %s: GET stream dropped: %s", self.backend, exc)
            finally:
                await response.aclose()
            await asyncio.sleep(delay)


def _is_sse(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").split(";", 1)[0].strip().lower() == "text/event-stream"

