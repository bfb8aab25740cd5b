"""The gateway's Prometheus metrics, in one place so dashboards and alerts have one list to read
(docs/observability.md "Metrics").

Label values are bounded and never copied from a request: methods come from the METHODS table
(anything else is "other"), JSON-RPC codes from the codes the protocol and the gateway define
(`code_label`), tool names from the names the route table knows (`tool_label`), backends from
config, outcomes and reasons from small fixed sets. Never a URI, a principal or a raw string.

Two families carry the OpenTelemetry MCP conventions' names (`mcp.server.operation.duration`,
`mcp.client.operation.duration`, exposed as `mcp_server_operation_duration_seconds` and
`mcp_client_operation_duration_seconds`), with the conventions' buckets and attribute names
(dots become underscores in Prometheus). The gateway's own families start at 100 µs: a
pass-through answer takes well under a millisecond, and a smallest bucket of 1 ms held them all.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from gateway import __version__
from gateway.observability import loop_metrics
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.methods import METHODS

# The gateway's own latency families: from 100 µs (a cached answer) to a minute (a long tool).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1, 2.5, 5, 10, 30, 60)
# OpenTelemetry MCP semantic conventions (gen-ai/mcp.md, "Metric: mcp.server.operation.duration"
# and "...client..."): ExplicitBucketBoundaries, seconds.
MCP_OPERATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)

# Methods a client may send (the modern table plus what initialize-era clients send, which the
# gateway answers itself); anything else is "other".
CLIENT_METHODS = (*METHODS, "initialize", "ping", "logging/setLevel", "resources/subscribe",
                  "resources/unsubscribe", "notifications/initialized", "notifications/cancelled",
                  "notifications/roots/list_changed")
METHOD_LABELS = frozenset(CLIENT_METHODS)
# The JSON-RPC codes a label may carry: the protocol's and the gateway's own. A backend's code
# outside this set is "other": backends are not trusted to keep the label set bounded.
_KNOWN_CODES = {code: str(code) for code in (
    rpc.PARSE_ERROR, rpc.INVALID_REQUEST, rpc.METHOD_NOT_FOUND, rpc.INVALID_PARAMS, rpc.INTERNAL_ERROR,
    rpc.HEADER_MISMATCH, rpc.MISSING_REQUIRED_CLIENT_CAPABILITY, rpc.UNSUPPORTED_PROTOCOL_VERSION,
    rpc.LEGACY_RESOURCE_NOT_FOUND, rpc.BACKEND_UNAVAILABLE, rpc.BACKEND_TIMEOUT, rpc.BACKEND_PROTOCOL_ERROR,
    rpc.GATEWAY_OVERLOADED, -32001, -32042)}
# Outcome labels besides the codes: success, an isError result, a code no one defined, and an
# HTTP refusal that carried no JSON-RPC answer.
OK, TOOL_ERROR, OTHER, NONE = "ok", "tool_error", "other", "none"

# -- per request, from the event loop only: lock-free values (loop_metrics.py says why) --------

REQUESTS = loop_metrics.Counter(
    "mcp_gateway_requests_total",
    "MCP requests answered by the gateway, by method, client era (modern, legacy), HTTP status "
    "class and JSON-RPC outcome (ok, tool_error, or the error code).",
    ["method", "era", "status", "code"],
)
REQUEST_SECONDS = loop_metrics.Histogram(
    "mcp_gateway_request_duration_seconds",
    "Time from request start to the last byte of the answer (streams: to their end).",
    ["method", "era"],
    buckets=LATENCY_BUCKETS,
)
IN_FLIGHT = loop_metrics.Gauge("mcp_gateway_requests_in_flight", "MCP requests being answered now.")
BACKEND_REQUESTS = loop_metrics.Counter(
    "mcp_gateway_backend_requests_total",
    "Calls sent to backends, by backend, method, outcome (ok, error, tool_error, unavailable, "
    "timeout, protocol) and JSON-RPC code (ok, tool_error, or the error code).",
    ["backend", "method", "outcome", "code"],
)
BACKEND_SECONDS = loop_metrics.Histogram(
    "mcp_gateway_backend_duration_seconds",
    "Time until a backend's answer started (headers received).",
    ["backend", "method"],
    buckets=LATENCY_BUCKETS,
)
TOOL_CALLS = loop_metrics.Counter(
    "mcp_gateway_tool_calls_total",
    "tools/call by backend, tool (names the route table knows; anything else is \"other\") and "
    "outcome (ok, tool_error, or the JSON-RPC error code).",
    ["backend", "tool", "code"],
)
CACHE_LOOKUPS = loop_metrics.Counter(
    "mcp_gateway_cache_lookups_total",
    "Cacheable backend calls by method, applied cache scope (public, private, none) and outcome "
    "(hit, miss, stale, bypass).",
    ["method", "scope", "outcome"],
)
SERVER_OPERATION = loop_metrics.Histogram(
    "mcp_server_operation_duration_seconds",
    "OpenTelemetry mcp.server.operation.duration: an MCP request as observed by the gateway, from "
    "its arrival until its answer is sent.",
    ["mcp_method_name", "error_type", "gen_ai_tool_name", "mcp_protocol_version", "network_transport"],
    buckets=MCP_OPERATION_BUCKETS,
)
CLIENT_OPERATION = loop_metrics.Histogram(
    "mcp_client_operation_duration_seconds",
    "OpenTelemetry mcp.client.operation.duration: a call to a backend, from its sending until its "
    "answer is complete (streams: their final message).",
    ["mcp_method_name", "error_type", "gen_ai_tool_name", "mcp_protocol_version", "network_transport",
     "server_address"],
    buckets=MCP_OPERATION_BUCKETS,
)
loop_metrics.register([REQUESTS, REQUEST_SECONDS, IN_FLIGHT, BACKEND_REQUESTS, BACKEND_SECONDS, TOOL_CALLS,
                       CACHE_LOOKUPS, SERVER_OPERATION, CLIENT_OPERATION])

requests_child = REQUESTS.labels
request_seconds_child = REQUEST_SECONDS.labels
backend_requests_child = BACKEND_REQUESTS.labels
backend_seconds_child = BACKEND_SECONDS.labels
cache_lookups_child = CACHE_LOOKUPS.labels
in_flight = IN_FLIGHT.labels()


def method_label(method: str | None) -> str:
    return method if method in METHOD_LABELS else OTHER  # type: ignore[return-value]


def status_label(status: int) -> str:
    return f"{status // 100}xx"


def code_label(code: Any) -> str:
    """A JSON-RPC error code as a label value: one the protocol or the gateway defines, else
    "other" (the conventions' error.type `_OTHER` in spans)."""
    return _KNOWN_CODES.get(code, OTHER) if type(code) is int else OTHER


# -- rare events: prometheus_client's own metrics, where a lock costs nothing -----------------

CACHE_STORE_ERRORS = Counter(
    "mcp_gateway_cache_store_errors_total",
    "Cache store operations that failed; the request went on without the cache.",
    ["store", "operation"],
)
CACHE_INVALIDATIONS = Counter(
    "mcp_gateway_cache_invalidations_total",
    "Cache invalidations by kind (lists, resource, backend, flush).",
    ["kind"],
)
MRTR_PARKED = Gauge(
    "mcp_gateway_mrtr_parked_calls",
    "Legacy backend calls parked on this replica, waiting for the client's MRTR retry.",
    ["backend"],
)
MRTR_REFUSED = Counter(
    "mcp_gateway_mrtr_parked_refused_total",
    "Legacy backend calls refused (-31004) because the parked-call cap was reached (total, per_principal).",
    ["backend", "limit"],
)
BACKEND_UP = Gauge(
    "mcp_gateway_backend_up",
    "1 when the backend answered its last discovery or health check, 0 when it did not.",
    ["backend"],
)
HEALTH_CHECKS = Counter(
    "mcp_gateway_backend_health_checks_total",
    "Backend health checks by result (ok, failed).",
    ["backend", "result"],
)
EJECTIONS = Counter(
    "mcp_gateway_backend_ejections_total",
    "Times a backend was taken out of rotation after failing.",
    ["backend"],
)
BACKEND_ENDPOINT_UP = Gauge(
    "mcp_gateway_backend_endpoint_up",
    "1 while one endpoint of a backend (a URL, an address, a stdio instance) is in rotation, 0 while it is "
    "ejected or failing.",
    ["backend", "endpoint"],
)
BACKEND_RESOLVE_FAILURES = Counter(
    "mcp_gateway_backend_resolve_failures_total",
    "Failed DNS resolutions of a backend's hostname (backends[].resolve): the last good set of endpoints "
    "keeps serving.",
    ["backend"],
)
BACKEND_RETRIES = Counter(
    "mcp_gateway_backend_retries_total",
    "Calls sent again to a backend, by why (unsent: it provably never reached the backend; idempotent: a read) "
    "and what happened to the retry (sent, over_budget: the retry budget refused it).",
    ["backend", "reason", "outcome"],
)
BACKEND_OVERLOADED = Counter(
    "mcp_gateway_backend_overloaded_total",
    "Calls refused (-31004) because the backend's max_concurrent_calls and its queue were full.",
    ["backend"],
)
AUTH_FAILURES = Counter(
    "mcp_gateway_auth_failures_total",
    "Requests refused by authentication, by reason (missing_token, invalid_token, expired_token, "
    "insufficient_scope, bad_request, header_too_large).",
    ["reason"],
)
LEGACY_SESSIONS_CREATED = Counter(
    "mcp_gateway_legacy_client_sessions_created_total",
    "Gateway sessions opened for initialize-era clients.",
)
LEGACY_SESSIONS_EXPIRED = Counter(
    "mcp_gateway_legacy_client_sessions_expired_total",
    "Gateway sessions of initialize-era clients that ended idle (not by the client's DELETE).",
)
BACKEND_SESSIONS_CREATED = Counter(
    "mcp_gateway_backend_sessions_created_total",
    "Sessions the gateway initialized with initialize-era backends.",
    ["backend"],
)
BACKEND_SESSIONS_EXPIRED = Counter(
    "mcp_gateway_backend_sessions_expired_total",
    "Sessions of initialize-era backends that ended (expired by the backend, or closed idle).",
    ["backend"],
)
STDIO_RESTARTS = Counter(
    "mcp_gateway_stdio_restarts_total",
    "Backend subprocesses (stdio) started again after they exited.",
    ["backend"],
)
CONFIG_RELOADS = Counter(
    "mcp_gateway_config_reloads_total",
    "Configuration reloads by result: applied (swapped in), unchanged (nothing to apply), "
    "refused (invalid; the running configuration keeps serving).",
    ["result"],
)
BUILD_INFO = Gauge(
    "mcp_gateway_build_info",
    "Always 1; the labels say which gateway build runs.",
    ["version", "python"],
)
BUILD_INFO.labels(__version__, platform.python_version()).set(1)


def set_backend_up(backend: str, up: bool) -> None:
    """The seam for discovery and health checks (issue 18): whether `backend` is answering."""
    BACKEND_UP.labels(backend).set(1 if up else 0)


def forget_backend_up(backend: str) -> None:
    """A reload took `backend` out of the fleet: its series goes, as its /readyz entry does."""
    try:
        BACKEND_UP.remove(backend)
    except KeyError:
        pass


def count_health_check(backend: str, ok: bool) -> None:
    HEALTH_CHECKS.labels(backend, "ok" if ok else "failed").inc()
    set_backend_up(backend, ok)


def count_ejection(backend: str) -> None:
    EJECTIONS.labels(backend).inc()
    set_backend_up(backend, False)


RELOAD_RESULTS = ("applied", "unchanged", "refused")


def count_reload(result: str) -> None:
    """One configuration reload (gateway/reload/reloader.py) and its result, of RELOAD_RESULTS."""
    CONFIG_RELOADS.labels(result).inc()


_AUTH_REASONS = {(400, "invalid_request"): "bad_request", (401, None): "missing_token",
                 (401, "invalid_token"): "invalid_token", (403, "insufficient_scope"): "insufficient_scope",
                 (431, None): "header_too_large"}


def count_auth_failure(status: int, error: str | None, description: str) -> None:
    """One refusal by the authentication policy; the reason from a fixed set, never the token's
    own words."""
    reason = _AUTH_REASONS.get((status, error), OTHER)
    if reason == "invalid_token" and description == "token expired":
        reason = "expired_token"
    AUTH_FAILURES.labels(reason).inc()


class _GaugeCallbacks(Collector):
    """Gauges read at scrape time from the objects that own the number (open legacy sessions):
    nothing to keep in step on the hot path."""

    def __init__(self) -> None:
        self.sources: dict[str, tuple[str, Callable[[], Iterable[tuple[tuple[str, ...], float]]], tuple[str, ...]]] = {}

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        for name, (doc, read, labelnames) in list(self.sources.items()):
            family = GaugeMetricFamily(name, doc, labels=list(labelnames))
            try:
                for labels, value in read():
                    family.add_metric(list(labels), value)
            except Exception:  # a scrape must never fail because one source did
                continue
            yield family


_callbacks = _GaugeCallbacks()
REGISTRY.register(_callbacks)


def gauge_callback(name: str, documentation: str, read: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
                   labelnames: tuple[str, ...] = ()) -> None:
    """Export `read()` (label values, value) pairs as gauge `name` at every scrape; a later call
    with the same name replaces the source (one running gateway per process)."""
    _callbacks.sources[name] = (documentation, read, labelnames)


# Declared here so that every family is listed in one module; the running app gives them their
# sources (app.py `_export_gauges`).
LEGACY_CLIENT_SESSIONS = "mcp_gateway_legacy_client_sessions"
BACKEND_SESSIONS = "mcp_gateway_backend_sessions"
gauge_callback(LEGACY_CLIENT_SESSIONS, "Open gateway sessions of initialize-era clients.", lambda: [])
gauge_callback(BACKEND_SESSIONS, "Open sessions with initialize-era backends.", lambda: [], ("backend",))


# -- series made at start-up, so that `rate()` sees the first event ---------------------------

_FORWARDED = ("tools/call", "tools/list", "prompts/get", "prompts/list", "resources/read", "resources/list",
              "resources/templates/list", "completion/complete", "server/discover")


def initialise(backends: Iterable[tuple[str, str]]) -> None:
    """Zero series for every known method and backend. `backends`: (name, server.address)."""
    known = list(backends)
    for method in CLIENT_METHODS:
        for era in ("modern", "legacy"):
            REQUESTS.labels(method, era, "2xx", OK)
            REQUEST_SECONDS.labels(method, era)
        REQUESTS.labels(method, "modern", "4xx", code_label(rpc.INVALID_PARAMS))
        REQUESTS.labels(method, "modern", "5xx", code_label(rpc.BACKEND_UNAVAILABLE))
        SERVER_OPERATION.labels(method, "", "", "", "tcp")
    for backend, address in known:
        BACKEND_UP.labels(backend)
        EJECTIONS.labels(backend)
        STDIO_RESTARTS.labels(backend)
        for result in ("ok", "failed"):
            HEALTH_CHECKS.labels(backend, result)
        BACKEND_OVERLOADED.labels(backend)
        BACKEND_RESOLVE_FAILURES.labels(backend)
        for reason in ("unsent", "idempotent"):
            for outcome in ("sent", "over_budget"):
                BACKEND_RETRIES.labels(backend, reason, outcome)
        TOOL_CALLS.labels(backend, OTHER, OK)
        TOOL_CALLS.labels(backend, OTHER, TOOL_ERROR)
        for method in _FORWARDED:
            BACKEND_SECONDS.labels(backend, method)
            for outcome, code in ((OK, OK), ("error", OTHER), ("unavailable", code_label(rpc.BACKEND_UNAVAILABLE)),
                                  ("timeout", code_label(rpc.BACKEND_TIMEOUT))):
                BACKEND_REQUESTS.labels(backend, method, outcome, code)
    for reason in ("missing_token", "invalid_token", "expired_token", "insufficient_scope"):
        AUTH_FAILURES.labels(reason)
    for store, operation in (("redis", "get"), ("redis", "set")):
        CACHE_STORE_ERRORS.labels(store, operation)
    for result in RELOAD_RESULTS:
        CONFIG_RELOADS.labels(result)
    for method in ("tools/list", "resources/read", "prompts/list", "resources/list"):
        for scope in ("public", "private"):
            for outcome in ("hit", "miss", "stale"):
                CACHE_LOOKUPS.labels(method, scope, outcome)
    # The subscription hub's and the legacy backends' own families, per known backend too.
    from gateway.subscriptions import metrics as listen

    for backend, _ in known:
        for family in (listen.UPSTREAMS, listen.NOTIFICATIONS, listen.GAPS, listen.RECONNECTS, MRTR_PARKED,
                       BACKEND_SESSIONS_CREATED, BACKEND_SESSIONS_EXPIRED):
            family.labels(backend)
        for limit in ("total", "per_principal"):
            MRTR_REFUSED.labels(backend, limit)
        for outcome in ("granted", "relisten", "nothing"):
            listen.LATE_ACKS.labels(backend, outcome)
        for outcome in ("ok", "failed"):
            listen.POLLS.labels(backend, outcome)
    for reason in ("total", "per_principal", "shutdown"):
        listen.REJECTED.labels(reason)
    for kind in ("lists", "resource", "backend", "flush"):
        CACHE_INVALIDATIONS.labels(kind)
