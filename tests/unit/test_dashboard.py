"""The Grafana dashboard queries only metrics the gateway exports, and is up to date with its
generator."""

from __future__ import annotations

import json
import re
import runpy

from prometheus_client import REGISTRY

import gateway.app  # noqa: F401  (imports every module that defines metrics)
import gateway.reload.metrics  # noqa: F401
import gateway.subscriptions.metrics  # noqa: F401
from tests.support.procs import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "mcp-gateway.json"


def exported_names() -> set[str]:
    names = set()
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            names.add(sample.name)
        names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names.update(metric.name + suffix for suffix in ("_bucket", "_count", "_sum"))
    return names


def test_every_queried_metric_is_exported():
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]
    queried = {m for e in exprs for m in re.findall(r"\b(mcp_(?:gateway|server|client)_[a-z_]+)", e)}
    assert queried, "the dashboard queries nothing"
    missing = queried - exported_names()
    assert not missing, f"dashboard queries metrics the gateway does not export: {sorted(missing)}"


def test_dashboard_file_matches_its_generator():
    generated = runpy.run_path(str(ROOT / "deploy" / "grafana" / "generate.py"))["dashboard"]()
    assert json.loads(DASHBOARD.read_text()) == generated, "run: python deploy/grafana/generate.py"
