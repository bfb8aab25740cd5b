"""5,000 listen streams with alternating integer and string ids (the strings spelled like
numbers, so only the JSON type tells them apart), one gateway process, a burst of 50
notifications: every stream receives all 50, each carrying exactly its own id with its own
JSON type (spec §Receiving Notifications; the gateway splices ids into one encoding,
gateway/subscriptions/encoding.py)."""

from __future__ import annotations

import asyncio
import resource

import httpx
import orjson
import pytest
import yaml

from gateway import descriptors
from tests.support import mcp_http
from tests.support.listen import RawListen, close_all
from tests.support.procs import gateway_process, python_server

STREAMS = 5000
BURST = 50
URI = "fanout://burst"
SUB = "io.modelcontextprotocol/subscriptionId"


def _descriptors(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors; the hard RLIMIT_NOFILE here is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))


async def test_five_thousand_streams_each_get_their_own_id_with_its_type_in_a_burst(tmp_path):
    _descriptors(STREAMS + 1000)
    backend = python_server("mutable_modern.py", name="mutable-ids").start()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"name": "m", "url": backend.url}],
        "subscriptions": {"max_listens": STREAMS, "max_listens_per_principal": STREAMS},
        "observability": {"log_level": "warning"},
    }))
    gateway = gateway_process(config).start()
    # Integers and strings spelled the same: 0, "1", 2, "3", ...
    streams = [RawListen(i if i % 2 == 0 else str(i), {"resourceSubscriptions": [URI]}) for i in range(STREAMS)]
    tasks: list[asyncio.Task[None]] = []
    try:
        for start in range(0, STREAMS, 500):  # in batches: a connection storm measures the backlog
            batch = streams[start:start + 500]
            tasks += [asyncio.create_task(s.run(gateway.port)) for s in batch]
            await asyncio.wait_for(asyncio.gather(*(s.wait_events(1) for s in batch)), 30)
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(f"http://127.0.0.1:{backend.port}/touch", params={"uri": URI, "times": BURST})
            assert answer.status_code == 200
            assert (await http.get(f"http://127.0.0.1:{backend.port}/stats")).json()["open_listens"] == 1
        await asyncio.wait_for(asyncio.gather(*(s.wait_events(1 + BURST) for s in streams)), 30)
        await asyncio.sleep(0.2)  # nothing more may follow
        for s in streams:
            ack, *notifications = s.messages()
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"]["_meta"][SUB] == s.id
            assert len(notifications) == BURST, (s.id, len(notifications))
            for n in notifications:
                assert n["method"] == "notifications/resources/updated" and n["params"]["uri"] == URI
                got = n["params"]["_meta"][SUB]
                assert got == s.id and type(got) is type(s.id), (s.id, got)
    finally:
        await close_all(streams, tasks)
        gateway.stop()
        backend.stop()


async def test_a_replica_at_its_descriptor_limit_refuses_listens_and_keeps_serving(tmp_path):
    """docs/subscriptions.md "Limits and descriptors": with RLIMIT_NOFILE lowered under the
    running gateway, listens past (limit - reserve) get -31004 / 503 naming the limit, and
    the gateway goes on answering."""
    limit = descriptors.RESERVED + 40
    backend = python_server("mutable_modern.py", name="mutable-fd").start()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "m", "url": backend.url}],
                                      "observability": {"log_level": "warning"}}))
    gateway = gateway_process(config).start()
    streams = [RawListen(f"fd-{i}", {"resourceSubscriptions": [URI]}) for i in range(40)]
    tasks: list[asyncio.Task[None]] = []
    try:
        assert gateway.proc is not None
        resource.prlimit(gateway.proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
        tasks = [asyncio.create_task(s.run(gateway.port)) for s in streams]
        await asyncio.wait_for(asyncio.gather(*(s.wait_events(1) for s in streams)), 30)
        async with httpx.AsyncClient(timeout=30) as http:
            refused = await http.post(gateway.url, content=orjson.dumps(mcp_http.body(
                "subscriptions/listen", {"notifications": {"toolsListChanged": True}}, id="one-too-many")),
                headers=mcp_http.headers("subscriptions/listen"))
            assert refused.status_code == 503
            error = refused.json()["error"]
            assert error["code"] == -31004 and error["data"] == {"limit": "RLIMIT_NOFILE", "max": 40}
            assert "file descriptors" in error["message"]
            listed = await mcp_http.post(http, gateway.url, "tools/list")
            assert listed.status_code == 200 and listed.json()["result"]["tools"]
            # One stream leaves: its slot is free again.
            streams[0].close()
            await asyncio.sleep(0.5)
            async with http.stream("POST", gateway.url, content=orjson.dumps(mcp_http.body(
                    "subscriptions/listen", {"notifications": {"toolsListChanged": True}}, id="next")),
                    headers=mcp_http.headers("subscriptions/listen")) as again:
                assert again.status_code == 200
                assert again.headers["content-type"].startswith("text/event-stream")
    finally:
        await close_all(streams, tasks)
        gateway.stop()
        backend.stop()


def _open_files_limit(pid: int) -> tuple[str, str]:
    for line in open(f"/proc/{pid}/limits").read().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open-files line")


async def test_serve_raises_its_soft_descriptor_limit_to_the_hard_one(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard RLIMIT_NOFILE here is {hard}: nothing to raise")
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"backends": [{"name": "m", "url": "http://127.0.0.1:9/mcp"}],
                                      "observability": {"log_level": "info"}}))
    # The gateway inherits a soft limit of 1,024 (what many parents give) ...
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        gateway = gateway_process(config)
        gateway.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert gateway.proc is not None
        # ... and takes every descriptor the hard limit allows, and says so.
        got_soft, got_hard = _open_files_limit(gateway.proc.pid)
        assert got_soft == got_hard and got_soft != "1024"
        assert "soft limit raised from 1024 to the hard limit" in gateway.output()
    finally:
        gateway.stop()
