"""`mcp-gateway check-config | routes | serve` as a user runs them: real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY_")}
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("name", ["single-backend.yaml", "fleet.yaml", "sidecar.yaml"])
def test_check_config_accepts_the_examples(name):
    result = run("check-config", f"config/{name}")
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_check_config_prints_every_bad_field_with_its_path(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "server:\n  port: 70000\n  path: mcp\n"
        "backends:\n"
        "  - name: Bad Name\n    url: http://127.0.0.1:9001/mcp\n"
        "  - name: files\n    url: ftp://files.example\n"
        "  - name: both\n"
        "cache:\n  store: disk\n"
    )
    result = run("check-config", str(config))
    assert result.returncode != 0
    assert result.stdout == ""
    for path in ("server.port", "server.path", "backends.0.name", "backends.1.url", "backends.2.url", "cache.store"):
        assert f"  {path}: " in result.stderr, f"{path} missing from:\n{result.stderr}"
    assert "ftp://files.example" in result.stderr  # the message says what was wrong


def test_check_config_on_a_missing_file(tmp_path):
    result = run("check-config", str(tmp_path / "nope.yaml"))
    assert result.returncode != 0
    assert "nope.yaml" in result.stderr


def test_check_config_on_broken_yaml(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("backends: [\n")
    result = run("check-config", str(config))
    assert result.returncode != 0
    assert "not valid YAML" in result.stderr


def test_serve_refuses_a_bad_config_before_listening(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("server:\n  port: -1\n")
    result = run("serve", "--config", str(config))
    assert result.returncode == 2
    assert "server.port" in result.stderr


def test_routes_lists_backends_and_prefixes():
    result = run("routes", "--config", "config/fleet.yaml")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("weather") and "'weather__'" in line for line in lines)
    assert any(line.startswith("files") and "'fs.'" in line for line in lines)
    assert any("resources under 'weather://'" in line for line in lines)


def test_the_http_protocol_is_the_gateways_unless_uvicorn_is_asked_for():
    from gateway.cli import uvicorn_config
    from gateway.http11 import Http11Protocol
    from gateway.settings import load_settings

    async def app(scope, receive, send):  # pragma: no cover - never called
        pass

    assert uvicorn_config(app, load_settings(None)).http is Http11Protocol
    fallback = uvicorn_config(app, load_settings(None, server={"http": "uvicorn"}))
    assert fallback.http == "httptools"
    assert uvicorn_config(app, load_settings(None), log_level="warning").log_level == "warning"


@pytest.mark.parametrize("url", ["redis+sentinel://h:26379/mymaster", "memcached://h:11211"])
def test_check_config_refuses_what_serve_would_refuse_at_start_up(tmp_path, url):
    # A scheme the Redis client does not take passes field validation; building the cache
    # refuses it. check-config builds what serve builds, so it says so, and serve prints the
    # same problem instead of a traceback.
    config = tmp_path / "redis.yaml"
    config.write_text(f"cache:\n  store: redis\n  redis_url: '{url}'\n")
    checked = run("check-config", str(config))
    assert checked.returncode == 1, checked.stdout
    assert "  cache: " in checked.stderr and "scheme" in checked.stderr.lower()
    served = run("serve", "--config", str(config), "--port", "0", timeout=30)
    assert served.returncode == 2
    assert "  cache: " in served.stderr and "Traceback" not in served.stderr


def test_check_config_names_an_unknown_environment_variable(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:9/mcp'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY_")}
    result = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(config)], capture_output=True,
                            text=True, cwd=ROOT, timeout=60, env={**env, "MCP_GATEWAY_CAHCE__STORE": "redis"})
    assert result.returncode == 1
    assert "MCP_GATEWAY_CAHCE__STORE: is not a setting" in result.stderr


def test_serve_on_a_port_in_use_names_the_setting(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "ops.yaml"
        config.write_text(f"server:\n  ops_port: {port}\n")
        served = run("serve", "--config", str(config), "--port", "0", timeout=30)
    assert served.returncode == 2
    assert f"server.ops_port: cannot listen on 127.0.0.1:{port}" in served.stderr
    assert "Traceback" not in served.stderr
