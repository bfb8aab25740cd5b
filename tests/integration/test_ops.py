"""Operational endpoints and lifecycle: /healthz, /readyz, /metrics, and a graceful shutdown
that lets in-flight requests finish (the gateway as its own process, stopped with SIGTERM)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.listen import eventually
from tests.support.procs import gateway_process, refused_url
from tests.support.scripted import Scripted


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    server = Scripted("ops").start()
    yield server
    server.stop()


@pytest.fixture
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=20) as c:
        yield c


async def test_healthz_is_always_ok(client):
    # Liveness says the process serves; it does not depend on any backend.
    settings = {"backends": [{"name": "gone", "url": refused_url()}]}
    async with running_gateway(settings, discover=False) as gw:
        response = await client.get(f"{gw.base}/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "ok"}


async def test_readyz_lists_backends_and_is_ready_with_one_reachable(backend, client):
    settings = {"backends": [{"name": "ops", "url": backend.url},
                             {"name": "gone", "url": refused_url(), "retries": 0}]}
    async with running_gateway(settings) as gw:
        response = await client.get(f"{gw.base}/readyz")
        assert response.status_code == 200
        report = response.json()
        assert report["status"] == "ready"
        assert report["backends"]["ops"] == "ok"
        # A name and a state: the upstream error (and its address) goes to the log only.
        assert report["backends"]["gone"] == "failing"
        assert "127.0.0.1" not in response.text


async def test_readyz_is_503_when_no_backend_is_reachable(client):
    settings = {"backends": [{"name": "a", "url": refused_url(), "retries": 0},
                             {"name": "b", "url": refused_url(), "retries": 0}]}
    async with running_gateway(settings, discover=False) as gw:
        response = await client.get(f"{gw.base}/readyz")
        assert response.status_code == 503
        report = response.json()
        assert report["status"] == "not ready"
        assert set(report["backends"]) == {"a", "b"}


async def test_readyz_follows_a_backend_coming_back(client):
    server = Scripted("late")
    settings = {"backends": [{"name": "late", "url": server.url, "retries": 0,
                              "health": {"check_interval_seconds": 0.5}}]}
    async with running_gateway(settings, discover=False) as gw:
        assert (await client.get(f"{gw.base}/readyz")).status_code == 503
        server.start()
        try:
            # The health check asks again every check_interval_seconds; the probe reads the
            # state it keeps.
            async def ready() -> bool:
                return (await client.get(f"{gw.base}/readyz")).status_code == 200

            await eventually(ready)
        finally:
            server.stop()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_are_prometheus_text(backend, client):
    async with running_gateway({"backends": [{"name": "ops", "url": backend.url}]}) as gw:
        response = await client.get(f"{gw.base}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")


async def test_metrics_count_answered_refused_and_forwarded_requests(backend, client):
    # The per-request metrics are loop-owned values (observability/loop_metrics.py): this
    # checks them end to end, through the exposition a Prometheus server scrapes.
    modern = {("method", "tools/call"), ("era", "modern")}
    call_ok = ("mcp_gateway_requests_total", frozenset({*modern, ("status", "2xx"), ("code", "ok")}))
    # The Origin refusal carries its JSON-RPC code (-32600) as the `code` label.
    refused = ("mcp_gateway_requests_total", frozenset({*modern, ("status", "4xx"), ("code", "-32600")}))
    upstream = ("mcp_gateway_backend_requests_total",
                frozenset({("backend", "ops"), ("method", "tools/call"), ("outcome", "ok"), ("code", "ok")}))
    timed = ("mcp_gateway_request_duration_seconds_count", frozenset(modern))
    slowest = ("mcp_gateway_request_duration_seconds_bucket", frozenset({*modern, ("le", "+Inf")}))
    in_flight = ("mcp_gateway_requests_in_flight", frozenset())
    async with running_gateway({"backends": [{"name": "ops", "url": backend.url}]}) as gw:
        before = _samples((await client.get(f"{gw.base}/metrics")).text)
        for _ in range(3):
            answer = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
            assert answer.status_code == 200, answer.text
        forbidden = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}},
                                        extra_headers={"Origin": "https://evil.example"})
        assert forbidden.status_code == 403
        after = _samples((await client.get(f"{gw.base}/metrics")).text)
    assert after[call_ok] - before.get(call_ok, 0) == 3
    assert after[refused] - before.get(refused, 0) == 1
    assert after[upstream] - before.get(upstream, 0) == 3
    assert after[timed] - before.get(timed, 0) == 4
    assert after[slowest] == after[timed]
    assert after[in_flight] == 0


async def test_sigterm_lets_the_in_flight_request_finish(backend, client, tmp_path: Path):
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "ops", "url": backend.url}],
                                      "server": {"graceful_shutdown_seconds": 20}}))
    gw = gateway_process(config).start()
    try:
        url = f"http://127.0.0.1:{gw.port}/mcp"
        in_flight = asyncio.ensure_future(mcp_http.post(
            client, url, "tools/call", {"name": "slow", "arguments": {"seconds": 1.5}}, id="drain-me"))
        for _ in range(200):  # until the backend holds the call
            if any(c["id"] == "drain-me" for c in await backend.calls("tools/call")):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the slow call never reached the backend")
        assert gw.proc is not None
        os.kill(gw.proc.pid, signal.SIGTERM)
        response = await in_flight
        assert response.status_code == 200, response.text
        assert response.json()["result"]["content"][0]["text"] == "ops: slept"
        # uvicorn re-raises the captured SIGTERM once its graceful shutdown is done, so the
        # exit status is "terminated by SIGTERM" (or 0), never a crash or SIGKILL.
        assert await asyncio.to_thread(gw.proc.wait, 20) in (0, -signal.SIGTERM)
        assert "Traceback" not in gw.output()
        # Once it is down, nothing is listening any more.
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{gw.port}/healthz")
    finally:
        gw.stop()
