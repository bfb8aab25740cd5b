"""Isolation between initialize-era client sessions, and between principals, end to end: the
gateway over real HTTP with real JWTs (a JWKS on 127.0.0.1, tokens signed with pyjwt), in
front of real backends, driven by raw HTTP where a client must misbehave and by the official
SDK client (mcp 2.x, mode="legacy") where a well-behaved one fits.

The rules (docs/legacy-clients.md §Isolation lists them with their tests):

- A session id is bound to the principal that created it (L-TR §Session Management, L-SBP
  §Session Hijacking): another principal presenting it with a valid token gets exactly the 404
  of an id that never existed (GET, POST, DELETE), and DELETE by them ends nothing. The owner
  may use any of its own tokens. 404 after DELETE or expiry.
- Resumption (L-TR §Resumability): a `Last-Event-ID` replays only the caller's own session's
  stream, even when another session's stream carries the very same id; a malformed or huge
  one is a 4xx, never a 500.
- The HTTP+SSE (2024-11-05) front: the POST endpoint belongs to the principal of its stream;
  no message of one stream reaches another; a POST whose stream closed while its body was in
  flight is 404 and starts nothing.
- Requests the gateway parks on a client (elicitation for an InputRequiredResult) are
  answered only from their own session: neither another session nor another principal can
  answer or cancel them.
- `resources/updated` reaches only the sessions that subscribed, and unsubscribing elsewhere
  (another session, another principal) cancels nothing.
- Limits: an authenticated principal holds at most its share of the sessions and of the
  HTTP+SSE streams (sessions.MAX_SESSIONS_PER_PRINCIPAL), so its flood ends only its own;
  without authentication the store is one LRU.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.legacy_clients.sessions import MAX_SESSIONS_PER_PRINCIPAL
from tests.integration.test_legacy_clients_http import hdrs, initialize, rpc, sse_events
from tests.integration.test_legacy_clients_sse import RawSseClient, sse_url
from tests.support.clock import ManualClock
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.listen import eventually
from tests.support.oauth import AUDIENCE, ISSUER, Issuer, JwksEndpoint, rsa_key, serve

pytestmark = pytest.mark.filterwarnings("ignore:.*(ping is removed|logging capability is deprecated).*")

SSE = {"accept": "text/event-stream"}


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer(keys=[rsa_key("isolation")])


@pytest.fixture
async def jwks_url(issuer: Issuer) -> AsyncIterator[str]:
    async with serve(JwksEndpoint(issuer)) as served:
        yield f"{served.base}/jwks"


def jwt_settings(backend_url: str, jwks_url: str, **server: Any) -> dict[str, Any]:
    return {
        "backends": [{"name": "conf", "url": backend_url, "era": "modern"}],
        "auth": {"mode": "jwt", "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks_url,
                 "authorization_servers": [ISSUER]},
        "server": server,
    }


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def principal(sub: str) -> str:
    """The key a JWT principal's sessions are bound to (policies/auth.py `Principal.key`)."""
    return f"{ISSUER}|{sub}"


def answer(request_id: str, name: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {
        "action": "accept", "content": {"username": name, "email": f"{name}@example.com"}}}).encode()


def refusal(response: httpx.Response) -> tuple[int, bytes, str | None]:
    """What a refusal tells its caller: status, body, and whether a session id came back."""
    return response.status_code, response.content, response.headers.get("mcp-session-id")


# -- session ids: bound to their principal; 404 after DELETE or expiry -------------------------


async def test_another_principals_session_id_is_an_unknown_one(conformance_backend, issuer, jwks_url) -> None:
    """Bob, with a valid token, presenting Alice's session id learns nothing: every method gets
    byte for byte the 404 of an id nobody ever had (a 403 would confirm it exists), and his
    DELETE ends nothing. Alice's session is bound to her, not to one token: a fresh token of
    hers works."""
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    async with (running_gateway(jwt_settings(conformance_backend.url, jwks_url)) as gw,
                httpx.AsyncClient(timeout=10) as http):
        session = await initialize(http, gw.url, **alice)
        assert len(session) >= 43  # secrets.token_urlsafe(32): 256 random bits
        await initialize(http, gw.url, **bob)  # bob has a session of his own
        never = secrets.token_urlsafe(32)
        for presented in (session, never):
            assert (await http.post(gw.url, content=rpc("ping"), headers=hdrs(presented, **alice))
                    ).status_code == (200 if presented == session else 404)

        async def as_bob(session_id: str) -> list[tuple[int, bytes, str | None]]:
            return [refusal(r) for r in (
                await http.post(gw.url, content=rpc("tools/list", id=3), headers=hdrs(session_id, **bob)),
                await http.post(gw.url, content=rpc("notifications/initialized", id=None),
                                headers=hdrs(session_id, **bob)),
                await http.get(gw.url, headers=hdrs(session_id, **bob, **SSE)),
                await http.get(gw.url, headers=hdrs(session_id, **bob, **SSE, **{"last-event-id": "s-1:1"})),
                await http.delete(gw.url, headers=hdrs(session_id, **bob)),
            )]

        stolen, unknown = await as_bob(session), await as_bob(never)
        assert stolen == unknown
        assert {status for status, _, _ in stolen} == {404}
        assert all(header is None for _, _, header in stolen)
        # Without a token the session id is worth nothing either (authentication comes first).
        assert (await http.post(gw.url, content=rpc("ping"), headers=hdrs(session))).status_code == 401
        # Bob's DELETE ended nothing; Alice, with another token of hers, still has her session.
        fresh = bearer(issuer.token("alice", jti=secrets.token_hex(8)))
        assert fresh != alice
        ping = await http.post(gw.url, content=rpc("ping", id=9), headers=hdrs(session, **fresh))
        assert ping.status_code == 200 and ping.json() == {"jsonrpc": "2.0", "id": 9, "result": {}}
        # Her DELETE ends it: 404 from then on, for every method.
        assert (await http.delete(gw.url, headers=hdrs(session, **alice))).status_code == 200
        after = [await http.post(gw.url, content=rpc("ping"), headers=hdrs(session, **alice)),
                 await http.get(gw.url, headers=hdrs(session, **alice, **SSE)),
                 await http.delete(gw.url, headers=hdrs(session, **alice))]
        assert [r.status_code for r in after] == [404, 404, 404]


async def test_an_idle_session_expires_to_404_and_a_used_one_does_not(conformance_backend) -> None:
    """L-TR §Session Management 3: once the server ended a session, its id MUST get 404. The
    store's clock is moved by hand (no test waits out `legacy_session_idle_seconds`)."""
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
              "server": {"legacy_session_idle_seconds": 60}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        clock = ManualClock()
        gw.app.legacy_clients.sessions._clock = clock
        idle, used = await initialize(http, gw.url), await initialize(http, gw.url)
        for _ in range(3):  # three times the idle limit in all, used every 40 s
            clock.now += 40
            assert (await http.post(gw.url, content=rpc("ping"), headers=hdrs(used))).status_code == 200
        gone = [await http.post(gw.url, content=rpc("ping"), headers=hdrs(idle)),
                await http.get(gw.url, headers=hdrs(idle, **SSE)),
                await http.delete(gw.url, headers=hdrs(idle))]
        assert [r.status_code for r in gone] == [404, 404, 404]
        assert "Session not found" in gone[0].json()["error"]["message"]
        assert (await http.post(gw.url, content=rpc("ping"), headers=hdrs(used))).status_code == 200


# -- resumability: only the caller's own stream ------------------------------------------------


async def _start_and_drop(http: httpx.AsyncClient, url: str, session: str, auth: dict[str, str], token: str) -> str:
    """A streamed tools/call (progress tagged `token`) whose connection is dropped after the
    priming event: the id of that event."""
    body = rpc("tools/call", {"name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": token}})
    async with http.stream("POST", url, content=body, headers=hdrs(session, **auth)) as response:
        async for event_id, data in sse_events(response):
            assert data == ""
            return event_id
    raise AssertionError("no priming event")


def _progress_tokens(text: str) -> list[str]:
    return [m["params"]["progressToken"] for m in _messages(text) if m.get("method") == "notifications/progress"]


def _messages(text: str) -> list[dict[str, Any]]:
    return [json.loads(data) for block in text.replace("\r\n", "\n").split("\n\n")
            if (data := "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")))]


async def test_last_event_id_replays_only_the_callers_own_stream(conformance_backend, issuer, jwks_url) -> None:
    """Event ids are per session (`<stream>:<seq>`), so Bob's stream may carry the very id
    Alice's does: presented by Bob it resumes Bob's stream, never Alice's (L-TR §Resumability:
    MUST NOT replay messages of another stream). With Alice's session id Bob gets 404; in a
    session without that stream, 400; Alice's stream is untouched by all of it."""
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    async with (running_gateway(jwt_settings(conformance_backend.url, jwks_url)) as gw,
                httpx.AsyncClient(timeout=10) as http):
        mine, theirs = await initialize(http, gw.url, **alice), await initialize(http, gw.url, **bob)
        alices_id = await _start_and_drop(http, gw.url, mine, alice, "alice")
        bobs_id = await _start_and_drop(http, gw.url, theirs, bob, "bob")
        assert alices_id == bobs_id  # the same id, in two sessions

        replayed = await http.get(gw.url, headers=hdrs(theirs, **bob, **SSE, **{"last-event-id": alices_id}))
        assert replayed.status_code == 200
        assert _progress_tokens(replayed.text) == ["bob", "bob", "bob"]
        assert "alice" not in replayed.text
        assert (await http.get(gw.url, headers=hdrs(mine, **bob, **SSE, **{"last-event-id": alices_id}))
                ).status_code == 404
        other = await initialize(http, gw.url, **alice)  # Alice's second session has no such stream
        for forged in (alices_id, "s-999:1", f"{alices_id.split(':')[0]}:99999", "g-1:0"):
            for session, auth in ((other, alice), (theirs, bob)):
                response = await http.get(gw.url, headers=hdrs(session, **auth, **SSE, **{"last-event-id": forged}))
                if (session, forged) == (theirs, alices_id):
                    continue  # Bob's own stream, replayed above
                assert response.status_code == 400, (forged, response.text)
                assert "names no stream of this session" in response.json()["error"]["message"]

        resumed = await http.get(gw.url, headers=hdrs(mine, **alice, **SSE, **{"last-event-id": alices_id}))
        assert _progress_tokens(resumed.text) == ["alice", "alice", "alice"]
        assert _messages(resumed.text)[-1]["id"] == 1 and "bob" not in resumed.text


async def test_malformed_or_huge_last_event_ids_are_4xx_never_500(conformance_backend) -> None:
    """The header is the client's: a sequence number too long for `int()` (over 4,300 digits)
    or made of non-ASCII digits ("²" is `isdigit()`) used to escape as a 500."""
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}]}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url)
        primed = await _start_and_drop(http, gw.url, session, {}, "p")
        stream = primed.split(":")[0]
        values: list[str | bytes] = [
            f"{stream}:" + "9" * 5000, f"{stream}:1" + "0" * 40, f"{stream}:".encode() + b"\xb2",
            f"{stream}:\xb9".encode("latin-1"), "", ":", "::", f"{stream}:", f"{stream}:-1", f"{stream}:1.0",
            f"{stream}:+1", f"{stream}:1_0", f"{stream}: 1x", "x" * 60_000, f"{'s' * 30_000}:{'1' * 30_000}",
        ]
        for value in values:
            response = await http.get(gw.url, headers={**hdrs(session, **SSE), "last-event-id": value})
            assert response.status_code == 400, (value[:40], response.status_code, response.text[:200])
            assert response.json()["error"]["code"] == -32600
            assert len(response.content) < 2_000  # the echoed value is bounded
        too_large = await http.get(gw.url, headers={**hdrs(session, **SSE), "last-event-id": "x" * 70_000})
        assert too_large.status_code == 431
        # None of it cost the session anything; its stream still resumes.
        resumed = await http.get(gw.url, headers=hdrs(session, **SSE, **{"last-event-id": primed}))
        assert resumed.status_code == 200 and _progress_tokens(resumed.text) == ["p", "p", "p"]


# -- the HTTP+SSE (2024-11-05) front ----------------------------------------------------------


async def _until(client: RawSseClient, done: Any, seen: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`seen` plus the messages off `client`'s stream until `done(seen)` holds."""
    seen = [] if seen is None else seen
    while not done(seen):
        seen.append(await client.next_message())
    return seen


def _asked(seen: list[dict[str, Any]]) -> bool:
    return any(m.get("method") == "elicitation/create" for m in seen)


def _answered(*ids: Any) -> Any:
    return lambda seen: {m.get("id") for m in seen if "method" not in m} >= set(ids)


async def test_http_sse_streams_and_their_endpoints_are_their_principals_alone(
        conformance_backend, issuer, jwks_url) -> None:
    """Alice and Bob each hold a 2024-11-05 stream. Bob posting to Alice's endpoint gets the
    404 of an unknown one. Both run the same calls with the same ids and progress token at
    once; each stream carries its own answers and nothing else. Bob answering the elicitation
    Alice was sent (same gateway id) answers nothing: it is refused on his own stream and
    Alice's call waits for her."""
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    async with (running_gateway(jwt_settings(conformance_backend.url, jwks_url)) as gw,
                httpx.AsyncClient(timeout=10) as http,
                RawSseClient(http, sse_url(gw), alice) as a, RawSseClient(http, sse_url(gw), bob) as b):
        assert a.endpoint != b.endpoint
        unknown = a.endpoint.split("?")[0] + "?session_id=" + secrets.token_urlsafe(24)
        hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        stolen = await http.post(a.endpoint, json=hello, headers=bob)
        assert refusal(stolen) == refusal(await http.post(unknown, json=hello, headers=bob))
        assert stolen.status_code == 404
        assert (await http.post(a.endpoint, json=hello)).status_code == 401
        for client in (a, b):
            await client.initialize("2025-06-18", {"elicitation": {}})
            for message in ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                                "name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": "t"}}},
                            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                                "name": "test_elicitation", "arguments": {"message": "Who are you?"}}}):
                assert (await client.post(message)).status_code == 202
        a_seen, b_seen = await _until(a, _asked), await _until(b, _asked)
        (asked,) = {m["id"] for m in a_seen if m.get("method") == "elicitation/create"}
        assert {m["id"] for m in b_seen if m.get("method") == "elicitation/create"} == {asked}  # same id
        # Bob's answer POSTed to Alice's endpoint: 404. On his own endpoint the same id answers
        # his own question (ids are per session), never hers; a second time it answers nothing
        # (refused on his stream). Alice's call waits for her answer throughout.
        assert (await http.post(a.endpoint, content=answer(asked, "bob"), headers=bob)).status_code == 404
        assert (await b.post(answer(asked, "bob"))).status_code == 202
        await _until(b, _answered(1, 2), b_seen)
        assert (await b.post(answer(asked, "bob"))).status_code == 202  # once more: nothing waits
        refused = await b.next_message()
        assert refused["error"]["code"] == -32600 and "no request with id" in refused["error"]["message"]
        assert (await a.post(answer(asked, "alice"))).status_code == 202
        await _until(a, _answered(1, 2), a_seen)
        for seen, name in ((a_seen, "alice"), (b_seen, "bob")):
            progress = [m["params"]["progress"] for m in seen if m.get("method") == "notifications/progress"]
            assert progress == [0, 50, 100], name  # its own three, not the other's
            answers = {m["id"]: m for m in seen if "id" in m and "method" not in m}
            assert set(answers) == {1, 2}
            assert f'"username": "{name}"' in answers[2]["result"]["content"][0]["text"]
            stranger = {"alice": "bob", "bob": "alice"}[name]
            assert not any(stranger in json.dumps(m) for m in seen), seen


class _Watched(dict):
    """The front's table of streams, telling the test when a POST has looked its stream up."""

    def __init__(self, table: dict[str, Any]) -> None:
        super().__init__(table)
        self.looked_up = asyncio.Event()

    def get(self, key: Any, default: Any = None) -> Any:
        self.looked_up.set()
        return super().get(key, default)


async def test_a_post_whose_stream_closed_while_its_body_was_in_flight_is_404(conformance_backend) -> None:
    """The POST found its stream, then the stream closed before the body was in: it gets the
    404 of a closed stream, and its `initialize` starts no session (it used to be accepted
    with 202 and make a session no stream would ever end)."""
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}]}
    body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "late", "version": "0"}}}).encode()
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        front, sessions = gw.app.sse_front, gw.app.legacy_clients.sessions
        front._connections = watched = _Watched(front._connections)
        released = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield body[:10]
            await released.wait()
            yield body[10:]

        async with RawSseClient(http, sse_url(gw)) as client:
            watched.looked_up.clear()
            posting = asyncio.ensure_future(http.post(client.endpoint, content=slow_body(),
                                                      headers={"content-type": "application/json"}))
            await asyncio.wait_for(watched.looked_up.wait(), 10)
        await eventually(lambda: not front._connections)  # the stream is gone
        released.set()
        late = await posting
        assert late.status_code == 404 and "Unknown session_id" in late.json()["error"]["message"]
        assert len(sessions) == 0


# -- requests the gateway parks on a client ---------------------------------------------------


async def test_a_parked_request_is_answered_only_from_its_own_session(conformance_backend, issuer, jwks_url) -> None:
    """Alice's call waits on the elicitation the gateway sent her. Bob (with her session id:
    404; with his own session: 400), and Alice's own second session (400), cannot answer it
    or cancel her call; her answer completes it, with her content."""
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    caps = {"elicitation": {}}
    async with (running_gateway(jwt_settings(conformance_backend.url, jwks_url)) as gw,
                httpx.AsyncClient(timeout=10) as http):
        mine = await initialize(http, gw.url, capabilities=caps, **alice)
        second = await initialize(http, gw.url, capabilities=caps, **alice)
        theirs = await initialize(http, gw.url, capabilities=caps, **bob)
        body = rpc("tools/call", {"name": "test_elicitation", "arguments": {"message": "Who are you?"}}, id=7)
        messages: list[dict[str, Any]] = []
        async with http.stream("POST", gw.url, content=body, headers=hdrs(mine, **alice)) as response:
            async for _, data in sse_events(response):
                if not data:
                    continue
                messages.append(json.loads(data))
                if messages[-1].get("method") != "elicitation/create":
                    continue
                asked = messages[-1]["id"]
                cancel = rpc("notifications/cancelled", {"requestId": 7, "reason": "not yours"}, id=None)
                attempts = [
                    (await http.post(gw.url, content=answer(asked, "bob"), headers=hdrs(mine, **bob))).status_code,
                    (await http.post(gw.url, content=cancel, headers=hdrs(mine, **bob))).status_code,
                    (await http.post(gw.url, content=answer(asked, "bob"), headers=hdrs(theirs, **bob))).status_code,
                    (await http.post(gw.url, content=cancel, headers=hdrs(theirs, **bob))).status_code,
                    (await http.post(gw.url, content=answer(asked, "eve"), headers=hdrs(second, **alice))).status_code,
                    (await http.post(gw.url, content=cancel, headers=hdrs(second, **alice))).status_code,
                ]
                # 404: not Bob's session. 400: nothing of that id waits in that session. 202: a
                # cancellation naming nothing in flight there is ignored (L-CAN).
                assert attempts == [404, 404, 400, 202, 400, 202]
                live = gw.app.legacy_clients.sessions.get(mine, principal("alice"))
                assert live is not None and list(live.pending) == [asked] and list(live.in_flight) == [7]
                answered = await http.post(gw.url, content=answer(asked, "alice"), headers=hdrs(mine, **alice))
                assert answered.status_code == 202
        assert [m.get("method") for m in messages] == ["elicitation/create", None]
        assert messages[-1]["id"] == 7
        assert messages[-1]["result"]["content"][0]["text"] == (
            'User response: action=accept, content={"email": "alice@example.com", "username": "alice"}')


async def test_concurrent_sdk_clients_of_two_principals_get_only_their_own_requests(
        conformance_backend, issuer, jwks_url) -> None:
    """Two official SDK clients in legacy mode, Alice's and Bob's, each with the same request
    ids, progress tokens and gateway request ids: both elicitations are outstanding at once,
    and each callback is asked only its own question and each call gets only its own answer."""
    both_asked = asyncio.Barrier(2)

    def client(token: str, name: str, asked: list[str], progress: list[float]) -> Any:
        async def elicit(context: Any, params: Any) -> types.ElicitResult:
            asked.append(params.message)
            await asyncio.wait_for(both_asked.wait(), 10)  # the other's question is parked too
            return types.ElicitResult(action="accept", content={"username": name, "email": f"{name}@example.com"})

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async def run(url: str) -> tuple[str, str]:
            async with (httpx2.AsyncClient(headers=bearer(token)) as http,
                        Client(streamable_http_client(url, http_client=http), mode="legacy",
                               elicitation_callback=elicit) as session):
                counted = await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
                result = await session.call_tool("test_elicitation", {"message": f"Who are you, {name}?"})
                return counted.content[0].text, result.content[0].text

        return run

    asked: dict[str, list[str]] = {"alice": [], "bob": []}
    progress: dict[str, list[float]] = {"alice": [], "bob": []}
    async with running_gateway(jwt_settings(conformance_backend.url, jwks_url)) as gw:
        results = await asyncio.gather(*(client(issuer.token(name), name, asked[name], progress[name])(gw.url)
                                         for name in ("alice", "bob")))
    for name, (_, elicited) in zip(("alice", "bob"), results, strict=True):
        assert asked[name] == [f"Who are you, {name}?"]
        assert progress[name] == [0, 50, 100]
        assert elicited == (f'User response: action=accept, content={{"email": "{name}@example.com", '
                            f'"username": "{name}"}}')


# -- subscriptions ----------------------------------------------------------------------------


def _listening(gw: RunningGateway, sub: str) -> list[set[str]]:
    """For each acknowledged listen the hub holds for `sub` (one per session with a
    listener), the resource URIs it is granted: what the hub will deliver to that session."""
    return sorted((set().union(*(wants.uris for wants in client._granted.values()))
                   for client in gw.runtime.dispatcher.hub._clients
                   if client.principal == principal(sub) and client.streams
                   and all(stream.acked is not None for stream in client.streams)), key=sorted)


async def test_resource_updates_reach_only_the_sessions_that_subscribed(mutable_backend, issuer, jwks_url) -> None:
    """Alice subscribes to mutable://a, Bob to mutable://b, Alice's second session to nothing.
    Each update reaches its subscriber only; Bob subscribing to and then unsubscribing from
    Alice's URI, Bob unsubscribing with her session id (404) and her other session
    unsubscribing cancel nothing of hers.

    No waiting for silence: each update is awaited at its subscriber, then a list change every
    session hears is published. The hub offers an update to every session it is granted to
    at once, and each session's notifications keep their order, so anything delivered where
    it must not be would arrive before that marker."""
    settings = jwt_settings(mutable_backend.url, jwks_url)
    settings["subscriptions"] = {"linger_seconds": 0}
    control = f"http://127.0.0.1:{mutable_backend.port}"
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=20) as http:

        async def request(session: str, auth: dict[str, str], method: str, uri: str) -> httpx.Response:
            return await http.post(gw.url, content=rpc(method, {"uri": uri}, id=method), headers=hdrs(session, **auth))

        mine, other = await initialize(http, gw.url, **alice), await initialize(http, gw.url, **alice)
        theirs = await initialize(http, gw.url, **bob)
        for session, auth, uri in ((mine, alice, "mutable://a"), (theirs, bob, "mutable://b")):
            assert (await request(session, auth, "resources/subscribe", uri)).json()["result"] == {}
        async with (http.stream("GET", gw.url, headers=hdrs(mine, **alice, **SSE)) as a_stream,
                    http.stream("GET", gw.url, headers=hdrs(other, **alice, **SSE)) as o_stream,
                    http.stream("GET", gw.url, headers=hdrs(theirs, **bob, **SSE)) as b_stream):
            notes = {"mine": _notes(a_stream), "other": _notes(o_stream), "theirs": _notes(b_stream)}

            async def next_note(name: str) -> dict[str, Any]:
                return await asyncio.wait_for(anext(notes[name]), 20)

            async def touch(uri: str, subscriber: str) -> None:
                await http.post(f"{control}/touch", params={"uri": uri})
                assert await next_note(subscriber) == _updated(uri)

            async def nothing_else_before_the_marker() -> None:
                await http.post(f"{control}/change/tools")
                for name in notes:
                    assert (await next_note(name))["method"] == "notifications/tools/list_changed", name

            await eventually(lambda: _listening(gw, "alice") == [set(), {"mutable://a"}]
                             and _listening(gw, "bob") == [{"mutable://b"}])
            await touch("mutable://b", "theirs")
            await touch("mutable://a", "mine")
            await nothing_else_before_the_marker()

            # Unsubscribing anywhere but in Alice's session cancels nothing of hers.
            assert (await request(theirs, bob, "resources/subscribe", "mutable://a")).json()["result"] == {}
            await eventually(lambda: _listening(gw, "bob") == [{"mutable://a", "mutable://b"}])
            assert (await request(theirs, bob, "resources/unsubscribe", "mutable://a")).json()["result"] == {}
            assert (await request(mine, bob, "resources/unsubscribe", "mutable://a")).status_code == 404
            assert (await request(other, alice, "resources/unsubscribe", "mutable://a")).json()["result"] == {}
            await eventually(lambda: _listening(gw, "bob") == [{"mutable://b"}])
            assert _listening(gw, "alice") == [set(), {"mutable://a"}]
            await touch("mutable://a", "mine")
            await nothing_else_before_the_marker()


def _updated(uri: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}


async def _notes(stream: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for _, data in sse_events(stream):
        if data:
            yield json.loads(data)


# -- limits: a principal's share ---------------------------------------------------------------


async def test_a_principals_flood_of_sessions_ends_only_its_own(conformance_backend, issuer, jwks_url) -> None:
    """`legacy_max_sessions: 6`: an authenticated principal holds at most 3 (half, at most
    MAX_SESSIONS_PER_PRINCIPAL). Alice opening 8 ends her own oldest five; Bob's session, the
    least recently used of the store, lives (it used to be the first evicted)."""
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    settings = jwt_settings(conformance_backend.url, jwks_url, legacy_max_sessions=6)
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        assert gw.app.legacy_clients.sessions.max_per_principal == 3 <= MAX_SESSIONS_PER_PRINCIPAL
        theirs = await initialize(http, gw.url, **bob)
        flood = [await initialize(http, gw.url, **alice) for _ in range(8)]

        async def status(session: str, auth: dict[str, str]) -> int:
            return (await http.post(gw.url, content=rpc("ping"), headers=hdrs(session, **auth))).status_code

        assert await status(theirs, bob) == 200
        assert [await status(s, alice) for s in flood] == [404] * 5 + [200] * 3
        assert len(gw.app.legacy_clients.sessions) == 4
        # The store's own bound still holds: Bob fills his share, Alice hers, nobody more.
        more = [await initialize(http, gw.url, **bob) for _ in range(3)]
        assert [await status(s, bob) for s in (theirs, *more)] == [404, 200, 200, 200]
        assert len(gw.app.legacy_clients.sessions) == 6


async def test_without_authentication_the_store_is_one_lru(conformance_backend) -> None:
    """auth mode none: no principal is counted (credential-less callers share one key, and a
    caller is whoever its Authorization header hashes to), so the least recently used session
    of anyone makes room, as docs/legacy-clients.md says."""
    config = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
              "server": {"legacy_max_sessions": 4}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=10) as http:
        anonymous = [await initialize(http, gw.url) for _ in range(4)]  # more than "half" of one key
        statuses = [(await http.post(gw.url, content=rpc("ping"), headers=hdrs(s))).status_code for s in anonymous]
        assert statuses == [200] * 4
        flood = [await initialize(http, gw.url, authorization=f"Bearer {n}") for n in range(3)]
        statuses = [(await http.post(gw.url, content=rpc("ping"), headers=hdrs(s))).status_code for s in anonymous]
        assert statuses == [404, 404, 404, 200]  # pinged in order: the last one pinged was used last
        assert len(gw.app.legacy_clients.sessions) == 4 and len(flood) == 3


async def test_a_principals_flood_of_http_sse_streams_leaves_room_for_others(
        conformance_backend, issuer, jwks_url) -> None:
    """`legacy_max_sessions: 4` streams: Alice may hold 2; her third is 429 (-31004), and Bob
    still gets his (he used to get the 503 of a full gateway)."""
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    settings = jwt_settings(conformance_backend.url, jwks_url, legacy_max_sessions=4)
    async with (running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http,
                RawSseClient(http, sse_url(gw), alice), RawSseClient(http, sse_url(gw), alice)):
        async with http.stream("GET", sse_url(gw), headers={**SSE, **alice}) as third:
            assert third.status_code == 429  # (a 200 would be a stream: not read any further)
            refused = json.loads(await third.aread())
        assert refused["error"]["code"] == -31004 and refused["error"]["data"]["max"] == 2
        async with RawSseClient(http, sse_url(gw), bob) as b:
            await b.initialize()
            assert (await b.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status_code == 202
            assert await b.next_message() == {"jsonrpc": "2.0", "id": 1, "result": {}}
