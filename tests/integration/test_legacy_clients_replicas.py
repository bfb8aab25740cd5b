"""Initialize-era clients behind a balancer without affinity: two gateway processes sharing
`security.secret` and a real redis-server, and a round-robin proxy that sends each request to
the next replica (tests/support/round_robin.py), as a Kubernetes Service without
`sessionAffinity` does. The official SDK client (mcp==2.3.0, mode="legacy") and raw HTTP.

Every test checks in the proxy's log that the requests it is about really reached different
replicas: a test that passed because both happened to land on one would prove nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
import yaml
from mcp import Client
from mcp.client.sse import sse_client

from tests.integration.test_legacy_clients_http import hdrs, initialize, rpc, sse_events
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, JwksEndpoint, rsa_key, serve
from tests.support.procs import Proc, RedisServer, free_port, gateway_process, redis_server_binary
from tests.support.round_robin import RoundRobinProxy, round_robin

pytestmark = pytest.mark.filterwarnings("ignore:.*(ping is removed|logging capability is deprecated).*")

WATCHED = "mutable://config"
SSE = {"accept": "text/event-stream"}


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.fail("redis-server is not installed; run the tests through scripts/test.sh, which installs it")
    server = RedisServer().start()
    yield server
    server.stop()


class Fleet:
    def __init__(self, replicas: list[Proc], proxy: RoundRobinProxy, url: str) -> None:
        self.replicas, self.proxy, self.url = replicas, proxy, url


@contextlib.asynccontextmanager
async def fleet(redis: RedisServer, backends: list[dict[str, Any]], tmp: Path, *, extra: dict[str, Any] | None = None,
                **server: Any) -> AsyncIterator[Fleet]:
    """Two replicas, each advertising its own URL (as deploy/kubernetes does from the pod IP),
    behind the round-robin proxy."""
    replicas: list[Proc] = []
    try:
        for i in range(2):
            port = free_port()
            config = tmp / f"replica{i}.yaml"
            config.write_text(yaml.safe_dump({
                # An answer that never reaches its call fails the call in 15 s, not 300.
                "server": {"host": "127.0.0.1", "port": port, "legacy_input_timeout_seconds": 15, **server},
                "backends": backends,
                "cache": {"store": "redis", "redis_url": redis.url},
                "subscriptions": {"linger_seconds": 0},
                "security": {"secret": "replicas-share-this-secret"},
                **(extra or {}),
            }))
            replicas.append(gateway_process(
                config, port=port, env={"MCP_GATEWAY_SECURITY__ADVERTISE_URL": f"http://127.0.0.1:{port}/mcp"}
            ).start())
        async with round_robin([f"http://127.0.0.1:{r.port}" for r in replicas]) as (proxy, base):
            yield Fleet(replicas, proxy, f"{base}/mcp")
    finally:
        for replica in replicas:
            replica.stop()


@pytest.fixture
def backends(conformance_backend: Proc, mutable_backend: Proc) -> list[dict[str, Any]]:
    return [{"name": "conf", "url": conformance_backend.url, "era": "modern"},
            {"name": "mut", "url": mutable_backend.url, "era": "modern"}]  # tools: conf__*, mut__*


async def _touch(mutable_backend: Proc, uri: str) -> None:
    async with httpx.AsyncClient() as http:
        (await http.post(f"http://127.0.0.1:{mutable_backend.port}/touch", params={"uri": uri})).raise_for_status()


async def _until_updated(updates: asyncio.Queue[str], mutable_backend: Proc, uri: str) -> None:
    """Touch `uri` until its update arrives: the subscription reaches the stream's replica
    through Redis and a re-listen, which takes a moment after `resources/subscribe` returns
    (as on one replica, where the listener restarts in the background too)."""
    async def arrived() -> None:
        while True:
            await _touch(mutable_backend, uri)
            with contextlib.suppress(TimeoutError):
                assert await asyncio.wait_for(updates.get(), 0.5) == uri
                return

    await asyncio.wait_for(arrived(), 20)


async def test_an_sdk_client_through_round_robin_keeps_its_session_on_every_replica(
        redis: RedisServer, backends: list[dict[str, Any]], mutable_backend: Proc, tmp_path: Path) -> None:
    updates: asyncio.Queue[str] = asyncio.Queue()
    asked: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await updates.put(message.params.uri)

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async with fleet(redis, backends, tmp_path) as gw:
        proxy = gw.proxy
        async with Client(gw.url, mode="legacy", message_handler=on_message, elicitation_callback=elicit) as client:
            assert client.protocol_version == "2025-11-25"
            tools = await client.list_tools()
            assert {"conf__test_simple_text", "mut__touch_resource"} <= {t.name for t in tools.tools}
            result = await client.call_tool("conf__test_simple_text", {})
            assert not result.is_error
            assert len(set(proxy.where("initialize") + proxy.where("tools/list") + proxy.where("tools/call"))) == 2

            # The GET stream lives on one replica; the subscription is made on the other.
            await _wait_for_get_stream(proxy)
            stream_on = proxy.where(http_method="GET")[-1]
            if proxy._next != 1 - stream_on:
                await client.send_ping()  # the next request then reaches the other replica
            await client.subscribe_resource(WATCHED)
            assert proxy.where("resources/subscribe") == [1 - stream_on]
            await _until_updated(updates, mutable_backend, WATCHED)

            # An elicitation asked on the call's replica, answered through the other one.
            result = await client.call_tool("conf__test_elicitation", {"message": "Who are you?"})
            assert asked == ["Who are you?"]
            assert result.content[0].text == ('User response: action=accept, content={"email": '
                                              '"ada@example.com", "username": "ada"}')
            (call_on,) = proxy.where("tools/call", rpc_id=_last_id(proxy, "tools/call"))
            answered_on = [r.upstream for r in proxy.log if r.rpc_method is None and r.http_method == "POST"]
            assert answered_on and answered_on[-1] == 1 - call_on

            # One replica dies (SIGKILL: no goodbye): the session goes on through the other.
            gw.replicas[stream_on].kill()
            tools = await client.list_tools()
            assert "conf__test_simple_text" in {t.name for t in tools.tools}
            result = await client.call_tool("conf__test_elicitation", {"message": "Still there?"})
            assert asked[-1] == "Still there?" and not result.is_error
            # The client re-opened its GET stream on the survivor, where updates now arrive.
            await _wait_for_get_stream(proxy, on=1 - stream_on)
            await _until_updated(updates, mutable_backend, WATCHED)


def _last_id(proxy: RoundRobinProxy, method: str) -> Any:
    return [r.rpc_id for r in proxy.log if r.rpc_method == method][-1]


async def _wait_for_get_stream(proxy: RoundRobinProxy, on: int | None = None) -> None:
    async def opened() -> None:
        while not (gets := proxy.where(http_method="GET")) or (on is not None and gets[-1] != on):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(opened(), 20)


async def test_a_get_stream_opened_on_another_replica_replaces_the_first_at_once(
        redis: RedisServer, backends: list[dict[str, Any]], mutable_backend: Proc, tmp_path: Path) -> None:
    """Raw HTTP, straight to each replica: a client whose GET stream died re-opens it wherever
    the balancer sends it; the new one starts at once, the old one (if its replica still
    thinks it open) ends, and notifications arrive on the new one only."""
    async with fleet(redis, backends, tmp_path, keepalive_seconds=60) as gw, httpx.AsyncClient(timeout=20) as http:
        first, second = (r.url for r in gw.replicas)
        session = await initialize(http, first)
        subscribed = await http.post(second, content=rpc("resources/subscribe", {"uri": WATCHED}),
                                     headers=hdrs(session))
        assert subscribed.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        async with http.stream("GET", first, headers=hdrs(session, **SSE)) as old:
            old_events = sse_events(old)
            assert (await anext(old_events))[1] == ""  # primed
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with http.stream("GET", second, headers=hdrs(session, **SSE)) as new:
                assert new.status_code == 200
                lines: asyncio.Queue[str] = asyncio.Queue()
                reader = asyncio.create_task(_read_lines(new, lines))
                try:
                    # "At once": well inside the keep-alive interval (60 s here), which is what a
                    # stream that waited for its first event would take. 15 s, not 5: on a loaded
                    # 2-core machine the second replica's first bytes took more than 5 s.
                    assert (await asyncio.wait_for(lines.get(), 15)).startswith(("id: ", ":"))
                    assert loop.time() - started < 15
                    with pytest.raises(StopAsyncIteration):  # the first replica let its stream go
                        await asyncio.wait_for(anext(old_events), 10)

                    async def updated() -> None:
                        while True:
                            await _touch(mutable_backend, WATCHED)
                            with contextlib.suppress(TimeoutError):
                                while True:
                                    line = await asyncio.wait_for(lines.get(), 0.5)
                                    if line.startswith("data: {"):
                                        assert json.loads(line[6:]) == {
                                            "jsonrpc": "2.0", "method": "notifications/resources/updated",
                                            "params": {"uri": WATCHED}}
                                        return

                    await asyncio.wait_for(updated(), 20)
                finally:
                    reader.cancel()


async def _read_lines(response: httpx.Response, into: asyncio.Queue[str]) -> None:
    """Lines of a streamed response into a queue (a timed-out `anext` on `aiter_lines` would
    close the generator for good)."""
    with contextlib.suppress(httpx.HTTPError):
        async for line in response.aiter_lines():
            await into.put(line)


async def test_session_state_and_its_end_are_the_fleets(
        redis: RedisServer, backends: list[dict[str, Any]], tmp_path: Path) -> None:
    """What a client changes on one replica holds on the other: the log level (the next call's
    logs), the end (DELETE on one replica: 404 on both), and the sealed id stays the caller's
    (another Authorization gets the 404 of an id that never existed; a tampered id too)."""
    async with fleet(redis, backends, tmp_path) as gw, httpx.AsyncClient(timeout=20) as http:
        first, second = (r.url for r in gw.replicas)
        session = await initialize(http, first)
        leveled = await http.post(second, content=rpc("logging/setLevel", {"level": "warning"}),
                                  headers=hdrs(session))
        assert leveled.json()["result"] == {}
        # Created once in the fleet, counted by the replica that answered initialize only (the
        # other one materialized it).
        assert [await _sessions_created(http, url) for url in (first, second)] == [1.0, 0.0]
        call = await http.post(first, content=rpc("tools/call", {"name": "conf__test_logging_tool", "arguments": {}}, id=2),
                               headers=hdrs(session))
        notes = [json.loads(data) for _, data in [e async for e in _events(call)] if data]
        assert [n["params"]["level"] for n in notes if n.get("method") == "notifications/message"] == ["warning"]

        never = await http.post(first, content=rpc("ping", id=3), headers=hdrs("v1.AAAA"))
        other = await http.post(second, content=rpc("ping", id=3), headers=hdrs(session, authorization="Bearer x"))
        tampered = session[:-4] + ("AAAA" if not session.endswith("AAAA") else "BBBB")
        forged = await http.post(second, content=rpc("ping", id=3), headers=hdrs(tampered))
        assert never.status_code == other.status_code == forged.status_code == 404
        assert never.content == other.content == forged.content

        assert (await http.delete(second, headers=hdrs(session))).status_code == 200
        for url in (first, second):
            gone = await http.post(url, content=rpc("ping", id=4), headers=hdrs(session))
            assert gone.status_code == 404


async def _sessions_created(http: httpx.AsyncClient, mcp_url: str) -> float:
    text = (await http.get(mcp_url.removesuffix("/mcp") + "/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("mcp_gateway_legacy_client_sessions_created_total"))


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    if response.headers["content-type"].startswith("text/event-stream"):
        for block in response.text.split("\n\n"):
            data = "\n".join(line[6:] for line in block.split("\n") if line.startswith("data: "))
            yield None, data
    else:
        yield None, response.text


async def test_the_session_bound_holds_across_replicas(
        redis: RedisServer, backends: list[dict[str, Any]], tmp_path: Path) -> None:
    """`legacy_max_sessions` bounds the fleet's sessions, wherever they were made: the least
    recently used one ends for every replica."""
    async with fleet(redis, backends, tmp_path, legacy_max_sessions=3) as gw, httpx.AsyncClient(timeout=20) as http:
        first, second = (r.url for r in gw.replicas)
        oldest = await initialize(http, first)
        kept = [await initialize(http, second), await initialize(http, first)]
        for url in (first, second):
            assert (await http.post(url, content=rpc("ping"), headers=hdrs(oldest))).status_code == 200
        await asyncio.sleep(0.01)
        for session in kept:  # now `oldest` is the least recently used
            assert (await http.post(second, content=rpc("ping"), headers=hdrs(session))).status_code == 200
        newest = await initialize(http, second)
        for url in (first, second):
            assert (await http.post(url, content=rpc("ping"), headers=hdrs(oldest))).status_code == 404
            for session in (*kept, newest):
                assert (await http.post(url, content=rpc("ping"), headers=hdrs(session))).status_code == 200


async def test_a_principals_share_and_binding_hold_across_replicas(
        redis: RedisServer, backends: list[dict[str, Any]], tmp_path: Path) -> None:
    """`legacy_max_sessions: 6`: an authenticated principal holds at most 3 sessions in the
    whole fleet. Alice opening 4, on alternate replicas, ends her own oldest (404 on both
    replicas); Bob's session lives, and Bob presenting Alice's id on the other replica gets
    the 404 of an id that never existed."""
    issuer = Issuer(keys=[rsa_key("replicas")])
    alice = {"authorization": f"Bearer {issuer.token('alice')}"}
    bob = {"authorization": f"Bearer {issuer.token('bob')}"}
    async with serve(JwksEndpoint(issuer)) as jwks:
        auth = {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": f"{jwks.base}/jwks",
                "authorization_servers": [ISSUER]}
        async with (fleet(redis, backends, tmp_path, extra={"auth": auth}, legacy_max_sessions=6) as gw,
                    httpx.AsyncClient(timeout=20) as http):
            urls = [r.url for r in gw.replicas]

            async def status(url: str, session: str, who: dict[str, str]) -> int:
                return (await http.post(url, content=rpc("ping"), headers=hdrs(session, **who))).status_code

            theirs = await initialize(http, urls[0], **bob)
            mine = [await initialize(http, urls[i % 2], **alice) for i in range(4)]
            for url in urls:
                assert [await status(url, s, alice) for s in mine] == [404, 200, 200, 200]
                assert await status(url, theirs, bob) == 200
            stolen = await http.post(urls[1], content=rpc("ping"), headers=hdrs(mine[1], **bob))
            unknown = await http.post(urls[1], content=rpc("ping"), headers=hdrs("v1.AAAAAAAA", **bob))
            assert stolen.status_code == unknown.status_code == 404 and stolen.content == unknown.content


async def test_an_http_sse_client_through_round_robin_has_its_posts_forwarded_to_its_stream(
        redis: RedisServer, backends: list[dict[str, Any]], tmp_path: Path) -> None:
    """HTTP+SSE (2024-11-05): the stream is one connection to one replica, which alone can
    write the answers; a POST the balancer sends to the other replica is forwarded there (the
    endpoint's session_id is sealed and names it). Lists, a call and an elicitation answered
    through the other replica."""
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})

    async with fleet(redis, backends, tmp_path) as gw:
        base = gw.url.removesuffix("/mcp")
        async with (asyncio.timeout(60),  # a POST lost on the wrong replica would leave the client waiting
                    Client(sse_client(f"{base}/sse"), mode="legacy", elicitation_callback=elicit) as client):
            tools = await client.list_tools()
            assert "conf__test_simple_text" in {t.name for t in tools.tools}
            assert not (await client.call_tool("conf__test_simple_text", {})).is_error
            result = await client.call_tool("conf__test_elicitation", {"message": "Who are you?"})
            assert asked == ["Who are you?"] and not result.is_error
        posts = [r.upstream for r in gw.proxy.log if r.http_method == "POST"]
        assert len(posts) >= 5 and set(posts) == {0, 1}  # half of them reached the stream's other replica
