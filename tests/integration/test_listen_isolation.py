"""Isolation between listening clients, end to end (digest §d "Gateway fan-out"): the
gateway over real HTTP, in front of a backend that ignores listen filters and sends every
notification on every upstream listen (tests/support/broadcast_backend.py), so what each
client receives is what the gateway's own per-client filtering and re-tagging let through.

Ordering: each client's notifications come over upstream listens whose messages stay in
order, so every round is broadcast twice and a client's second round only arrives after
anything the first round leaked to it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import orjson
from prometheus_client import REGISTRY

from tests.support import mcp_http
from tests.support.broadcast_backend import BroadcastBackend, served
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader, eventually
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, JwksEndpoint, ServedApp, rsa_key

SUB = "io.modelcontextprotocol/subscriptionId"
TOOLS = "notifications/tools/list_changed"
PROMPTS = "notifications/prompts/list_changed"
RESOURCES = "notifications/resources/list_changed"
UPDATED = "notifications/resources/updated"


leaky = served  # a BroadcastBackend on a loopback socket (tests/support/broadcast_backend.py)


def seen(reader: ListenReader) -> list[tuple[str, str | None, Any]]:
    return [(n["method"], (n["params"]).get("uri"), n["params"]["_meta"][SUB]) for n in reader.notifications]


def broadcast_round(*backends: BroadcastBackend) -> None:
    for b in backends:
        b.broadcast(TOOLS)
        b.broadcast(PROMPTS)
        b.broadcast(RESOURCES)
        # Never listen-stream notifications (digest §c), and tasks the gateway does not offer.
        b.broadcast("notifications/message", {"level": "info", "data": "log line"})
        b.broadcast("notifications/progress", {"progressToken": 1, "progress": 1})
        b.broadcast("notifications/tasks", {"taskId": "t-1", "status": "working"})
        for uri in ("leaky://a", "leaky://b", "leaky://ab", "leaky://a/x", "leaky://dir/f",
                    "zero://z", "one://o"):
            b.broadcast(UPDATED, {"uri": uri}, meta={SUB: "someone-else", "example.com/keep": 1})


async def test_each_client_gets_only_its_own_types_and_uris_tagged_with_its_own_id():
    async with leaky("leaky") as (backend, url), \
            running_gateway({"backends": [{"name": "leaky", "url": url, "era": "modern"}],
                             "subscriptions": {"linger_seconds": 0.2}}) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        # An int and a string id that print alike: each must come back exactly as sent.
        tools = await ListenReader(http, gw.url, {"toolsListChanged": True}, id=1).open()
        prompts = await ListenReader(http, gw.url, {"promptsListChanged": True}, id="1").open()
        a = await ListenReader(http, gw.url, {"resourceSubscriptions": ["leaky://a"]}, id="a").open()
        ab = await ListenReader(http, gw.url, {"resourceSubscriptions": ["leaky://a", "leaky://b"]}, id="ab").open()
        tree = await ListenReader(http, gw.url, {"resourceSubscriptions": ["leaky://dir/"]}, id="tree").open()
        readers = (tools, prompts, a, ab, tree)
        for r in readers:
            assert r.status == 200 and r.ack["params"]["_meta"] == {SUB: r.id}
        # One list stream (all flags) and one per URI set: the upstreams carry the union.
        await eventually(lambda: backend.open_listens == 4)

        expected = {
            tools: [(TOOLS, None, 1)],
            prompts: [(PROMPTS, None, "1")],
            a: [(UPDATED, "leaky://a", "a"), (UPDATED, "leaky://a/x", "a")],
            ab: [(UPDATED, "leaky://a", "ab"), (UPDATED, "leaky://b", "ab"), (UPDATED, "leaky://a/x", "ab")],
            tree: [(UPDATED, "leaky://dir/f", "tree")],
        }
        broadcast_round(backend)
        broadcast_round(backend)
        for r in readers:
            await r.wait_count(1 + 2 * len(expected[r]))
        for r in readers:
            assert seen(r) == expected[r] * 2, r.id
            assert not r.ended
        # Other `_meta` keys of the backend pass through; only the subscription id is replaced.
        assert a.notifications[0]["params"]["_meta"] == {SUB: "a", "example.com/keep": 1}
        for r in readers:
            await r.close()


async def test_a_client_hears_only_the_backend_that_owns_its_uri():
    async with leaky("zero") as (zero, zero_url), leaky("one") as (one, one_url), \
            running_gateway({"backends": [
                {"name": "zero", "url": zero_url, "era": "modern", "resource_prefixes": ["zero://"]},
                {"name": "one", "url": one_url, "era": "modern", "resource_prefixes": ["one://"]}],
                "subscriptions": {"linger_seconds": 0.2}}) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        z = await ListenReader(http, gw.url, {"resourceSubscriptions": ["zero://z"]}, id="z").open()
        o = await ListenReader(http, gw.url, {"resourceSubscriptions": ["one://o"]}, id="o").open()
        await eventually(lambda: zero.open_listens == 1 and one.open_listens == 1)
        # Routing: each URI was asked only of the backend that owns it.
        assert zero.filters == [{"resourceSubscriptions": ["zero://z"]}]
        assert one.filters == [{"resourceSubscriptions": ["one://o"]}]
        # Both backends announce both URIs (and every list) on their listens.
        broadcast_round(zero, one)
        broadcast_round(zero, one)
        await z.wait_count(3)
        await o.wait_count(3)
        assert seen(z) == [(UPDATED, "zero://z", "z")] * 2
        assert seen(o) == [(UPDATED, "one://o", "o")] * 2
        await z.close()
        await o.close()


async def test_a_client_that_leaves_takes_only_its_own_share_of_the_upstream():
    async with leaky("leaky") as (backend, url), \
            running_gateway({"backends": [{"name": "leaky", "url": url, "era": "modern"}],
                             "subscriptions": {"linger_seconds": 0.2}}) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        first = await ListenReader(http, gw.url, {"resourceSubscriptions": ["leaky://a"]}, id="first").open()
        second = await ListenReader(http, gw.url, {"resourceSubscriptions": ["leaky://a"]}, id="second").open()
        both = await ListenReader(http, gw.url, {"resourceSubscriptions": ["leaky://a", "leaky://b"]},
                                  id="both").open()
        await eventually(lambda: backend.open_listens == 2)  # {a} shared by two clients, {a, b}
        opened = len(backend.filters)

        await first.close()
        await eventually(lambda: gw.runtime.hub.client_count == 2)
        backend.broadcast(UPDATED, {"uri": "leaky://a"})
        await second.wait_count(2)
        await both.wait_count(2)
        assert seen(second) == [(UPDATED, "leaky://a", "second")]
        # The shared upstream was never closed and reopened for the client that stayed.
        assert backend.open_listens == 2 and len(backend.filters) == opened

        await second.close()
        # The last client of {a} gone, its upstream closes (after the linger); the other
        # client's upstream, which also carries leaky://a, stays and still delivers it.
        await eventually(lambda: backend.open_listens == 1)
        assert backend.listens[0][1] == {"resourceSubscriptions": ["leaky://a", "leaky://b"]}
        backend.broadcast(UPDATED, {"uri": "leaky://a"})
        await both.wait_count(3)
        assert seen(both) == [(UPDATED, "leaky://a", "both")] * 2 and not both.ended
        await both.close()


async def test_per_principal_limits_follow_the_jwt_subject_not_the_token():
    issuer = Issuer(keys=[rsa_key("k1")])
    jwks = ServedApp(JwksEndpoint(issuer))
    await jwks.start()
    try:
        async with leaky("leaky") as (_, url), running_gateway({
                "backends": [{"name": "leaky", "url": url, "era": "modern"}],
                "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": f"{jwks.base}/jwks",
                         "authorization_servers": [ISSUER], "required_scopes": ["mcp:read"]},
                "subscriptions": {"max_listens_per_principal": 2, "max_listens": 10}}) as gw, \
                httpx.AsyncClient(timeout=30) as http:

            def listen(sub: str, id: str, scope: str = "mcp:read", **claims: Any) -> ListenReader:
                token = issuer.token(sub, scope=scope, **claims)
                return ListenReader(http, gw.url, {"toolsListChanged": True}, id=id,
                                    headers={"authorization": f"Bearer {token}"})

            # Every token is a fresh one (its own jti): the limit counts the subject, so
            # minting another token for the same subject does not dodge it.
            alice = [await listen("alice", f"alice-{i}", jti=f"t{i}").open() for i in range(2)]
            assert [r.status for r in alice] == [200, 200]
            refused = await listen("alice", "alice-2", jti="t2", scope="mcp:read extra").open()
            assert refused.status == 429 and refused.error["error"]["code"] == -31004
            assert refused.error["id"] == "alice-2"
            # Alice's listens are not counted against anybody else.
            bob = [await listen("bob", f"bob-{i}", jti=f"b{i}").open() for i in range(2)]
            assert [r.status for r in bob] == [200, 200]
            assert (await listen("bob", "bob-2", jti="b2").open()).status == 429
            # Closing one of Alice's frees exactly one of Alice's slots.
            await alice[0].close()
            await eventually(lambda: gw.runtime.hub.client_count == 3)
            again = await listen("alice", "alice-3", jti="t3").open()
            assert again.status == 200
            assert (await listen("alice", "alice-4", jti="t4").open()).status == 429
            for r in (*alice, *bob, again):
                await r.close()
    finally:
        await jwks.stop()


def _overflows() -> float:
    return REGISTRY.get_sample_value("mcp_gateway_listen_overflows_total") or 0.0


async def test_a_stalled_client_is_cut_at_its_own_bound_without_the_graceful_result():
    """docs/subscriptions.md "Backpressure and limits": a full queue closes that client's
    stream without the graceful result; the clients sharing its upstream, and the others,
    lose nothing."""
    hot = "leaky://hot/" + "x" * 2000  # ~2 KB a notification: the stalled socket fills soon
    stalled = socket.socket()
    async with leaky("leaky") as (backend, url), \
            running_gateway({"backends": [{"name": "leaky", "url": url, "era": "modern"}],
                             "subscriptions": {"queue_size": 64}}) as gw, \
            httpx.AsyncClient(timeout=30) as http:
        try:
            same = await ListenReader(http, gw.url, {"resourceSubscriptions": [hot]}, id="same").open()
            tools = await ListenReader(http, gw.url, {"toolsListChanged": True}, id="tools").open()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", gw.port))
            body = orjson.dumps(mcp_http.body("subscriptions/listen",
                                              {"notifications": {"resourceSubscriptions": [hot]}}, id="stalled"))
            head = "".join(f"{k}: {v}\r\n" for k, v in mcp_http.headers("subscriptions/listen").items())
            stalled.sendall(f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{gw.port}\r\n{head}"
                            f"content-length: {len(body)}\r\n\r\n".encode() + body)
            await eventually(lambda: gw.runtime.hub.client_count == 3)

            before, sent, rounds = _overflows(), 0, 0
            while _overflows() == before:
                assert rounds < 1000, "the stalled client was never cut off"
                for _ in range(50):  # fewer than the queue: the healthy readers keep up
                    backend.broadcast(UPDATED, {"uri": hot})
                backend.broadcast(TOOLS)
                sent, rounds = sent + 50, rounds + 1
                await same.wait_count(1 + sent)
                await tools.wait_count(1 + rounds)
            assert _overflows() == before + 1
            await eventually(lambda: gw.runtime.hub.client_count == 2)
            backend.broadcast(UPDATED, {"uri": hot})
            backend.broadcast(TOOLS)
            await same.wait_count(2 + sent)
            await tools.wait_count(2 + rounds)
            assert seen(same) == [(UPDATED, hot, "same")] * (sent + 1) and not same.ended
            assert seen(tools) == [(TOOLS, None, "tools")] * (rounds + 1) and not tools.ended

            # What the stalled client did get: its own notifications only, then the end of
            # the connection, with no graceful result (the spec's "re-listen and refetch").
            stalled.setblocking(False)
            loop = asyncio.get_running_loop()
            received = b""

            async def drain() -> None:
                nonlocal received
                while chunk := await loop.sock_recv(stalled, 65536):
                    received += chunk

            await asyncio.wait_for(drain(), 20)
            events = [orjson.loads(line[5:]) for line in received.split(b"\n") if line.startswith(b"data:")]
            assert events and events[0]["method"] == "notifications/subscriptions/acknowledged"
            assert all(e.get("method") in ("notifications/subscriptions/acknowledged", UPDATED) for e in events)
            assert {e["params"]["_meta"][SUB] for e in events} == {"stalled"}
            assert b'"resultType"' not in received
            await same.close()
            await tools.close()
        finally:
            stalled.close()
