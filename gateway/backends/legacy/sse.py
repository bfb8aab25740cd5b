"""HTTP+SSE (2024-11-05) as a client: the transport before Streamable HTTP.

A session is one long GET on the server's URL. Its first event, `endpoint`, names the URI to
POST messages to; every POST is acknowledged with 202 and everything the server sends —
responses, notifications, its own requests — arrives as `message` events on that one GET
stream (2024-11-05 basic/transports §HTTP with SSE). The session lives exactly as long as the
stream: when it ends, the server has forgotten the session, so the requests in flight fail
and the backend opens a new session for the next call.

Attribution is the stdio one (`stdio.py`): responses by id, progress by token, session-wide
notifications to the listeners; a log message or a server request is credited to the one
request in flight that can have sent it, and dropped or refused when several can. Backends of this age are
usually not concurrent anyway, and the pool keeps a session per client-capability set.

The endpoint must be on the origin of the SSE URL: it is where the backend's configured
headers (an API key, say) go, and a stream must not be able to send them elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import orjson

from gateway.backends import http1, tls
from gateway.backends.errors import UpstreamError, describe, upstream_errors
from gateway.backends.legacy.backend import LegacyBackend
from gateway.backends.exchange import Exchange
from gateway.backends.legacy.session import LegacySession, Message, NotificationSink, SessionExpired
from gateway.backends.http1 import UpstreamResponse
from gateway.observability.tracing import outgoing_headers
from gateway.protocol import jsonrpc as rpc
from gateway.protocol import sse
from gateway.backends.replica import ReplicaContext
from gateway.settings import BackendSettings

log = logging.getLogger("gateway.backends.legacy.sse")



def endpoint_uri(stream_url: str, data: str) -> str:
    """The POST endpoint an `endpoint` event names, resolved against the stream's URL.
    Raises ValueError when it points at another origin."""
    endpoint = urljoin(stream_url, data.strip())
    here, there = urlsplit(stream_url), urlsplit(endpoint)
    if (there.scheme, there.netloc) != (here.scheme, here.netloc):
        raise ValueError(f"endpoint {endpoint!r} is not on the origin of {stream_url!r}")
    return endpoint


class SseSession(LegacySession):
    def __init__(self, backend: str, capabilities: dict[str, Any], on_notification: NotificationSink, *,
                 client: http1.Http1Client, posts: http1.Http1Client, url: str, headers: dict[str, str],
                 timeout: float, connect_timeout: float, on_lost: Callable[[SseSession, str], None]) -> None:
        """`client` holds the GET stream, `posts` carries every message; `on_lost` hears that
        the stream ended while the session was open."""
        super().__init__(backend, capabilities, on_notification)
        self.client = client
        self.posts = posts
        self.url = url
        self.static_headers = headers
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.on_lost = on_lost
        self.endpoint: str | None = None
        self._reader: asyncio.Task[None] | None = None

    # -- LegacySession transport ------------------------------------------------------------

    async def _initialize(self, message: Message) -> Message:
        self.endpoint = await self._connect()
        holder = Exchange(message["id"], "initialize")
        self._exchanges[holder.backend_id] = holder
        try:
            await self._post(message)
            return await holder.next(self.timeout)
        except SessionExpired:
            raise rpc.backend_protocol_error(
                self.backend, "the message endpoint it named does not know its session") from None
        finally:
            self.forget(holder)

    async def _send_request(self, exchange: Exchange, message: Message) -> None:
        await self._post(message)

    async def _send(self, message: Message) -> None:
        await self._post(message)

    async def _terminate(self) -> None:
        # No DELETE in this transport: the session ends with its stream.
        if self._reader is not None:
            self._reader.cancel()

    # -- the stream -------------------------------------------------------------------------

    async def _connect(self) -> str:
        """Open the GET stream and wait for its `endpoint` event; the reader keeps running.
        Errors name the backend, never its URLs: they reach clients and the open `/readyz`,
        and a URL may carry credentials or (the message endpoint) the session id."""
        headers = {**self.static_headers, "accept": "text/event-stream"}
        response = await self.client.request("GET", self.url, headers, read_timeout=None)
        if response.status != 200 or response.content_type != "text/event-stream":
            response.close()
            raise rpc.backend_protocol_error(
                self.backend, f"the SSE stream's GET: HTTP {response.status} ({response.content_type or 'no body type'}),"
                              " not an HTTP+SSE stream")
        endpoint: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read(response, endpoint))
        try:
            async with asyncio.timeout(self.connect_timeout):
                return await asyncio.shield(endpoint)
        except TimeoutError:
            self._reader.cancel()
            raise rpc.backend_protocol_error(
                self.backend, f"the SSE stream's GET: no endpoint event within {self.connect_timeout:g}s") from None

    async def _read(self, response: UpstreamResponse, endpoint: asyncio.Future[str]) -> None:
        reason = "the backend ended the SSE stream"
        try:
            async for event, data in response.events(sse.Decoder()):
                if event == "endpoint":
                    if not endpoint.done():
                        try:
                            endpoint.set_result(endpoint_uri(self.url, data))
                        except ValueError as exc:
                            endpoint.set_exception(rpc.backend_protocol_error(self.backend, str(exc)))
                            return
                elif event == "message" and data:
                    self._deliver(data)
        except (UpstreamError, TimeoutError) as exc:
            # Not a call's error but the session's end, which fails every call it carries.
            reason = f"the SSE stream broke: {describe(exc)}"
        finally:
            response.close()
        if not endpoint.done():
            endpoint.set_exception(rpc.backend_protocol_error(self.backend, f"{reason} before its endpoint event"))
            return
        if not self.closed:
            log.info("backend %s: %s; the session is gone", self.backend, reason)
            self.fail_all(rpc.backend_unavailable(self.backend, reason))
            self.on_lost(self, reason)

    def _deliver(self, data: str) -> None:
        for message in self.decode(data):
            origin = None
            if "method" in message and message["method"] != "notifications/progress":
                origin = self.sole_origin(message)  # one stream for everything: stdio's attribution
            self.route(message, origin)

    async def _post(self, message: Message) -> None:
        assert self.endpoint is not None
        headers = {**self.static_headers, "content-type": "application/json", **outgoing_headers()}
        response = await self.posts.post(self.endpoint, orjson.dumps(message), headers,
                                         read_timeout=self.connect_timeout)
        with upstream_errors(self.backend, timeout=self.connect_timeout):
            body = await response.read()
        status = response.status
        if status == 404:
            raise SessionExpired(self.endpoint)  # the server no longer knows the session id
        if status >= 500:
            raise rpc.backend_unavailable(self.backend, f"HTTP {status} from the message endpoint")
        if 400 <= status < 500:
            raise rpc.backend_refused(self.backend, status, body, what=message.get("method") or "a response")
        if status >= 300:
            raise rpc.backend_protocol_error(
                self.backend, f"HTTP {status} for {message.get('method') or 'a response'}: {body[:200]!r}")


class LegacySseBackend(LegacyBackend):
    """An HTTP+SSE backend (2024-11-05, or a newer server still offering that transport)."""

    def __init__(self, settings: BackendSettings, replica: ReplicaContext | None = None) -> None:
        super().__init__(settings, replica)
        assert settings.url is not None
        self.url = settings.url
        context = tls.client_context(settings.tls)
        self._posts = http1.for_backend(settings, context)
        # The sessions' GET streams live as long as the sessions: a pool of their own, so
        # that they never hold a slot a POST needs.
        self._streams = http1.for_backend(settings, context, max_connections=settings.session_pool_size + 1)
        self._renewals: set[asyncio.Task[Any]] = set()

    async def aclose(self) -> None:
        for task in list(self._renewals):
            task.cancel()
        await super().aclose()
        await self._streams.aclose()
        await self._posts.aclose()

    def _new_session(self, capabilities: dict[str, Any], headers: Mapping[str, str]) -> LegacySession:
        return SseSession(self.name, capabilities, self.listens.deliver, client=self._streams, posts=self._posts,
                          url=self.url, headers=headers, timeout=self.settings.timeout_seconds,
                          connect_timeout=self.settings.connect_timeout_seconds, on_lost=self._lost)

    async def open_channel(self, session: LegacySession) -> tuple[bool, asyncio.Task[None] | None]:
        return True, None  # the session's own stream carries every notification

    def _lost(self, session: SseSession, reason: str) -> None:
        """A session's stream ended. The listen session is replaced at once (the listeners
        are re-subscribed and told that lists may have changed, as after an expiry); any
        other is closed, and the next call opens a fresh one."""
        if session is self.listens.session and session in self.pool.pinned:
            task = asyncio.ensure_future(self._renew(session))
            self._renewals.add(task)
            task.add_done_callback(self._renewals.discard)
        else:
            session.spawn(session.close())

    async def _renew(self, session: SseSession) -> None:
        try:
            await self.pool.renew(session)
        except rpc.McpError as exc:
            log.warning("backend %s: could not reopen the listen session: %s", self.name, exc.message)
            self.listens.end_all()
