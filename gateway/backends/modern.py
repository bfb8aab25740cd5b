"""Modern (2026-07-28) Streamable HTTP backends: stateless POSTs over a pooled httpx client.

JSON answers are read whole; `text/event-stream` answers become a Reply stream that yields
each JSON-RPC message as it arrives and closes the upstream response when the consumer stops
(which is how a client's disconnect cancels the backend's work, SHTTP §Cancellation).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from httpx_sse import EventSource

from gateway.backends.base import Backend, Message, Reply
from gateway.observability import tracing
from gateway.protocol import headers as h
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.modern")

# Request headers relayed from the client to the backend. Credentials, cookies and Origin are
# deliberately absent: no token passthrough (AUTH), and a copied Origin could make the backend
# refuse the gateway (digest §a.2).
_RELAYED = ("traceparent", "tracestate", "baggage")
_ACCEPT = "application/json, text/event-stream"
_RETRYABLE_STATUS = frozenset({502, 503, 504})


class ModernHttpBackend(Backend):
    def __init__(self, settings: BackendSettings, *, client: httpx.AsyncClient | None = None) -> None:
        super().__init__(settings)
        assert settings.url is not None
        self.url = settings.url
        self._client = client
        self._static_headers = dict(settings.headers)

    async def start(self) -> None:
        if self._client is None:
            s = self.settings
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(s.timeout_seconds, connect=s.connect_timeout_seconds),
                limits=httpx.Limits(
                    max_connections=s.max_connections, max_keepalive_connections=s.max_connections
                ),
                follow_redirects=False,
                trust_env=False,
            )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def _headers(self, call: Call) -> dict[str, str]:
        headers = {
            "content-type": "application/json",
            "accept": _ACCEPT,
            **self._static_headers,
        }
        if call.id is not None:
            headers[h.PROTOCOL_VERSION] = call.version
            headers[h.METHOD] = call.method
            if call.name is not None:
                headers[h.NAME] = h.encode_value(call.name)
        for key, value in call.headers.items():
            if key.startswith(h.PARAM_PREFIX) or key in _RELAYED:
                headers[key] = value
        if tracing.enabled():
            headers.update(tracing.outgoing_headers())  # the gateway's span is the parent
        return headers

    async def send(self, call: Call) -> Reply:
        assert self._client is not None, "backend not started"
        attempts = 1 + (self.settings.retries if call.spec is not None and call.spec.idempotent else 0)
        for attempt in range(attempts):
            try:
                reply = await self._send_once(call)
            except rpc.McpError as exc:
                if attempt + 1 < attempts and exc.code in (rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT):
                    log.info("retrying %s on %s after: %s", call.method, self.name, exc.message)
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                self.last_error = exc.message
                raise
            if reply.status in _RETRYABLE_STATUS and attempt + 1 < attempts and reply.stream is None:
                continue
            return reply
        raise AssertionError("unreachable")

    async def _send_once(self, call: Call) -> Reply:
        assert self._client is not None
        is_listen = call.method == "subscriptions/listen"
        request = self._client.build_request(
            "POST",
            self.url,
            content=call.wire_body(),
            headers=self._headers(call),
            # A listen stream is quiet for as long as nothing changes: no read deadline.
            timeout=httpx.Timeout(
                self.settings.timeout_seconds if not is_listen else None,
                connect=self.settings.connect_timeout_seconds,
            ),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException:
            raise rpc.backend_timeout(self.name, self.settings.connect_timeout_seconds, call.id) from None
        except httpx.HTTPError as exc:
            raise rpc.backend_unavailable(self.name, _describe(exc), call.id) from None

        content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type == "text/event-stream":
            return Reply(self.name, response.status_code, stream=self._events(response, call))
        try:
            body = await response.aread()
        except httpx.TimeoutException:
            raise rpc.backend_timeout(self.name, self.settings.timeout_seconds, call.id) from None
        except httpx.HTTPError as exc:
            raise rpc.backend_unavailable(self.name, _describe(exc), call.id) from None
        finally:
            await response.aclose()

        if call.id is None:
            return Reply(self.name, response.status_code)
        if content_type == "application/json" or (body[:1] == b"{" and response.status_code >= 400):
            try:
                message = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise rpc.backend_protocol_error(self.name, "body is not valid JSON", call.id) from None
            if isinstance(message, dict) and ("result" in message or "error" in message):
                return Reply(self.name, response.status_code, message=message, raw=body)
            raise rpc.backend_protocol_error(self.name, "body is not a JSON-RPC response", call.id)
        if response.status_code >= 500:
            raise rpc.backend_unavailable(self.name, f"HTTP {response.status_code}", call.id)
        raise rpc.backend_protocol_error(
            self.name, f"HTTP {response.status_code} with content-type {content_type or 'none'!r}", call.id
        )

    async def _events(self, response: httpx.Response, call: Call) -> AsyncIterator[Message]:
        """JSON-RPC messages from an upstream SSE body, as they arrive."""
        try:
            async for event in EventSource(response).aiter_sse():
                if not event.data or event.event not in ("message", ""):
                    continue  # priming events, pings, unknown event types
                try:
                    message: Any = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    log.warning("backend %s sent a non-JSON SSE event; dropped", self.name)
                    continue
                for item in message if isinstance(message, list) else (message,):
                    if isinstance(item, dict):
                        yield item
        except httpx.TimeoutException:
            raise rpc.backend_timeout(self.name, self.settings.timeout_seconds, call.id) from None
        except httpx.HTTPError as exc:
            raise rpc.backend_unavailable(self.name, f"stream broke: {_describe(exc)}", call.id) from None
        finally:
            await response.aclose()


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
