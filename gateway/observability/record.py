"""What one MCP request did, noted by the layers that know (endpoint, dispatch, cache) and read
once when it ends by RequestTelemetry for its metrics, its span and its access line.

The record travels in a context variable: set by the telemetry step for the request's task and
copied into every task the request spawns, so no layer passes it along by hand and none of the
deep layers imports the middleware. One object per request, slots only, no dict.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from itertools import count
from typing import Any

import orjson

# A client's X-Request-Id is taken when it is short and plain (letters, digits and `-_.:/+=`),
# else replaced: it goes into logs, spans and upstream headers, so it must not carry a line
# break, a quote or a kilobyte of anything.
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
# Generated ids: this process's random prefix and a counter, unique across a fleet's replicas
# without a random draw per request.
_PREFIX = os.urandom(6).hex()
# `new_request_id()` is `f"{_PREFIX}-{n:x}"` for n = 1, 2, ...: the next item of a map over a
# counter, so that making an id runs in C (str.format), with no Python frame per request.
new_request_id: Callable[[], str] = map(f"{_PREFIX}-{{:x}}".format, count(1)).__next__
# Error answers are decoded for their JSON-RPC code only when small (they always are).
_MAX_ERROR_BODY = 64 * 1024


def request_id_from(header: str | None) -> str:
    """The client's id when it is short and plain, else a new one."""
    if header is not None and len(header) <= MAX_REQUEST_ID and header.isascii() and (
            header.isalnum() or _REQUEST_ID.fullmatch(header)):
        return header
    return new_request_id()


class RequestRecord:
    """Defaults are class attributes and `__init__` sets few: the record is made for every
    request, and setting two dozen slots cost more than the rest of the telemetry step. Those
    read on every request while still unset (a pass-through call: `noted`, `finished`,
    `backend`, `code`, `cache`, `subject`) are set in `__init__` too: reading a class default
    through an instance costs several times an instance's own attribute, more than setting it
    in `__init__` (bench/README.md "The ≤ 5 µs budget, counted right")."""

    tool_error = False   # a result with isError: true
    transport = "streamable-http"  # or "sse" (HTTP+SSE clients)
    method: str | None = None       # the JSON-RPC method, as the client sent it
    name: str | None = None         # tool/prompt name (client-facing) or resource URI
    jsonrpc_id: Any = None
    version: str | None = None      # MCP protocol version
    meta: dict[str, Any] | None = None
    backend: str | None = None
    cache: str | None = None        # hit, miss, stale, bypass
    cache_scope: str | None = None
    code: int | None = None         # the JSON-RPC error code of the answer
    message: str | None = None      # and its message
    result_type: str | None = None
    translation: str | None = None  # legacy-session, legacy-client, mrtr-minted, ...
    subject: str | None = None
    tool_label: str | None = None   # the tool's metric label, when the route table knows it
    authorization: str | None = None  # allow, deny: what the authorization rules decided
    authorization_rule: str | None = None  # the deciding rule's id (or rules.N, default)
    rate_limit: str | None = None   # allow, deny: what the rate limits that apply decided
    # The limits counted (allow) or the one that refused (deny): the compiled limits themselves
    # (their `.label` is what is exported), so that noting them per request builds nothing.
    rate_limits: tuple[Any, ...] = ()
    status = 500
    span: Any = None
    finished = False
    noted = False                   # a call was noted (the first dispatch of the request)

    def __init__(self, request_id: str, started: float, era: str, scope: dict[str, Any],
                 send: Callable[[MutableMapping[str, Any]], Awaitable[None]] | None = None) -> None:
        self.request_id = request_id
        self.started = started
        self.era = era                  # the client's: modern, legacy
        self.scope = scope              # the ASGI scope (client address, HTTP version)
        self.noted = self.finished = False
        self.backend = self.code = self.cache = self.subject = None
        # The server's `send`, which `send_noting` wraps (the telemetry step hands the app the
        # record's bound method: no closure and cells made per request).
        self.downstream = send
        self.error_body: list[bytes] | None = None  # an error answer's body, while it arrives

    def send_noting(self, message: MutableMapping[str, Any]) -> Awaitable[None]:
        """The app's `send`: notes the answer's status (and an error answer's JSON-RPC code from
        its body) and echoes the request id. A plain method handing back the server's own
        awaitable: an `async def` would make one more coroutine per message sent."""
        if message["type"] == "http.response.start":
            self.status = status = message["status"]
            message["headers"] = [*message.get("headers", ()), (b"x-request-id", self.request_id.encode())]
            if status >= 400 and self.code is None:
                self.error_body = []
        elif self.error_body is not None and message["type"] == "http.response.body":
            self.error_body.append(message.get("body", b""))
            if not message.get("more_body", False):
                body, self.error_body = b"".join(self.error_body), None
                self._note_error_body(body)
        return self.downstream(message)  # type: ignore[misc]

    def _note_error_body(self, body: bytes) -> None:
        if self.code is not None or not body or len(body) > _MAX_ERROR_BODY or body[:1] != b"{":
            return
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if isinstance(message, dict):
            self.note_answer(message)

    def note_answer(self, message: dict[str, Any] | None) -> None:
        """The JSON-RPC outcome of the final answer: its error, or isError/resultType."""
        if message is None:
            return
        result = message.get("result")
        # A result object and no "error" at all (most answers) goes straight to the result's
        # reading; anything else is read as it always was: an error object first.
        if type(result) is not dict or "error" in message:
            error = message.get("error")
            if isinstance(error, dict):
                self.code = error.get("code") if type(error.get("code")) is int else None
                if self.code is None:
                    self.code = -32603
                msg = error.get("message")
                self.message = msg if isinstance(msg, str) else None
                return
            if not isinstance(result, dict):
                return
        self.tool_error = result.get("isError") is True
        rtype = result.get("resultType")
        self.result_type = rtype if rtype in ("complete", "input_required", "task") else None


CURRENT: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("mcp_gateway_request", default=None)
current = CURRENT.get


def note_cache(outcome: str, scope: str | None) -> None:
    record = CURRENT.get()
    if record is not None and record.cache is None:
        record.cache, record.cache_scope = outcome, scope


def note_translation(kind: str) -> None:
    """An era translation the gateway performed for this request (legacy-session, mrtr-minted)."""
    record = CURRENT.get()
    if record is not None and record.translation is None:
        record.translation = kind


def note_authorization(allowed: bool, rule: str) -> None:
    """What the authorization rules decided for this request, and by which rule (its
    configured id, `rules.N`, or `default`): never the request's own values."""
    record = CURRENT.get()
    if record is not None:
        record.authorization, record.authorization_rule = ("allow" if allowed else "deny"), rule


def note_rate_limit(allowed: bool, limits: tuple[Any, ...]) -> None:
    """What the rate limits decided: the limits counted, or the one that refused (compiled
    `Limit`s; their labels come from the configuration: `id` or `rate_limits.N`)."""
    record = CURRENT.get()
    if record is not None:
        record.rate_limit, record.rate_limits = ("allow" if allowed else "deny"), limits
