"""The official conformance suite (@modelcontextprotocol/conformance) pointed at the gateway.

Each case starts a fixture backend and a gateway process in front of it, runs
`scripts/conformance.sh` against the gateway, and fails on any scenario not listed in the
committed baseline (which lists only what fails against the fixture directly, and why).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.legacy_venv import legacy_server
from tests.support.procs import ROOT, Proc, gateway_process

BASELINES = ROOT / "tests" / "conformance"


def run_suite(url: str, spec_version: str, baseline: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "conformance.sh"), "--url", url, "--spec-version", spec_version,
         "--suite", "all", "--baseline", str(baseline), "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )


def assert_suite_passes(gateway: Proc, spec_version: str, baseline: Path, out: Path) -> None:
    """Run the suite against a started gateway (stopped afterwards); fail on any scenario the
    baseline does not list, with the suite's summary and the gateway's log."""
    try:
        result = run_suite(gateway.url, spec_version, baseline, out)
    finally:
        gateway.stop()
    summary = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, f"conformance failures through the gateway:\n{summary}\n{gateway.output()[-3000:]}"
    assert "Scenarios:" in result.stdout, summary


def gateway_in_front_of(backend_url: str, tmp_path: Path, **backend: object) -> Proc:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "fixture", "url": backend_url, **backend}]}))
    return gateway_process(config)


def test_modern_fixture_through_gateway(conformance_backend, tmp_path):
    gateway = gateway_in_front_of(conformance_backend.url, tmp_path, era="modern").start()
    assert_suite_passes(gateway, "2026-07-28", BASELINES / "baseline-modern.txt", tmp_path / "out")


def test_legacy_clients_served_by_the_gateway(conformance_backend, tmp_path):
    """The 2025-11-25 suite (initialize, sessions, GET stream, server-to-client requests)
    against the gateway itself, in front of a modern backend: gateway/legacy_clients/."""
    gateway = gateway_in_front_of(conformance_backend.url, tmp_path, era="modern").start()
    assert_suite_passes(gateway, "2025-11-25", BASELINES / "baseline-legacy-clients.txt", tmp_path / "out")


@pytest.fixture(scope="module")
def legacy_conformance_backend():
    """tests/fixtures/servers/legacy_conformance.py (mcp==1.30.0, stateful SSE, event store)."""
    proc = legacy_server(script="legacy_conformance.py", name="legacy-conformance").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def legacy_sse_conformance_backend():
    """The same fixture on the HTTP+SSE transport of 2024-11-05 (FastMCP's sse_app)."""
    proc = legacy_server("--sse", script="legacy_conformance.py", name="legacy-conformance-sse").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("era", ["auto", "legacy"])
def test_legacy_fixture_through_gateway(legacy_conformance_backend, tmp_path, era):
    """The modern suite through the gateway onto an initialize-era backend: the legacy bridge
    (docs/legacy.md) must make it look modern; the baseline lists only what no bridge can do."""
    gateway = gateway_in_front_of(legacy_conformance_backend.url, tmp_path, era=era).start()
    assert_suite_passes(gateway, "2026-07-28", BASELINES / "baseline-legacy.txt", tmp_path / "out")


def test_legacy_sse_fixture_through_gateway(legacy_sse_conformance_backend, tmp_path):
    """The same suite onto the HTTP+SSE transport, detected by `era: auto` (docs/legacy.md
    "HTTP+SSE backends"), with the same baseline: the transport changes nothing a client sees."""
    gateway = gateway_in_front_of(legacy_sse_conformance_backend.url, tmp_path, era="auto").start()
    assert_suite_passes(gateway, "2026-07-28", BASELINES / "baseline-legacy.txt", tmp_path / "out")


@pytest.fixture(autouse=True)
def _node22():
    if "MCPGW_NODE22_BIN" not in os.environ:
        # scripts/test.sh exports it; when pytest runs alone, install it here the same way.
        out = subprocess.run(["bash", str(ROOT / "scripts" / "node22.sh")], capture_output=True, text=True, check=True)
        os.environ["MCPGW_NODE22_BIN"] = out.stdout.strip()
