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
from itertools import count
from typing import Any

# A client's X-Request-Id is taken when it is short and plain (letters, digits and `-_.:/+=`),
# else replaced: it goes into logs, spans and upstream headers, so it must not carry a line
# break, a quote or a kilobyte of anything.
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
# Generated ids: this process's random prefix and a counter, unique across a fleet's replicas
# without a random draw per request.
_PREFIX = os.urandom(6).hex()
_counter = count(1)


def new_request_id() -> str:
    return f"{_PREFIX}-{next(_counter):x}"


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

    def __init__(self, request_id: str, started: float, era: str, scope: dict[str, Any]) -> None:
        self.request_id = request_id
        self.started = started
        self.era = era                  # the client's: modern, legacy
        self.scope = scope              # the ASGI scope (client address, HTTP version)
        self.noted = self.finished = False
        self.backend = self.code = self.cache = self.subject = None

    def note_answer(self, message: dict[str, Any] | None) -> None:
        """The JSON-RPC outcome of the final answer: its error, or isError/resultType."""
        if message is None:
            return
        error = message.get("error")
        if isinstance(error, dict):
            self.code = error.get("code") if type(error.get("code")) is int else None
            if self.code is None:
                self.code = -32603
            msg = error.get("message")
            self.message = msg if isinstance(msg, str) else None
            return
        result = message.get("result")
        if isinstance(result, dict):
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
