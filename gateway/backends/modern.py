"""Modern (2026-07-28) Streamable HTTP backends: stateless POSTs over a pooled connection.

JSON answers are read whole; `text/event-stream` answers become a Reply stream that yields
each JSON-RPC message as it arrives and closes the upstream response when the consumer stops
(which is how a client's disconnect cancels the backend's work, SHTTP §Cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import orjson

from gateway.backends import http1, tls
from gateway.backends.base import Backend, Message, Reply, internal_call
from gateway.backends.credentials import credentials_for
from gateway.backends.endpoints import InFlightRelease, choose
from gateway.backends.errors import UPSTREAM_FAILURES, gateway_error, never_sent, upstream_errors
from gateway.backends.health import EndpointHealth
from gateway.backends.http1 import UpstreamResponse
from gateway.backends.identity import IdentitySigner
from gateway.backends.replica import ReplicaContext
from gateway.observability import tracing
from gateway.observability.backend_call import next_attempt, note_endpoint
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
# The client's headers relayed as they are (Mcp-Param-*, trace context), worked out once per
# set of header names: a client sends the same names request after request, and a test of
# every name per call cost more than the rest of the upstream headers. Names come from
# clients, so at most this many sets are kept (past it, worked out per call).
_MAX_NAME_SETS = 256
_relayed_by_names: dict[tuple[str, ...], tuple[str, ...]] = {}


def _relayed(names: tuple[str, ...]) -> tuple[str, ...]:
    found = _relayed_by_names.get(names)
    if found is None:
        found = tuple(key for key in names if key.startswith(h.PARAM_PREFIX) or key in _RELAYED)
        if len(_relayed_by_names) < _MAX_NAME_SETS:
            _relayed_by_names[names] = found
    return found
# The 4xx statuses the spec gives a JSON-RPC error body (digest §a.3): relayed with their code.
# Any other 4xx is the backend refusing the gateway, never the client (`rpc.backend_refused`).
_RELAYED_4XX = frozenset({400, 404})
_END = object()  # the end of an SSE body (a JSON `null` payload must not look like it)


class ModernHttpBackend(Backend):
    def __init__(self, settings: BackendSettings, replica: ReplicaContext | None = None) -> None:
        super().__init__(settings)
        assert settings.url is not None
        self.url = settings.url
        self._client = http1.for_backend(settings, tls.client_context(settings.tls))
        self.credentials = credentials_for(settings)
        self._dynamic_credentials = self.credentials.dynamic
        # Built once; each call copies it and adds its own headers. Static credentials are
        # part of it, so they cost nothing per call.
        self._base_headers = {"content-type": "application/json", "accept": _ACCEPT, **self.credentials.static}
        # Client headers passed on by choice: (from, to) pairs (settings refuse credentials).
        self._forwarded = tuple((f.from_, f.target) for f in settings.forward_headers)
        self._identity: tuple[str, IdentitySigner] | None = None
        if settings.identity_header is not None:
            secret = (replica or ReplicaContext.alone()).secret
            self._identity = (settings.identity_header, IdentitySigner(secret))
        if self.spread:
            self.send = self._send_spread  # type: ignore[method-assign]

    async def aclose(self) -> None:
        await self._client.aclose()
        await self.credentials.aclose()

    def _headers(self, call: Call) -> dict[str, str]:
        headers = self._base_headers.copy()
        if call.id is not None:
            headers[h.PROTOCOL_VERSION] = call.version
            headers[h.METHOD] = call.method
            if call.name is not None:
                headers[h.NAME] = h.encode_value(call.name)
        incoming = call.headers
        names = tuple(incoming)
        relayed = _relayed_by_names.get(names)  # `_relayed`'s memo, probed inline
        for key in relayed if relayed is not None else _relayed(names):
            headers[key] = incoming[key]
        if self._forwarded:
            for source, target in self._forwarded:
                value = call.headers.get(source)
                if value is not None:
                    headers[target] = value
        if self._identity is not None:
            name, signer = self._identity
            headers[name] = signer.value(call.principal)
        tracing.add_outgoing_headers(headers)  # the gateway's CLIENT span, X-Request-Id
        return headers

    async def send(self, call: Call, url: str | None = None, *, fresh_token: bool = False,
                   address: str | None = None) -> Reply:
        """One POST (to `url`, or the backend's one URL; connected to `address` when given,
        endpoints.HttpTarget); retries are the caller's
        (backends/retry.py), the same for every kind, except one: a 401 to a token the gateway
        obtained is asked again once with a fresh token (docs/auth.md)."""
        # A listen stream is quiet for as long as nothing changes: no read deadline.
        read_timeout = None if call.stream_only else self.settings.timeout_seconds
        if url is not None:
            note_endpoint(url)  # before the headers: the span's address is the endpoint's
        headers = self._headers(call)
        authorization = None
        if self._dynamic_credentials:
            credentials = self.credentials
            authorization = credentials.cached(call.principal) or await credentials.authorization(
                call.principal, call.id)
            if authorization is not None:
                headers["authorization"] = authorization
        response = await self._client.post(url or self.url, call.wire_body(), headers,
                                           read_timeout=read_timeout, request_id=call.id, address=address)
        if response.status == 401 and authorization is not None and not fresh_token:
            # The token was revoked or expired early: once more with a fresh one, then the
            # backend's answer stands (a second 401 is the gateway's credentials refused).
            with contextlib.suppress(*UPSTREAM_FAILURES):
                await response.read()
            response.release()
            self.credentials.refused(call.principal, authorization)
            log.info("backend %s answered 401: fetching a fresh token and retrying once", self.name)
            return await ModernHttpBackend.send(self, call, url, fresh_token=True, address=address)
        if response.content_type == "text/event-stream" and response.status < 400:
            reply = Reply(self.name, response.status, stream=self._events(response, call))
            reply.closers.append(response.close)
            return reply
        try:
            body = await response.read()
        except UPSTREAM_FAILURES as exc:  # upstream_errors(), without a `with` object per call
            raise gateway_error(exc, self.name, timeout=self.settings.timeout_seconds, request_id=call.id) from None

        status = response.status
        if call.id is None:
            return Reply(self.name, status)
        if 400 <= status < 500 and status not in _RELAYED_4XX:
            raise rpc.backend_refused(self.name, status, body, call.id)
        if response.content_type == "application/json" or (body[:1] == b"{" and status >= 400):
            try:
                message = orjson.loads(body)
            except orjson.JSONDecodeError:
                if status < 400:
                    raise rpc.backend_protocol_error(self.name, "body is not valid JSON", call.id) from None
                message = None  # an error status with an unreadable body: judged by its status below
            if isinstance(message, dict) and ("result" in message or "error" in message):
                if status < 400:
                    return Reply(self.name, status, message=message, raw=body)
                if isinstance(message.get("error"), dict):
                    return Reply(self.name, rpc.http_status_of(message) if status < 500 else status,
                                 message=message, raw=body)
            if status < 400:
                raise rpc.backend_protocol_error(self.name, "body is not a JSON-RPC response", call.id)
            # A 4xx/5xx whose body is not a JSON-RPC error (a proxy's or framework's own JSON such
            # as {"error": "Internal Server Error"}, or no JSON at all) is judged by its status
            # like any other: refused or unavailable (-31001, retried for idempotent reads), never
            # relayed as if it were a JSON-RPC answer nor reported as -31003.
        if 400 <= status < 500:
            raise rpc.backend_refused(self.name, status, body, call.id)
        if status >= 500:
            raise rpc.backend_unavailable(self.name, f"HTTP {status}", call.id)
        raise rpc.backend_protocol_error(
            self.name, f"HTTP {status} with content-type {response.content_type or 'none'!r}", call.id
        )

    async def _send_spread(self, call: Call) -> Reply:
        """`send` over several endpoints (endpoints.py chooses). Each request's outcome is
        reported to the endpoint that served it; one that could not be reached at all sends
        the call on to another at once, whatever its method (nothing reached the backend)."""
        endpoints = self.health.endpoints
        tried: list[EndpointHealth] = []
        last: rpc.McpError | None = None
        while True:
            endpoint = choose(endpoints, tried)
            if endpoint is None:
                raise last if last is not None else self.health.unavailable(call.id)
            target = endpoint.target
            endpoint.in_flight += 1
            try:
                reply = await ModernHttpBackend.send(self, call, target.url, address=target.address)
            except rpc.McpError as exc:
                endpoint.in_flight -= 1
                if exc.code in (rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT):
                    endpoint.failed(exc.message)
                if not never_sent(exc):
                    raise
                tried.append(endpoint)
                last = exc
                # Another endpoint is another attempt: a CLIENT span of its own when traced.
                call = next_attempt(call, str(exc.code), exc.message)
                continue
            except BaseException:
                endpoint.in_flight -= 1
                raise
            if reply.status >= 500:
                endpoint.failed(f"HTTP {reply.status}")
            else:
                endpoint.succeeded()
            if reply.stream is None:
                endpoint.in_flight -= 1
            else:
                reply.closers.append(InFlightRelease(endpoint).release)
            return reply

    async def check_endpoint(self, index: int) -> None:
        """server/discover POSTed to that endpoint (a canary, when configured, runs through
        the backend as a whole: its result does not say which endpoint served it)."""
        if not self.spread or self.settings.health.canary is not None:
            await self.health_check()
            return
        endpoint = self.health.endpoints[index]
        target = endpoint.target
        reply = await ModernHttpBackend.send(self, internal_call("server/discover"), target.url,
                                             address=target.address)
        message = await reply.final()
        if not isinstance(message.get("result"), dict):
            raise rpc.backend_protocol_error(self.name, f"server/discover failed at {endpoint.label}")

    async def _events(self, response: UpstreamResponse, call: Call) -> AsyncIterator[Message]:
        """JSON-RPC messages from an upstream SSE body, as they arrive. A call's stream ends
        with -31002 at max_call_seconds, however often the backend sends progress or
        keep-alives (SHTTP: senders SHOULD enforce a maximum); a listen stream has none."""
        messages = response.sse_messages()
        deadline = None if call.stream_only else (
            asyncio.get_running_loop().time() + self.settings.max_call_seconds)
        # The mapping spans the yields too: what the lower layer raises while a message is
        # awaited becomes the gateway's error, and nothing thrown in at a yield is mapped.
        try:
            with upstream_errors(self.name, timeout=self.settings.timeout_seconds, request_id=call.id,
                                 what="stream broke"):
                while True:
                    if deadline is None:
                        payload = await anext(messages, _END)
                    else:
                        # Around the read only, never a yield: the timeout must not fire while
                        # the consumer, not this generator, runs.
                        overall = asyncio.timeout_at(deadline)
                        try:
                            async with overall:
                                payload = await anext(messages, _END)
                        except TimeoutError:
                            if overall.expired():
                                raise self.overdue(call) from None
                            raise
                    if payload is _END:
                        return
                    # 2025-03-26 backends may batch messages in one event.
                    for item in payload if isinstance(payload, list) else (payload,):
                        if isinstance(item, dict):
                            yield item
        finally:
            await messages.aclose()
