"""Prometheus metrics of configuration reloads (labels bounded: a fixed set of results)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RELOADS = Counter(
    "mcp_gateway_config_reloads_total",
    "Configuration reloads by result: applied (swapped in), unchanged (nothing to apply), "
    "refused (invalid; the running configuration keeps serving).",
    ["result"],
)
GENERATION = Gauge("mcp_gateway_config_generation",
                   "Reloads applied since the process started (0: the start-up config).")
LAST_APPLIED = Gauge("mcp_gateway_config_last_reload_timestamp_seconds",
                     "When the running configuration was swapped in (Unix time; 0: never reloaded).")
NEEDS_RESTART = Gauge("mcp_gateway_config_needs_restart",
                      "1 while the file holds settings that only a restart applies (logged at reload).")
for _result in ("applied", "unchanged", "refused"):
    RELOADS.labels(_result)
