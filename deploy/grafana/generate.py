"""Writes mcp-gateway.json, the Grafana dashboard for the gateway's Prometheus metrics.

Kept as code so that panels stay consistent; `tests/unit/test_dashboard.py` checks that every
metric the dashboard queries is one the gateway exports. Run: python deploy/grafana/generate.py
"""

from __future__ import annotations

import json
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}


def panel(title: str, exprs: list[tuple[str, str]], *, unit: str = "short", x: int, y: int, w: int = 12,
          h: int = 8, kind: str = "timeseries") -> dict:
    return {
        "type": kind,
        "title": title,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend, "datasource": DS}
                    for i, (expr, legend) in enumerate(exprs)],
    }


def row(title: str, y: int) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            "panels": []}


# Every query is scoped by the dashboard's variables: job and instance everywhere, backend on
# the families that have a backend label.
SCOPE = 'job=~"$job",instance=~"$instance"'
BACKEND_SCOPE = SCOPE + ',backend=~"$backend"'


def _sel(where: str = "", *, backend: bool = False) -> str:
    base = BACKEND_SCOPE if backend else SCOPE
    return f"{{{base}{',' + where if where else ''}}}"


def quantile(q: str, metric: str, by: str, where: str = "", *, backend: bool = False) -> str:
    return (f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({metric}_bucket{_sel(where, backend=backend)}[$__rate_interval])))")


def rate(metric: str, by: str, where: str = "", *, backend: bool = False) -> str:
    return f"sum by ({by}) (rate({metric}{_sel(where, backend=backend)}[$__rate_interval]))"


def gauge(metric: str, by: str, where: str = "", *, backend: bool = False) -> str:
    return f"sum by ({by}) ({metric}{_sel(where, backend=backend)})"


def ratio(metric: str, by: str, part: str) -> str:
    return f"{rate(metric, by, part)} / {rate(metric, by)}"


def dashboard() -> dict:
    panels = [
        row("Traffic", 0),
        panel("Requests / s by method and era", [(rate("mcp_gateway_requests_total", "method, era"),
                                                  "{{method}} {{era}}")], unit="reqps", x=0, y=1),
        panel("Answers by HTTP status class", [(rate("mcp_gateway_requests_total", "status"), "{{status}}")],
              unit="reqps", x=12, y=1),
        panel("Latency p50 / p99 by method", [
            (quantile("0.5", "mcp_gateway_request_duration_seconds", "method"), "p50 {{method}}"),
            (quantile("0.99", "mcp_gateway_request_duration_seconds", "method"), "p99 {{method}}"),
        ], unit="s", x=0, y=9),
        panel("In flight", [(gauge("mcp_gateway_requests_in_flight", "instance"), "{{instance}}")], x=12, y=9),
        row("Errors", 17),
        panel("Errors / s by JSON-RPC code", [
            (rate("mcp_gateway_requests_total", "code", 'code!="ok"'), "{{code}}")], unit="reqps", x=0, y=18),
        panel("Backend errors / s by backend and code", [
            (rate("mcp_gateway_backend_requests_total", "backend, code", 'outcome!="ok"', backend=True),
             "{{backend}} {{code}}")], unit="reqps", x=12, y=18),
        panel("Auth failures / s by reason", [
            (rate("mcp_gateway_auth_failures_total", "reason"), "{{reason}}")], unit="reqps", x=0, y=26),
        panel("Tool calls / s by tool and outcome", [
            (rate("mcp_gateway_tool_calls_total", "tool, code", backend=True), "{{tool}} {{code}}")],
              unit="reqps", x=12, y=26),
        row("Tools", 34),
        panel("Tool latency p50 / p99 (mcp.server.operation.duration)", [
            (quantile("0.5", "mcp_server_operation_duration_seconds", "gen_ai_tool_name",
                      'mcp_method_name="tools/call"'), "p50 {{gen_ai_tool_name}}"),
            (quantile("0.99", "mcp_server_operation_duration_seconds", "gen_ai_tool_name",
                      'mcp_method_name="tools/call"'), "p99 {{gen_ai_tool_name}}"),
        ], unit="s", x=0, y=35),
        panel("Backend call p99 until the answer is complete (mcp.client.operation.duration)", [
            (quantile("0.99", "mcp_client_operation_duration_seconds", "mcp_method_name, server_address"),
             "{{mcp_method_name}} {{server_address}}")], unit="s", x=12, y=35),
        row("Backends", 43),
        panel("Backend up", [(gauge("mcp_gateway_backend_up", "backend", backend=True), "{{backend}}")],
              x=0, y=44, w=8),
        panel("Health checks, ejections, stdio restarts", [
            (rate("mcp_gateway_backend_health_checks_total", "backend, result", backend=True),
             "check {{backend}} {{result}}"),
            (rate("mcp_gateway_backend_ejections_total", "backend", backend=True), "ejected {{backend}}"),
            (rate("mcp_gateway_stdio_restarts_total", "backend", backend=True), "restarted {{backend}}"),
        ], x=8, y=44, w=8),
        panel("Backend calls / s by outcome", [
            (rate("mcp_gateway_backend_requests_total", "backend, outcome", backend=True), "{{backend}} {{outcome}}")],
              unit="reqps", x=16, y=44, w=8),
        panel("Backend time to first byte, p99", [
            (quantile("0.99", "mcp_gateway_backend_duration_seconds", "backend", backend=True), "{{backend}}")],
              unit="s", x=0, y=52, w=24),
        row("Resilience", 60),
        panel("Endpoints in rotation (1 in, 0 ejected or failing)", [
            (gauge("mcp_gateway_backend_endpoint_up", "backend, endpoint", backend=True), "{{backend}} {{endpoint}}")],
              x=0, y=61, w=8),
        panel("Retries / s by reason and outcome", [
            (rate("mcp_gateway_backend_retries_total", "backend, reason, outcome", backend=True),
             "{{backend}} {{reason}} {{outcome}}")], unit="reqps", x=8, y=61, w=8),
        panel("Overload refusals (-31004) and DNS failures", [
            (rate("mcp_gateway_backend_overloaded_total", "backend", backend=True), "overloaded {{backend}}"),
            (rate("mcp_gateway_backend_resolve_failures_total", "backend", backend=True), "DNS {{backend}}"),
        ], unit="reqps", x=16, y=61, w=8),
        row("Governance", 69),
        panel("Rate-limited (429) / s by limit", [
            (rate("mcp_gateway_rate_limited_total", "limit"), "{{limit}}")], unit="reqps", x=0, y=70, w=8),
        panel("Rate limits decided locally because Redis failed", [
            (rate("mcp_gateway_rate_limit_fallbacks_total", "instance"), "{{instance}}")], unit="reqps",
              x=8, y=70, w=8),
        panel("Tool definitions changed since pinned", [
            (rate("mcp_gateway_tool_definition_changes_total", "backend, action", backend=True),
             "{{backend}} {{action}}")], x=16, y=70, w=8),
        row("Cache", 78),
        panel("Hit ratio by scope", [(ratio("mcp_gateway_cache_lookups_total", "scope", 'outcome="hit"'),
                                      "{{scope}}")], unit="percentunit", x=0, y=79, w=8),
        panel("Lookups by outcome and scope", [
            (rate("mcp_gateway_cache_lookups_total", "outcome, scope"), "{{outcome}} {{scope}}")],
              unit="reqps", x=8, y=79, w=8),
        panel("Store errors and invalidations", [
            (rate("mcp_gateway_cache_store_errors_total", "store, operation"), "error {{store}} {{operation}}"),
            (rate("mcp_gateway_cache_invalidations_total", "kind"), "invalidated {{kind}}"),
        ], x=16, y=79, w=8),
        row("Subscriptions", 87),
        panel("Listen streams and upstreams", [
            (gauge("mcp_gateway_listen_client_streams", "instance"), "client streams {{instance}}"),
            (gauge("mcp_gateway_listen_upstreams", "backend", backend=True), "upstreams {{backend}}"),
        ], x=0, y=88, w=8),
        panel("Notifications / s by backend", [
            (rate("mcp_gateway_listen_notifications_total", "backend", backend=True), "{{backend}}")],
              unit="reqps", x=8, y=88, w=8),
        panel("Trouble: overflows, gaps, reconnects, refusals", [
            (rate("mcp_gateway_listen_overflows_total", "instance"), "overflows {{instance}}"),
            (rate("mcp_gateway_listen_gaps_total", "backend", backend=True), "gaps {{backend}}"),
            (rate("mcp_gateway_listen_upstream_reconnects_total", "backend", backend=True), "reconnects {{backend}}"),
            (rate("mcp_gateway_listen_rejected_total", "reason"), "refused {{reason}}"),
            (rate("mcp_gateway_listen_late_acks_total", "backend, outcome", backend=True),
             "late ack {{backend}} {{outcome}}"),
            (rate("mcp_gateway_listen_polls_total", "backend, outcome", 'outcome="failed"', backend=True),
             "failed polls {{backend}}"),
        ], x=16, y=88, w=8),
        row("Sessions (initialize-era clients and backends)", 96),
        panel("Legacy client sessions", [
            (gauge("mcp_gateway_legacy_client_sessions", "instance"), "open {{instance}}"),
            (rate("mcp_gateway_legacy_client_sessions_created_total", "instance"), "created {{instance}}"),
            (rate("mcp_gateway_legacy_client_sessions_expired_total", "instance"), "expired {{instance}}"),
        ], x=0, y=97, w=8),
        panel("Backend sessions", [
            (gauge("mcp_gateway_backend_sessions", "backend", backend=True), "open {{backend}}"),
            (rate("mcp_gateway_backend_sessions_created_total", "backend", backend=True), "created {{backend}}"),
            (rate("mcp_gateway_backend_sessions_expired_total", "backend", backend=True), "expired {{backend}}"),
        ], x=8, y=97, w=8),
        panel("Parked MRTR calls (legacy backends)", [
            (gauge("mcp_gateway_mrtr_parked_calls", "backend", backend=True), "{{backend}}"),
            (rate("mcp_gateway_mrtr_parked_refused_total", "backend, limit", backend=True),
             "refused {{backend}} {{limit}}"),
        ], x=16, y=97, w=8),
        row("Configuration", 105),
        panel("Reloads by result", [(rate("mcp_gateway_config_reloads_total", "result"), "{{result}}")],
              x=0, y=106, w=12),
        panel("Generation running, and settings waiting for a restart", [
            (gauge("mcp_gateway_config_generation", "instance"), "generation {{instance}}"),
            (gauge("mcp_gateway_config_needs_restart", "instance"), "needs restart {{instance}}"),
        ], x=12, y=106, w=12),
        row("Build", 114),
        panel("Versions running", [(gauge("mcp_gateway_build_info", "version, instance"),
                                    "{{version}} {{instance}}")], x=0, y=115, w=24, h=5, kind="table"),
    ]

    def variable(name: str, query: str) -> dict:
        return {"name": name, "type": "query", "datasource": DS, "query": query, "refresh": 2,
                "includeAll": True, "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"}}

    return {
        "title": "mcp-gateway",
        "uid": "mcp-gateway",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "tags": ["mcp", "gateway"],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            variable("job", "label_values(mcp_gateway_build_info, job)"),
            variable("instance", 'label_values(mcp_gateway_build_info{job=~"$job"}, instance)'),
            variable("backend", 'label_values(mcp_gateway_backend_up{job=~"$job",instance=~"$instance"}, backend)'),
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("mcp-gateway.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
