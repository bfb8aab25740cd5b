"""The gateway's Prometheus metrics, in one place so dashboards have one list to read.

Label values are bounded: methods come from the METHODS table (anything else is "other"),
backends from config, outcomes from small fixed sets. Never a tool name, URI or principal.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gateway.observability import loop_metrics
from gateway.protocol.methods import METHODS

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Updated on every request, from the event loop only: lock-free values (loop_metrics.py says
# why). The rest below are prometheus_client's own: rare events, where a lock costs nothing.
REQUESTS = loop_metrics.Counter(
    "mcp_gateway_requests_total",
    "MCP requests answered by the gateway, by method and HTTP status class.",
    ["method", "status"],
)
REQUEST_SECONDS = loop_metrics.Histogram(
    "mcp_gateway_request_duration_seconds",
    "Time from request start to the last byte of the answer (streams: to their end).",
    ["method"],
    buckets=_LATENCY_BUCKETS,
)
IN_FLIGHT = loop_metrics.Gauge("mcp_gateway_requests_in_flight", "MCP requests being answered now.")
BACKEND_REQUESTS = loop_metrics.Counter(
    "mcp_gateway_backend_requests_total",
    "Calls sent to backends, by backend, method and outcome (ok, error, unavailable, timeout, protocol).",
    ["backend", "method", "outcome"],
)
BACKEND_SECONDS = loop_metrics.Histogram(
    "mcp_gateway_backend_duration_seconds",
    "Time until a backend's answer started (headers received).",
    ["backend", "method"],
    buckets=_LATENCY_BUCKETS,
)
CACHE_LOOKUPS = loop_metrics.Counter(
    "mcp_gateway_cache_lookups_total",
    "Cacheable backend calls by method, applied cache scope (public, private, none) and outcome "
    "(hit, miss, stale, bypass).",
    ["method", "scope", "outcome"],
)
loop_metrics.register([REQUESTS, REQUEST_SECONDS, IN_FLIGHT, BACKEND_REQUESTS, BACKEND_SECONDS, CACHE_LOOKUPS])

requests_child = REQUESTS.labels
request_seconds_child = REQUEST_SECONDS.labels
backend_requests_child = BACKEND_REQUESTS.labels
backend_seconds_child = BACKEND_SECONDS.labels
cache_lookups_child = CACHE_LOOKUPS.labels
in_flight = IN_FLIGHT.labels()


def method_label(method: str | None) -> str:
    return method if method in METHODS else "other"


def status_label(status: int) -> str:
    return f"{status // 100}xx"


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

# -- backend health (issue 18, backends/health.py). The first three are declared word for
# word as on the observability branch, so that a merge keeps one of each.
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
