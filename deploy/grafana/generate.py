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


def quantile(q: str, metric: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{job=~\"$job\"}}[$__rate_interval])))"


def rate(metric: str, by: str, where: str = "") -> str:
    sel = f'job=~"$job"{"," + where if where else ""}'
    return f"sum by ({by}) (rate({metric}{{{sel}}}[$__rate_interval]))"


def dashboard() -> dict:
    panels = [
        row("Traffic", 0),
        panel("Requests / s by method", [(rate("mcp_gateway_requests_total", "method"), "{{method}}")],
              unit="reqps", x=0, y=1),
        panel("Answers by HTTP status class", [(rate("mcp_gateway_requests_total", "status"), "{{status}}")],
              unit="reqps", x=12, y=1),
        panel("Latency p50 / p99 by method", [
            (quantile("0.5", "mcp_gateway_request_duration_seconds", "method"), "p50 {{method}}"),
            (quantile("0.99", "mcp_gateway_request_duration_seconds", "method"), "p99 {{method}}"),
        ], unit="s", x=0, y=9),
        panel("In flight", [('sum(mcp_gateway_requests_in_flight{job=~"$job"})', "in flight")], x=12, y=9),
        row("Backends", 17),
        panel("Backend calls / s by outcome", [
            (rate("mcp_gateway_backend_requests_total", "backend, outcome"), "{{backend}} {{outcome}}")],
              unit="reqps", x=0, y=18),
        panel("Backend time to answer, p99", [
            (quantile("0.99", "mcp_gateway_backend_duration_seconds", "backend"), "{{backend}}")],
              unit="s", x=12, y=18),
        row("Cache", 26),
        panel("Hit ratio by method", [(
            'sum by (method) (rate(mcp_gateway_cache_lookups_total{job=~"$job",outcome="hit"}[$__rate_interval]))'
            ' / sum by (method) (rate(mcp_gateway_cache_lookups_total{job=~"$job"}[$__rate_interval]))',
            "{{method}}")], unit="percentunit", x=0, y=27, w=8),
        panel("Lookups by outcome and scope", [
            (rate("mcp_gateway_cache_lookups_total", "outcome, scope"), "{{outcome}} {{scope}}")],
              unit="reqps", x=8, y=27, w=8),
        panel("Store errors and invalidations", [
            (rate("mcp_gateway_cache_store_errors_total", "store, operation"), "error {{store}} {{operation}}"),
            (rate("mcp_gateway_cache_invalidations_total", "kind"), "invalidated {{kind}}"),
        ], x=16, y=27, w=8),
        row("Subscriptions", 35),
        panel("Listen streams and upstreams", [
            ('sum(mcp_gateway_listen_client_streams{job=~"$job"})', "client streams"),
            ('sum by (backend) (mcp_gateway_listen_upstreams{job=~"$job"})', "upstreams {{backend}}"),
        ], x=0, y=36, w=8),
        panel("Notifications / s by backend", [
            (rate("mcp_gateway_listen_notifications_total", "backend"), "{{backend}}")], unit="reqps", x=8, y=36,
              w=8),
        panel("Trouble: overflows, gaps, reconnects, refusals", [
            ('sum(rate(mcp_gateway_listen_overflows_total{job=~"$job"}[$__rate_interval]))', "overflows"),
            (rate("mcp_gateway_listen_gaps_total", "backend"), "gaps {{backend}}"),
            (rate("mcp_gateway_listen_upstream_reconnects_total", "backend"), "reconnects {{backend}}"),
            (rate("mcp_gateway_listen_rejected_total", "reason"), "refused {{reason}}"),
        ], x=16, y=36, w=8),
        row("Multi round-trip (legacy backends)", 44),
        panel("Parked calls waiting for a client's retry", [
            ('sum by (backend) (mcp_gateway_mrtr_parked_calls{job=~"$job"})', "{{backend}}"),
            (rate("mcp_gateway_mrtr_parked_refused_total", "backend, limit"), "refused {{backend}} {{limit}}"),
        ], x=0, y=45, w=24),
    ]
    return {
        "title": "mcp-gateway",
        "uid": "mcp-gateway",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "tags": ["mcp", "gateway"],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "job", "type": "query", "datasource": DS, "query": "label_values(mcp_gateway_requests_total, job)",
             "includeAll": True, "multi": True, "current": {"text": "All", "value": "$__all"}},
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("mcp-gateway.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
