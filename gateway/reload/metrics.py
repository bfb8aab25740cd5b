"""Prometheus gauges of the running configuration. The count of reloads by result,
mcp_gateway_config_reloads_total, is the observability family's (`metrics.count_reload`)."""

from __future__ import annotations

from prometheus_client import Gauge

GENERATION = Gauge("mcp_gateway_config_generation",
                   "Reloads applied since the process started (0: the start-up config).")
LAST_APPLIED = Gauge("mcp_gateway_config_last_reload_timestamp_seconds",
                     "When the running configuration was swapped in (Unix time; 0: never reloaded).")
NEEDS_RESTART = Gauge("mcp_gateway_config_needs_restart",
                      "1 while the file holds settings that only a restart applies (logged at reload).")
