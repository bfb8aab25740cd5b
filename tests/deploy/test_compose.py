"""docker-compose.yml: valid against the Compose Specification's schema, host ports on
loopback only, healthchecks right for each service (the gateway's run for real against the
compose configuration), config keys and variables the settings accept, Prometheus scraping
the replicas' ops ports, Grafana provisioned with the dashboard, and the initialize-era
example backend really serving through the gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.preflight import startup_problems
from gateway.settings import load_settings
from tests.support import mcp_http
from tests.support.deploy_tools import tool
from tests.support.gateway import running_gateway
from tests.support.legacy_venv import legacy_python
from tests.support.procs import ROOT, Proc, free_port

COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def mounted(service: dict[str, Any], target: str) -> Path:
    for volume in service.get("volumes", []):
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return (ROOT / source).resolve()
    raise AssertionError(f"nothing mounted at {target}")


def gateways(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name.startswith("gateway-")}


def test_the_compose_file_matches_the_compose_schema():
    done = subprocess.run([str(tool("check-jsonschema")), "--schemafile", str(tool("compose_spec.json")), str(COMPOSE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_stack_has_what_a_user_needs(compose):
    services = compose["services"]
    assert len(gateways(compose)) == 2
    assert {"redis", "modern-backend", "legacy-backend", "prometheus", "grafana"} <= set(services)


def test_host_ports_are_bound_to_loopback_only(compose):
    published = [(name, port) for name, s in compose["services"].items() for port in s.get("ports", [])]
    assert published
    for name, port in published:
        assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)


def test_every_service_has_an_exec_form_healthcheck(compose):
    for name, service in compose["services"].items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", (name, test)  # exec form: no shell needed in the image
        assert service["healthcheck"]["timeout"], name


def test_gateway_settings_and_environment_are_accepted(compose, monkeypatch):
    for name, service in gateways(compose).items():
        for key in list(os.environ):
            if key.startswith("MCP_GATEWAY_"):
                monkeypatch.delenv(key)
        config_path = mounted(service, service["environment"]["MCP_GATEWAY_CONFIG"])
        for key, value in service["environment"].items():
            if key != "MCP_GATEWAY_CONFIG":
                monkeypatch.setenv(key, str(value).replace("${MCP_GATEWAY_SECRET:-", "").rstrip("}"))
        settings = load_settings(config_path)  # an unknown MCP_GATEWAY_* variable would fail here
        assert startup_problems(settings) == [], name
        assert settings.server.ops_port is not None
        assert {b.url for b in settings.backends} == {"http://modern-backend:9001/mcp",
                                                       "http://legacy-backend:9002/mcp"}
        assert settings.cache.redis_url == "redis://redis:6379/0"
        assert settings.security.advertise_url == f"http://{name}:{settings.server.port}/mcp"
        published = {p.rsplit(":", 1)[1] for p in service["ports"]}
        assert published == {str(settings.server.port)}, name
        # docker compose down waits this long before SIGKILL: the whole drain fits.
        grace = int(service["stop_grace_period"].rstrip("s"))
        assert grace >= settings.server.drain_delay_seconds + settings.server.graceful_shutdown_seconds


def test_prometheus_scrapes_each_replicas_ops_port(compose):
    service = compose["services"]["prometheus"]
    config = yaml.safe_load(mounted(service, "/etc/prometheus/prometheus.yml").read_text())
    ops = load_settings(mounted(gateways(compose)["gateway-a"], "/etc/mcp-gateway/gateway.yaml")).server.ops_port
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:{ops}" for name in gateways(compose)}
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"])
    rules = mounted(service, "/etc/prometheus/rules")
    assert rules == ROOT / "deploy" / "prometheus"


def test_grafana_is_provisioned_with_the_dashboard_and_the_prometheus_datasource(compose):
    service = compose["services"]["grafana"]
    provisioning = mounted(service, "/etc/grafana/provisioning")
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert [(d["type"], d["url"], d["isDefault"]) for d in datasources] == [
        ("prometheus", "http://prometheus:9090", True)]
    provider = yaml.safe_load((provisioning / "dashboards" / "mcp-gateway.yaml").read_text())["providers"][0]
    dashboards = mounted(service, provider["options"]["path"])
    dashboard = json.loads((dashboards / "mcp-gateway.json").read_text())
    assert dashboard["title"]
    # The dashboard picks its Prometheus datasource through a variable of that type.
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"])


async def test_the_gateway_healthcheck_command_answers_with_the_compose_config(compose, tmp_path):
    service = gateways(compose)["gateway-a"]
    config = yaml.safe_load(mounted(service, "/etc/mcp-gateway/gateway.yaml").read_text())
    # The compose configuration, on free ports (this machine is shared).
    config["server"].update(port=free_port(), ops_port=free_port(), host="127.0.0.1")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"MCP_GATEWAY_CONFIG": str(path), "MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "0"}
    gw = Proc([sys.executable, "-m", "gateway", "serve"], config["server"]["port"], env=env, name="compose-gw").start()
    try:
        check = service["healthcheck"]["test"][1:]
        assert check == ["mcp-gateway", "healthcheck"]
        done = subprocess.run([sys.executable, "-m", "gateway", *check[1:]], capture_output=True, text=True,
                              timeout=20, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
    finally:
        gw.stop()
    # And it fails when nothing answers.
    stopped = subprocess.run([sys.executable, "-m", "gateway", "healthcheck"], capture_output=True, text=True,
                             timeout=20, env={**os.environ, **env})
    assert stopped.returncode == 1


async def test_the_initialize_era_example_backend_serves_through_the_gateway():
    python = legacy_python()
    port = free_port()
    backend = Proc([python, str(ROOT / "deploy" / "compose" / "legacy-backend" / "server.py")], port,
                   env={"PORT": str(port)}, name="compose-legacy")
    backend.start()
    try:
        settings = {"backends": [{"name": "notes", "url": f"http://127.0.0.1:{port}/mcp", "era": "legacy"}]}
        async with running_gateway(settings) as gw, httpx.AsyncClient(trust_env=False, timeout=20) as client:
            answer = await mcp_http.post(client, gw.url, "tools/call", {"name": "shout", "arguments": {"text": "hi"}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"]["content"][0]["text"] == "HI"
    finally:
        backend.stop()
