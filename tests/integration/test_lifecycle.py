"""The gateway as its own process through a rollout: probes that answer at once whatever the
backends do, the operations listener beside the MCP one, the drain on SIGTERM (nothing in
flight lost, every long-lived stream ended cleanly before the deadline) and SIGHUP harmless.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support import mcp_http
from tests.support.legacy_venv import legacy_server
from tests.support.listen import ListenReader, eventually
from tests.support.procs import Proc, free_port, gateway_process, wait_for_port
from tests.support.scripted import Scripted
from tests.support.sockets import Blackhole

LEGACY = "2025-11-25"
SSE_ACCEPT = "application/json, text/event-stream"
UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


@pytest.fixture(scope="module")
def backend() -> Iterator[Scripted]:
    with Scripted("life") as server:
        yield server


@pytest.fixture(scope="module")
def legacy_backend() -> Iterator[Proc]:
    server = legacy_server(name="life-legacy").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    yield hole
    hole.close()


def start_gateway(tmp_path: Path, config: dict[str, Any], **env: str) -> tuple[Proc, int]:
    ops_port = free_port()
    server = {"ops_port": ops_port, **config.pop("server", {})}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"server": server, **config}))
    gw = gateway_process(path, env=env).start()
    # The operations listener starts just after the MCP one (lifecycle.run_until_stopped).
    wait_for_port(ops_port, proc=gw.proc)
    return gw, ops_port


async def timed_get(client: httpx.AsyncClient, url: str, **kwargs: Any) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await client.get(url, **kwargs)
    return response, time.perf_counter() - started


# -- probes ---------------------------------------------------------------------------------


async def test_probes_answer_at_once_while_a_backend_hangs(backend, blackhole, tmp_path):
    # One healthy backend, one that accepts TCP and never answers: the probe reads the state
    # the health checks keep, so it never waits for the hung one (before: 2.0 s each).
    checked = {"check_interval_seconds": 1}
    gw, ops = start_gateway(tmp_path, {
        "backends": [{"name": "good", "url": backend.url, "health": checked},
                     {"name": "hung", "url": blackhole.url, "health": checked}]})
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            async def good_is_ok() -> bool:
                return (await client.get(f"http://127.0.0.1:{ops}/readyz")).json()["backends"]["good"] == "ok"

            await eventually(good_is_ok)
            slowest = 0.0
            # 20 probes of each, spread over the hung backend's checks (each waits out its
            # list deadline in the background meanwhile).
            for _ in range(20):
                for path in ("/readyz", "/healthz"):
                    response, took = await timed_get(client, f"http://127.0.0.1:{ops}{path}")
                    assert response.status_code == 200, response.text
                    slowest = max(slowest, took)
                    assert took < 0.1, f"{path} took {took * 1000:.0f} ms"
                await asyncio.sleep(0.1)
            report = (await client.get(f"http://127.0.0.1:{ops}/readyz")).json()
            assert report["status"] == "ready"
            assert report["backends"]["hung"] in ("unknown", "failing")
    finally:
        gw.stop()
    # What the hung backend did goes to the log, never to the probe's caller.
    assert f":{blackhole.port}" not in str(report)


async def test_readiness_requirement_all_is_not_ready_while_one_backend_hangs(backend, blackhole, tmp_path):
    gw, ops = start_gateway(tmp_path, {
        "backends": [{"name": "good", "url": backend.url, "health": {"check_interval_seconds": 1}},
                     {"name": "hung", "url": blackhole.url, "list_timeout_seconds": 0.3,
                      "health": {"check_interval_seconds": 1, "check_timeout_seconds": 0.3}}],
        "server": {"readiness": "all"}})
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            async def hung_is_failing() -> bool:
                return (await client.get(f"http://127.0.0.1:{ops}/readyz")).json()["backends"]["hung"] == "failing"

            await eventually(hung_is_failing)
            response, took = await timed_get(client, f"http://127.0.0.1:{ops}/readyz")
            assert response.status_code == 503 and took < 0.1
            assert response.json() == {"status": "not ready", "backends": {"good": "ok", "hung": "failing"}}
    finally:
        gw.stop()
    assert "backend hung: down" in gw.output()  # the detail went to the log (backends/health.py)


async def test_the_ops_listener_answers_any_host_and_the_mcp_listener_does_not(backend, tmp_path):
    gw, ops = start_gateway(tmp_path, {
        "backends": [{"name": "good", "url": backend.url}],
        "server": {"allowed_hosts": ["mcp.example.com"], "allowed_origins": ["https://app.example.com"]},
        "auth": {"mode": "jwt", "issuer": "https://idp.example", "audience": "https://mcp.example.com/mcp",
                 "hs256_secret": "x" * 32, "authorization_servers": ["https://idp.example"]}})
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            async def ready() -> bool:  # the start-up discovery has answered (readiness.py)
                return (await client.get(f"http://127.0.0.1:{ops}/readyz")).status_code == 200

            await eventually(ready, timeout=10)
            # The kubelet and Prometheus: Host is the pod IP, no token, no Origin checks.
            for path in ("/healthz", "/readyz", "/metrics"):
                response = await client.get(f"http://127.0.0.1:{ops}{path}",
                                            headers={"Host": "10.1.2.3:9090", "Origin": "https://evil.example"})
                assert response.status_code == 200, (path, response.text)
            assert "mcp_gateway" in (await client.get(f"http://127.0.0.1:{ops}/metrics")).text
            # The MCP listener keeps its Host check ...
            refused = await mcp_http.post(client, f"http://127.0.0.1:{gw.port}/mcp", "tools/list",
                                          extra_headers={"Host": "10.1.2.3:9090"})
            assert refused.status_code == 403
            assert (await client.get(f"http://127.0.0.1:{gw.port}/readyz",
                                     headers={"Host": "10.1.2.3:9090"})).status_code == 403
            # ... and no longer serves the operational paths at all.
            moved = await client.get(f"http://127.0.0.1:{gw.port}/readyz", headers={"Host": "mcp.example.com"})
            assert moved.status_code in (401, 404)
            # The ops listener serves those three paths and nothing else.
            assert (await client.post(f"http://127.0.0.1:{ops}/mcp", content=b"{}")).status_code == 404
    finally:
        gw.stop()


# -- drain ------------------------------------------------------------------------------------


async def legacy_get_stream(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """An initialize-era session and its standalone GET stream, read to its end."""
    init = await client.post(url, content=orjson.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
        headers={"content-type": "application/json", "accept": SSE_ACCEPT})
    assert init.status_code == 200, init.text
    session = init.headers["mcp-session-id"]
    headers = {"mcp-session-id": session, "mcp-protocol-version": LEGACY}
    ack = await client.post(url, content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                            headers={**headers, "content-type": "application/json", "accept": SSE_ACCEPT})
    assert ack.status_code == 202
    state: dict[str, Any] = {"open": asyncio.Event(), "ended_at": None, "clean": False}

    async def read() -> None:
        async with client.stream("GET", url, headers={**headers, "accept": "text/event-stream"}) as response:
            assert response.status_code == 200
            state["open"].set()
            async for _ in response.aiter_bytes():
                pass
        state["clean"] = True  # the chunked body ended with its terminator (not curl rc=18)
        state["ended_at"] = time.monotonic()

    state["task"] = asyncio.create_task(read())
    await asyncio.wait_for(state["open"].wait(), 10)
    return state


async def sse_stream(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """A 2024-11-05 HTTP+SSE session's GET /sse stream, read to its end."""
    state: dict[str, Any] = {"open": asyncio.Event(), "ended_at": None, "clean": False}

    async def read() -> None:
        async with client.stream("GET", f"{base}/sse", headers={"accept": "text/event-stream"}) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_bytes():
                if b"event: endpoint" in chunk:
                    state["open"].set()
        state["clean"] = True
        state["ended_at"] = time.monotonic()

    state["task"] = asyncio.create_task(read())
    await asyncio.wait_for(state["open"].wait(), 10)
    return state


async def test_sigterm_drains_without_losing_a_call_or_cutting_a_stream(backend, legacy_backend, tmp_path):
    drain, grace = 1.5, 12.0
    gw, ops = start_gateway(tmp_path, {
        "backends": [{"name": "life", "url": backend.url},
                     {"name": "old", "url": legacy_backend.url, "era": "legacy", "prefix": "old."}],
        "server": {"drain_delay_seconds": drain, "graceful_shutdown_seconds": grace}},
        MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS=str(drain))
    url, base = f"http://127.0.0.1:{gw.port}/mcp", f"http://127.0.0.1:{gw.port}"
    assert gw.proc is not None
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=60, limits=UNLIMITED) as client:
            listens = [await ListenReader(client, url, {"toolsListChanged": True}, id=f"l{i}").open()
                       for i in range(100)]
            assert all(r.status == 200 and r.messages for r in listens)
            legacy = [await legacy_get_stream(client, url) for _ in range(20)]
            sse = [await sse_stream(client, base) for _ in range(5)]
            calls = [asyncio.ensure_future(mcp_http.post(
                client, url, "tools/call", {"name": "life__slow", "arguments": {"seconds": 3}}, id=f"drain-{i}"))
                for i in range(50)]
            # A session with the initialize-era backend, which the stop must end (DELETE).
            old = await mcp_http.post(client, url, "tools/call", {"name": "old.echo", "arguments": {"text": "x"}})
            assert old.status_code == 200, old.text

            async def all_held() -> bool:
                held = {c["id"] for c in await backend.calls("tools/call")}
                return all(f"drain-{i}" in held for i in range(50))

            await eventually(all_held)
            signalled = time.monotonic()
            os.kill(gw.proc.pid, signal.SIGTERM)
            # Readiness turns at once (the kubelet takes the pod out of the Service) ...
            while (await client.get(f"http://127.0.0.1:{ops}/readyz")).status_code != 503:
                pass
            assert time.monotonic() - signalled < 0.1
            # ... while the listener keeps accepting for the drain delay.
            late = await mcp_http.post(client, url, "tools/call", {"name": "life__echo", "arguments": {"text": "late"}})
            assert late.status_code == 200 and time.monotonic() - signalled < drain
            # Every call in flight gets its whole result.
            for answer in await asyncio.gather(*calls):
                assert answer.status_code == 200, answer.text
                assert answer.json()["result"]["content"][0]["text"] == "life: slept"
            # Every stream ended cleanly, right after the drain delay, not at the deadline.
            await asyncio.wait_for(asyncio.gather(*(s["task"] for s in (*legacy, *sse))), 10)
            for reader in listens:
                await reader.wait(lambda r=reader: r.ended, 10)
                final = reader.messages[-1]
                assert final.get("result", {}).get("resultType") == "complete", final  # graceful closure
            for stream in (*legacy, *sse):
                assert stream["clean"]
                assert stream["ended_at"] - signalled < drain + 2, stream["ended_at"] - signalled
            rc = await asyncio.to_thread(gw.proc.wait, drain + grace)
            assert rc == 0
            assert time.monotonic() - signalled < drain + grace
            # The legacy backend's session was closed, not abandoned.
            seen = (await client.get(f"http://127.0.0.1:{legacy_backend.port}/requests")).json()
            assert seen.get("DELETE", 0) >= 1, seen
    finally:
        gw.stop()
    assert "Traceback" not in gw.output()
    assert "Cancel" not in gw.output()  # uvicorn's "Cancel N running task(s)": nothing was cut


async def test_sighup_loses_no_call_and_the_gateway_keeps_serving(backend, tmp_path):
    gw, ops = start_gateway(tmp_path, {"backends": [{"name": "life", "url": backend.url}]})
    url = f"http://127.0.0.1:{gw.port}/mcp"
    assert gw.proc is not None
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30, limits=UNLIMITED) as client:
            calls = [asyncio.ensure_future(mcp_http.post(
                client, url, "tools/call", {"name": "slow", "arguments": {"seconds": 1.5}}, id=f"hup-{i}"))
                for i in range(10)]

            async def all_held() -> bool:
                held = {c["id"] for c in await backend.calls("tools/call")}
                return all(f"hup-{i}" in held for i in range(10))

            await eventually(all_held)
            os.kill(gw.proc.pid, signal.SIGHUP)
            for answer in await asyncio.gather(*calls):
                assert answer.status_code == 200, answer.text
                assert answer.json()["result"]["content"][0]["text"] == "life: slept"
            assert gw.proc.poll() is None
            assert (await client.get(f"http://127.0.0.1:{ops}/readyz")).status_code == 200
            after = await mcp_http.post(client, url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
            assert after.status_code == 200
    finally:
        gw.stop()
    assert "SIGHUP" in gw.output()


async def test_in_demo_mode_the_gateway_drains_before_its_demo_backend(tmp_path):
    # No backends: the embedded demo backend, in the same process. A call in flight on SIGTERM
    # needs it until the gateway's drain is over.
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump({"server": {"drain_delay_seconds": 0.3}}))
    gw = gateway_process(config, env={"MCP_GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "0.3"}).start()
    assert gw.proc is not None
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            url = f"http://127.0.0.1:{gw.port}/mcp"
            call = asyncio.ensure_future(mcp_http.post(client, url, "tools/call",
                                                       {"name": "countdown", "arguments": {"n": 10}}))
            await asyncio.sleep(0.5)  # 2 s of countdown under way
            os.kill(gw.proc.pid, signal.SIGTERM)
            answer = await call
            assert answer.status_code == 200, answer.text
            assert mcp_http.sse_messages(answer.text)[-1]["result"]["content"][0]["text"] == "liftoff"
            assert await asyncio.to_thread(gw.proc.wait, 20) == 0
    finally:
        gw.stop()
