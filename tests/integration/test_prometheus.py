"""A real Prometheus (Debian's `prometheus` package; scripts/test.sh installs it) scrapes a real
gateway process under a scripted workload; then every expression of the Grafana dashboard and
of deploy/prometheus/alerts.yaml is evaluated through its HTTP API. Each must be valid, every
panel must return data (the gateway makes its series at start-up, so even a family that saw no
event yet answers with zeros), the rules must load healthy, and `promtool check rules` and
`promtool check metrics` must pass."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support import legacy_venv, mcp_http
from tests.support.procs import ROOT, Proc, free_port, gateway_process
from tests.support.scripted import Scripted

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="prometheus/promtool not installed (scripts/test.sh installs Debian's prometheus package as root)")

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "mcp-gateway.json"
LEGACY = "2025-06-18"
ACCEPT = "application/json, text/event-stream"
# The dashboard's variables, as Grafana expands "All" (allValue ".*"), and a rate window that
# holds several samples at the test's one-second scrape interval.
VARIABLES = {"$job": ".*", "$instance": ".*", "$backend": ".*", "$__rate_interval": "15s"}


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[Scripted, Proc]]:
    with Scripted("m") as modern:
        legacy = legacy_venv.legacy_server(name="prom-legacy").start()
        try:
            yield modern, legacy
        finally:
            legacy.stop()


def _expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


async def _workload(url: str, seconds: float) -> int:
    """Successes, JSON-RPC errors, isError results, cache hits, refusals, legacy clients."""
    sent = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
        init = await client.post(url, content=orjson.dumps({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
            headers={"content-type": "application/json", "accept": ACCEPT})
        legacy = {"content-type": "application/json", "accept": ACCEPT,
                  "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
        while time.monotonic() < deadline:
            await mcp_http.post(client, url, "tools/call", {"name": "m__echo", "arguments": {"text": "x"}})
            await mcp_http.post(client, url, "tools/call", {"name": "m__fail", "arguments": {"code": -32602}})
            await mcp_http.post(client, url, "tools/call", {"name": "m__is_error", "arguments": {}})
            await mcp_http.post(client, url, "tools/call", {"name": "l__add", "arguments": {"a": 1, "b": 2}})
            await mcp_http.post(client, url, "tools/list")
            await mcp_http.post(client, url, "resources/read", {"uri": "scripted://m/doc-1"})
            await mcp_http.post(client, url, "tools/call", {"name": "m__echo", "arguments": {}},
                                extra_headers={"origin": "https://evil.example"})
            await client.post(url, content=orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                         "params": {"name": "m__echo", "arguments": {"text": "o"}}}),
                              headers=legacy)
            sent += 8
            await asyncio.sleep(0.05)
    return sent


async def _query(client: httpx.AsyncClient, base: str, expr: str) -> dict[str, Any]:
    response = await client.get(f"{base}/api/v1/query", params={"query": expr})
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]


async def test_every_dashboard_and_alert_expression_against_a_real_prometheus(backends, tmp_path: Path):
    modern, legacy = backends
    config = tmp_path / "gateway.yaml"
    # A rate limit and a pinned backend, so that the governance panels have series to show.
    config.write_text(yaml.safe_dump({"backends": [
        {"name": "m", "url": modern.url, "era": "modern", "pin": "warn"},
        {"name": "l", "url": legacy.url, "era": "legacy"},
    ], "rate_limits": [{"id": "per-caller", "rate": "1000/s", "burst": 1000, "key": ["principal"]}],
        "pins": {"file": str(tmp_path / "pins.json")}}))
    gateway = gateway_process(config).start()
    prom_port = free_port()
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "mcp-gateway", "static_configs": [{"targets": [f"127.0.0.1:{gateway.port}"]}]}],
    }))
    prometheus = Proc([PROMETHEUS, f"--config.file={prom_config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                       f"--web.listen-address=127.0.0.1:{prom_port}"], prom_port, name="prometheus")
    prometheus.start()
    base = f"http://127.0.0.1:{prom_port}"
    try:
        sent = await _workload(gateway.url, 8.0)
        assert sent > 0
        async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
            await asyncio.sleep(2.5)  # the last scrape of the workload, and one more
            exposition = (await client.get(f"http://127.0.0.1:{gateway.port}/metrics")).text
            targets = (await client.get(f"{base}/api/v1/targets")).json()["data"]["activeTargets"]
            assert [t["health"] for t in targets] == ["up"], targets

            panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p.get("targets")]
            empty = []
            for panel in panels:
                for target in panel["targets"]:
                    data = await _query(client, base, _expand(target["expr"]))
                    if not data["result"]:
                        empty.append((panel["title"], target["expr"]))
            assert not empty, f"panels without data: {empty}"
            for variable in json.loads(DASHBOARD.read_text())["templating"]["list"][1:]:
                metric = variable["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                assert (await _query(client, base, _expand(metric)))["result"], variable["name"]

            rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
            for rule in rules:
                await _query(client, base, rule["expr"])  # valid PromQL
                assert rule["annotations"]["runbook"].strip(), rule["alert"]
            for _ in range(50):
                loaded = (await client.get(f"{base}/api/v1/rules")).json()["data"]["groups"]
                health = [r["health"] for g in loaded for r in g["rules"]]
                if len(health) == len(rules) and all(h == "ok" for h in health):
                    break
                await asyncio.sleep(0.2)
            assert health == ["ok"] * len(rules), loaded

            # What the workload did is what the metrics say (spot checks with real labels).
            by_code = await _query(client, base, 'sum by (code) (mcp_gateway_requests_total{method="tools/call"})')
            codes = {r["metric"]["code"] for r in by_code["result"] if float(r["value"][1]) > 0}
            assert {"ok", "-32602", "tool_error", "-32600"} <= codes, codes
            eras = await _query(client, base, 'sum by (era) (mcp_gateway_requests_total{method="tools/call"})')
            assert {r["metric"]["era"] for r in eras["result"] if float(r["value"][1]) > 0} == {"modern", "legacy"}
            tools = await _query(client, base, "sum by (tool) (mcp_gateway_tool_calls_total)")
            seen = {r["metric"]["tool"] for r in tools["result"] if float(r["value"][1]) > 0}
            # Listed tools get their own series; one never listed is "other".
            assert {"m__echo", "m__fail", "l__add", "other"} <= seen and "m__is_error" not in seen, seen
            up = await _query(client, base, "mcp_gateway_backend_up")
            assert {r["metric"]["backend"]: r["value"][1] for r in up["result"]} == {"m": "1", "l": "1"}
            sessions = await _query(client, base, "mcp_gateway_legacy_client_sessions")
            assert float(sessions["result"][0]["value"][1]) >= 1
            fastest = await _query(client, base, 'mcp_gateway_request_duration_seconds_bucket{le="0.0001"}')
            assert fastest["result"], "the smallest latency bucket is 100 µs"
    finally:
        prometheus.stop()
        gateway.stop()

    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules_checked = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert rules_checked.returncode == 0, rules_checked.stdout + rules_checked.stderr
