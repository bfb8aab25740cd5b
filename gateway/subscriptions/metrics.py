"""Prometheus metrics of the subscription hub (labels bounded: backends come from config)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CLIENT_STREAMS = Gauge("mcp_gateway_listen_client_streams", "Client subscriptions/listen streams open on this replica.")
UPSTREAMS = Gauge(
    "mcp_gateway_listen_upstreams",
    "Upstream subscriptions/listen streams this replica holds, by backend.",
    ["backend"],
)
NOTIFICATIONS = Counter(
    "mcp_gateway_listen_notifications_total",
    "Upstream notifications received by this replica's hub (from its own upstreams or the bus), by backend.",
    ["backend"],
)
GAPS = Counter(
    "mcp_gateway_listen_gaps_total",
    "Upstream listen streams re-established after a drop or handover (clients told to refetch).",
    ["backend"],
)
RECONNECTS = Counter(
    "mcp_gateway_listen_upstream_reconnects_total",
    "Upstream listen connection attempts after the first, by backend.",
    ["backend"],
)
OVERFLOWS = Counter(
    "mcp_gateway_listen_overflows_total",
    "Client listen streams closed because the client did not keep up (its queue was full).",
)
LATE_ACKS = Counter(
    "mcp_gateway_listen_late_acks_total",
    "Upstream acks that came after a client's own ack went out without them, by backend and outcome "
    "(granted: delivered from then on; relisten: the client stream was closed so that it re-listens; "
    "nothing: the ack granted none of it).",
    ["backend", "outcome"],
)
REJECTED = Counter(
    "mcp_gateway_listen_rejected_total",
    "subscriptions/listen requests refused by a limit (per_principal, total, descriptors) or during shutdown.",
    ["reason"],
)
POLLS = Counter(
    "mcp_gateway_listen_polls_total",
    "Polls of a backend that cannot listen (its lists and subscribed resources), by backend and outcome (ok, failed).",
    ["backend", "outcome"],
)
FANOUT_SECONDS = Histogram(
    "mcp_gateway_listen_fanout_seconds",
    "Time this replica took to hand one upstream notification to every client stream of the upstream "
    "stream, from the first to the last (under the gateway's own HTTP/1.1 server: written to each "
    "connection). It grows with the streams per replica: what the last of them waits for.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0),
)
