"""`backends[].instances: N` (issue 18 item 3; docs/resilience.md "stdio instances"): N real
processes of one stdio command behind one name, of both eras.

The modern fixture (tests/fixtures/servers/modern_stdio.py, mcp==2.3.0) and the legacy one
(legacy_everything.py --stdio, mcp==1.30.0) each report their process id (the `pid` tool, the
`demo://pid` resource), so which process served a call is the process's own word.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.backends.errors import never_sent
from gateway.backends.stdio_process import StdioProcess
from gateway.protocol import jsonrpc as rpc
from tests.support import legacy_venv
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.mcp_http import post, sse_messages
from tests.support.procs import FIXTURE_SERVERS

MODERN = [sys.executable, str(FIXTURE_SERVERS / "modern_stdio.py")]


def _legacy() -> list[str]:
    return [legacy_venv.legacy_python(), str(FIXTURE_SERVERS / "legacy_everything.py"), "--stdio"]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
        yield http


def _answer(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return sse_messages(response.text)[-1]
    return response.json()


def _text(response: httpx.Response) -> str | None:
    """The text of a successful tools/call or resources/read answer; None when it failed."""
    if response.status_code != 200:
        return None
    result = _answer(response).get("result")
    if not isinstance(result, dict) or result.get("isError"):
        return None
    for item in result.get("content") or result.get("contents") or ():
        if isinstance(item.get("text"), str):
            return item["text"]
    return None


async def _metric(client: httpx.AsyncClient, base: str, name: str, **labels: str) -> float | None:
    text = (await client.get(f"{base}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


async def test_three_modern_instances_share_the_calls_and_one_killed_under_load_comes_back(client):
    """Calls spread over all three processes; one is SIGKILLed under load: no read fails (an
    idempotent read it lost is retried on another instance), no call sent after the gateway
    saw the death fails (the dead process is out of rotation), and only a tools/call written
    to it before then can be lost, as with one process (STDIO §Unexpected Termination: it
    may have been read; in the instant after a SIGKILL the dying process's threads still hold
    its stdin, so a write then succeeds and is lost too). It is restarted, checked and serves
    again, and /metrics shows its ejection and return by instance index."""
    health = {"check_interval_seconds": 0.5, "check_timeout_seconds": 5, "base_ejection_seconds": 60}
    settings = {"backends": [{"name": "trio", "command": MODERN, "era": "modern", "instances": 3,
                              "restart_backoff_seconds": 1.0, "health": health}],
                "cache": {"store": "none"}}
    async with running_gateway(settings) as gw:
        (trio,) = gw.runtime.backends
        await eventually(lambda: all(trio.pids), timeout=20)
        started = set(trio.pids)
        assert len(started) == 3

        served: Counter[str] = Counter()
        read_failures: list[str] = []
        call_failures: list[tuple[float, str]] = []
        stop = asyncio.Event()

        async def reader() -> None:
            async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
                while not stop.is_set():
                    response = await post(http, gw.url, "resources/read", {"uri": "demo://pid"})
                    pid = _text(response)
                    if pid is None:
                        read_failures.append(response.text)
                    else:
                        served[pid] += 1

        async def caller() -> None:
            async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
                while not stop.is_set():
                    sent = time.monotonic()
                    response = await post(http, gw.url, "tools/call", {"name": "pid", "arguments": {}})
                    pid = _text(response)
                    if pid is None:
                        call_failures.append((sent, response.text))
                    else:
                        served[pid] += 1

        tasks = [asyncio.create_task(reader()) for _ in range(4)] + [asyncio.create_task(caller()) for _ in range(4)]
        try:
            # Spread: every process serves (power of two choices on requests in flight).
            await eventually(lambda: all(served[str(pid)] >= 10 for pid in started), timeout=20)
            victim_index = 1
            victim = trio.pids[victim_index]
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)

            async def down() -> bool:
                return await _metric(client, gw.base, "mcp_gateway_backend_endpoint_up", backend="trio",
                                     endpoint=f"instance-{victim_index}") == 0

            await eventually(down, timeout=5)
            seen_dead_at = trio.health.endpoints[victim_index].last_ejected  # the gateway's notice
            after_kill = sum(served.values())

            async def back() -> bool:
                return await _metric(client, gw.base, "mcp_gateway_backend_endpoint_up", backend="trio",
                                     endpoint=f"instance-{victim_index}") == 1

            await eventually(back, timeout=20)
            reborn = trio.pids[victim_index]
            assert reborn not in (None, victim)
            # Back in rotation: the new process serves calls again.
            await eventually(lambda: served[str(reborn)] >= 10, timeout=20)
        finally:
            stop.set()
            await asyncio.gather(*tasks)

        assert sum(served.values()) > after_kill  # the others kept serving meanwhile
        assert read_failures == [], read_failures[:3]
        # Lost calls are only those written to the dying process: sent before the gateway saw
        # its death, failing with its exit. None sent after that failed.
        assert killed_at < seen_dead_at
        assert all(sent < seen_dead_at and "exited" in text for sent, text in call_failures), call_failures[:3]
        assert len(call_failures) <= 4, call_failures
        assert served[str(victim)] > 0
        assert await _metric(client, gw.base, "mcp_gateway_backend_ejections_total", backend="trio") >= 1
        assert await _metric(client, gw.base, "mcp_gateway_backend_up", backend="trio") == 1
        assert await _metric(client, gw.base, "mcp_gateway_stdio_restarts_total", backend="trio") >= 1
        print(f"{sum(served.values())} answered by {dict(served)}; {len(call_failures)} calls lost in the kill")


async def test_a_request_no_process_could_read_is_marked_never_sent():
    """A process whose stdin is closed (here: it closed it itself and lives on, so that no exit
    races the write) cannot have read the request: the write fails as never sent, which sends
    it to another instance whatever its method (stdio_instances.py, backends/retry.py)."""
    deaf = [sys.executable, "-c", "import os, time; os.close(0); time.sleep(30)"]
    process = StdioProcess("deaf", tuple(deaf), dict(os.environ), backoff=5.0,
                           on_message=lambda message: None, on_exit=lambda reason: None)
    process.start()
    try:
        await eventually(lambda: process.pid is not None, timeout=20)
        await asyncio.sleep(1.0)  # it has closed its stdin by now (a one-liner)
        with pytest.raises(rpc.McpError) as raised:
            for _ in range(3):  # a write that fits the pipe's buffer may pass; EPIPE comes next
                await process.write({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, wait=1)
        assert never_sent(raised.value), raised.value.message
        assert "before the request was written" in raised.value.message
    finally:
        await process.aclose()


async def test_max_concurrent_calls_bounds_the_backend_not_each_instance(client):
    """With era: auto too: the era probe's process becomes the first instance."""
    settings = {"backends": [{"name": "trio", "command": MODERN, "instances": 3,
                              "max_concurrent_calls": 2, "max_queued_calls": 0}],
                "cache": {"store": "none"}}
    async with running_gateway(settings) as gw:
        (auto,) = gw.runtime.backends
        assert auto.era == "modern"
        trio = auto._delegates["modern"]
        assert trio.health is auto.health
        await eventually(lambda: all(trio.pids) and len(set(trio.pids)) == 3, timeout=20)
        slow = {"name": "slow_echo", "arguments": {"text": "x", "delay": 1.0}}
        responses = await asyncio.gather(*(post(client, gw.url, "tools/call", slow) for _ in range(3)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200, 200, 503], [r.text for r in responses]
        refused = next(r for r in responses if r.status_code == 503).json()["error"]
        assert refused["code"] == -31004 and refused["data"]["backend"] == "trio"


ELICIT = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}


async def test_legacy_stdio_two_instances_each_with_its_own_session_and_mrtr_across_them(client):
    """era: auto finds the initialize-era protocol; two processes, each initialized once (one
    legacy session per process), both serving; a call parked for an MRTR answer resumes on
    its own session although the client's retry reaches the other instance."""
    settings = {"backends": [{"name": "files", "command": _legacy(), "instances": 2}]}
    async with running_gateway(settings) as gw:
        (auto,) = gw.runtime.backends
        assert auto.era == "legacy"
        pair = auto._delegates["legacy"]
        answers = await asyncio.gather(*(post(client, gw.url, "tools/call", {"name": "pid", "arguments": {}}, id=i)
                                         for i in range(30)))
        pids = Counter(_text(a) for a in answers)
        assert set(pids) == {str(p) for p in pair.pids}, pids
        # Each process holds exactly one legacy session, on its own pipe.
        for instance in pair.instances:
            (one,) = instance.pool.sessions()
            assert one.process is instance.process and one.generation == 1

        for _ in range(2):
            ask = {"name": "ask_user", "arguments": {"question": "which?"}}
            first = (await post(client, gw.url, "tools/call", ask, id="c1", meta=ELICIT)).json()["result"]
            assert first["resultType"] == "input_required", first
            [key] = first["inputRequests"]
            (parked_on,) = [i for i, inst in enumerate(pair.instances) if inst.pool.sessions()[0].in_flight]
            # The retry must go to the other instance: make the parked one look busy.
            pair.health.endpoints[parked_on].in_flight += 100
            try:
                retry = {**ask, "inputResponses": {key: {"action": "accept", "content": {"answer": "both"}}},
                         "requestState": first["requestState"]}
                done = await post(client, gw.url, "tools/call", retry, id="c2", meta=ELICIT)
            finally:
                pair.health.endpoints[parked_on].in_flight -= 100
            assert _text(done) == "accept: both", done.text
        assert len(pair.instances[0].continuations) == 0


async def test_a_listen_goes_through_one_instance_and_moves_when_it_dies(client):
    """One upstream listen for N processes (not N copies of each change); when its process
    dies, the hub listens again through the other instance and the listener is told that the
    list may have changed meanwhile."""
    settings = {"backends": [{"name": "files", "command": _legacy(), "era": "legacy", "instances": 2,
                              "restart_backoff_seconds": 2.0}],
                "subscriptions": {"linger_seconds": 0.2}}
    async with running_gateway(settings) as gw:
        (pair,) = gw.runtime.backends
        listener = await ListenReader(client, gw.url, {"toolsListChanged": True}).open()
        try:
            assert listener.messages[0]["method"] == "notifications/subscriptions/acknowledged"
            assert listener.messages[0]["params"]["notifications"].get("toolsListChanged") is True

            def listening() -> list[int]:
                return [i for i, instance in enumerate(pair.instances) if instance.listens._listeners]

            await eventually(lambda: len(listening()) == 1, timeout=10)
            (first,) = listening()
            killed = time.monotonic()
            os.kill(pair.pids[first], signal.SIGKILL)
            await eventually(lambda: listening() == [1 - first], timeout=15)
            await listener.wait(lambda: any(m.get("method") == "notifications/tools/list_changed"
                                            for m in listener.messages[1:]), timeout=15)
            print(f"the listen moved to the other instance and the listener was told "
                  f"{time.monotonic() - killed:.2f}s after the kill")
        finally:
            await listener.close()
