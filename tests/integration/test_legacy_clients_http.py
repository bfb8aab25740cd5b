"""The legacy session contract on the wire (L-TR §Session Management, §Resumability; digest
§h.2, §h.9), byte by byte with raw HTTP against the gateway in front of a real backend."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.support.gateway import running_gateway
from tests.support.mcp_http import sse_messages

LEGACY = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@pytest.fixture
def settings(conformance_backend):
    return {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}]}


def rpc(method: str, params: dict[str, Any] | None = None, id: Any = 1) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        msg["id"] = id
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode()


def hdrs(session: str | None = None, **extra: str) -> dict[str, str]:
    h = {"content-type": "application/json", "accept": ACCEPT, "mcp-protocol-version": LEGACY}
    if session is not None:
        h["mcp-session-id"] = session
    h.update(extra)
    return h


async def initialize(
    http: httpx.AsyncClient,
    url: str,
    *,
    capabilities: dict[str, Any] | None = None,
    version: str = LEGACY,
    **extra: str,
) -> str:
    response = await http.post(
        url,
        content=rpc(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": capabilities or {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        ),
        headers={"content-type": "application/json", "accept": ACCEPT, **extra},
    )
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    agreed = response.json()["result"]["protocolVersion"]
    ack = await http.post(
        url,
        content=rpc("notifications/initialized", id=None),
        headers=hdrs(session, **{"mcp-protocol-version": agreed, **extra}),
    )
    assert ack.status_code == 202
    return session


async def sse_events(response: httpx.Response):
    """(id, data) of each SSE event of a streamed response, as they arrive."""
    event_id, data = None, []
    async for line in response.aiter_lines():
        if line == "":
            if event_id is not None or data:
                yield event_id, "\n".join(data)
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


async def test_initialize_mints_a_visible_ascii_session_id_and_negotiates(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        ids = set()
        for asked, agreed in (
            ("2025-06-18", "2025-06-18"),
            ("2025-03-26", "2025-03-26"),
            ("2024-11-05", LEGACY),
            ("2099-01-01", LEGACY),
        ):
            response = await http.post(
                gw.url,
                content=rpc(
                    "initialize",
                    {
                        "protocolVersion": asked,
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"},
                    },
                ),
                headers={"content-type": "application/json", "accept": ACCEPT},
            )
            assert response.status_code == 200
            assert response.json()["result"]["protocolVersion"] == agreed
            session = response.headers["mcp-session-id"]
            assert len(session) >= 32 and all(0x21 <= ord(c) <= 0x7E for c in session)
            ids.add(session)
        assert len(ids) == 4


async def test_requests_without_a_session_get_400_and_unknown_sessions_get_404(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        missing = await http.post(gw.url, content=rpc("tools/list"), headers=hdrs())
        assert missing.status_code == 400
        assert "Mcp-Session-Id header is required" in missing.json()["error"]["message"]
        unknown = await http.post(gw.url, content=rpc("tools/list"), headers=hdrs("not-a-session"))
        assert unknown.status_code == 404
        assert "Session not found" in unknown.json()["error"]["message"]


async def test_delete_ends_the_session(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        session = await initialize(http, gw.url)
        listed = await http.post(gw.url, content=rpc("tools/list"), headers=hdrs(session))
        assert listed.status_code == 200 and listed.json()["result"]["tools"]
        assert "resultType" not in listed.json()["result"] and "ttlMs" not in listed.json()["result"]
        deleted = await http.delete(gw.url, headers=hdrs(session))
        assert deleted.status_code == 200
        after = await http.post(gw.url, content=rpc("tools/list", id=2), headers=hdrs(session))
        assert after.status_code == 404
        assert (await http.delete(gw.url, headers=hdrs(session))).status_code == 404


async def test_a_session_is_bound_to_the_principal_that_created_it(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        session = await initialize(http, gw.url, authorization="Bearer alice")
        mine = await http.post(
            gw.url, content=rpc("ping"), headers=hdrs(session, authorization="Bearer alice")
        )
        assert mine.status_code == 200 and mine.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        theirs = await http.post(
            gw.url, content=rpc("ping"), headers=hdrs(session, authorization="Bearer mallory")
        )
        assert theirs.status_code == 404


async def test_version_header_must_match_the_negotiated_version(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        session = await initialize(http, gw.url)
        wrong = await http.post(
            gw.url, content=rpc("ping"), headers=hdrs(session, **{"mcp-protocol-version": "2025-06-18"})
        )
        assert wrong.status_code == 400 and "negotiated" in wrong.json()["error"]["message"]
        bogus = await http.post(
            gw.url, content=rpc("ping"), headers=hdrs(session, **{"mcp-protocol-version": "1.0"})
        )
        assert bogus.status_code == 400
        # 2025-03-26 clients send no version header at all (L-TR: assume 2025-03-26).
        old = await initialize(http, gw.url, version="2025-03-26")
        no_header = {"content-type": "application/json", "accept": ACCEPT, "mcp-session-id": old}
        assert (await http.post(gw.url, content=rpc("ping"), headers=no_header)).status_code == 200


async def test_unknown_log_level_and_legacy_only_methods(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        session = await initialize(http, gw.url)
        bad = await http.post(
            gw.url, content=rpc("logging/setLevel", {"level": "loud"}), headers=hdrs(session)
        )
        assert bad.json()["error"]["code"] == -32602
        modern_only = await http.post(gw.url, content=rpc("server/discover"), headers=hdrs(session))
        assert modern_only.json()["error"]["code"] == -32601
        unknown_resource = await http.post(
            gw.url,
            content=rpc("resources/read", {"uri": "test://nope"}),
            headers=hdrs(session, accept="application/json"),
        )
        assert unknown_resource.json()["error"]["code"] == -32602


async def test_modern_requests_are_untouched_by_the_legacy_seam(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        # A modern request with a stray Mcp-Session-Id is still modern (the header is ignored).
        modern = await http.post(
            gw.url,
            content=json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/list",
                    "params": {
                        "_meta": {
                            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                            "io.modelcontextprotocol/clientCapabilities": {},
                        }
                    },
                }
            ),
            headers={
                "content-type": "application/json",
                "accept": ACCEPT,
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/list",
                "mcp-session-id": "whatever",
            },
        )
        assert modern.status_code == 200 and modern.json()["result"]["resultType"] == "complete"
        # Without a session header, a GET is the modern 405.
        assert (await http.get(gw.url, headers={"accept": "text/event-stream"})).status_code == 405


async def test_legacy_clients_can_be_switched_off(conformance_backend):
    settings = {
        "server": {"legacy_clients": False},
        "backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
    }
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        response = await http.post(
            gw.url,
            content=rpc(
                "initialize",
                {
                    "protocolVersion": LEGACY,
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            ),
            headers={"content-type": "application/json", "accept": ACCEPT},
        )
        assert response.status_code == 400
        assert "mcp-session-id" not in response.headers


async def test_a_dropped_stream_is_resumed_with_last_event_id(settings):
    """The work outlives the connection (L-TR: disconnection is not cancellation); a GET with
    the last event id replays the rest of that stream, final response included."""
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url)
        body = rpc(
            "tools/call",
            {"name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": "p"}},
        )
        async with http.stream("POST", gw.url, content=body, headers=hdrs(session)) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for event_id, data in sse_events(response):
                primed = event_id
                assert data == ""  # the priming event: an id and empty data
                break
        resumed = await http.get(gw.url, headers=hdrs(session, **{"last-event-id": primed}))
        assert resumed.status_code == 200
        messages = sse_messages(resumed.text)
        progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
        assert [(p["progressToken"], p["progress"]) for p in progress] == [("p", 0), ("p", 50), ("p", 100)]
        assert messages[-1]["id"] == 1 and messages[-1]["result"]["content"][0]["type"] == "text"
        foreign = await http.get(gw.url, headers=hdrs(session, **{"last-event-id": "s-999:1"}))
        assert foreign.status_code == 400


async def test_cancelled_notification_stops_a_call_waiting_for_input(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url, capabilities={"elicitation": {}})
        body = rpc("tools/call", {"name": "test_elicitation", "arguments": {"message": "Name?"}}, id=7)
        async with http.stream("POST", gw.url, content=body, headers=hdrs(session)) as response:
            messages = []
            async for _, data in sse_events(response):
                if data:
                    messages.append(json.loads(data))
                    if messages[-1].get("method") == "elicitation/create":
                        asked = messages[-1]
                        cancel = await http.post(
                            gw.url,
                            content=rpc(
                                "notifications/cancelled", {"requestId": 7, "reason": "user gave up"}, id=None
                            ),
                            headers=hdrs(session),
                        )
                        assert cancel.status_code == 202
        # The stream ended without a response for the cancelled request (L-CAN).
        assert [m.get("method") for m in messages] == ["elicitation/create"]
        assert asked["params"]["message"] == "Name?"
        late = await http.post(
            gw.url,
            content=json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": asked["id"],
                    "result": {"action": "accept", "content": {"username": "a", "email": "b"}},
                }
            ),
            headers=hdrs(session),
        )
        assert late.status_code == 400 and "waiting" in late.json()["error"]["message"]


async def test_input_needs_a_stream(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url, capabilities={"elicitation": {}})
        response = await http.post(
            gw.url,
            content=rpc("tools/call", {"name": "test_elicitation", "arguments": {"message": "Name?"}}),
            headers=hdrs(session, accept="application/json"),
        )
        assert response.status_code == 200
        assert "text/event-stream" in response.json()["error"]["message"]


async def test_get_stream_without_a_hub_is_405(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        gw.runtime.dispatcher.hub = None  # a fleet without the hub: nothing could feed a GET stream
        session = await initialize(http, gw.url)
        response = await http.get(gw.url, headers=hdrs(session, accept="text/event-stream"))
        assert response.status_code == 405
        init = await http.post(
            gw.url,
            content=rpc("initialize", {"protocolVersion": LEGACY, "capabilities": {}}),
            headers={"content-type": "application/json", "accept": ACCEPT},
        )
        assert "subscribe" not in init.json()["result"]["capabilities"]["resources"]


async def test_get_stream_delivers_list_changes_and_subscriptions(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        assert gw.runtime.dispatcher.hub is not None
        session = await initialize(http, gw.url)
        subscribed = await http.post(
            gw.url,
            content=rpc("resources/subscribe", {"uri": "test://watched-resource"}),
            headers=hdrs(session),
        )
        assert subscribed.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        async with http.stream("GET", gw.url, headers=hdrs(session, accept="text/event-stream")) as stream:
            assert stream.status_code == 200
            events = sse_events(stream)
            primed_id, primed = await anext(events)
            assert primed == "" and primed_id
            # Toggle the fixture's dynamic tool twice (add, remove) so it ends as it began.
            for attempt in range(2):
                await _trigger_tool_change(http, gw.url, session, attempt)
                while True:
                    _, data = await asyncio.wait_for(anext(events), 10)
                    if data:
                        note = json.loads(data)
                        break
                assert note["method"] == "notifications/tools/list_changed"
                assert "_meta" not in note.get("params", {})  # no modern subscription id


async def _trigger_tool_change(http: httpx.AsyncClient, url: str, session: str, attempt: int) -> None:
    response = await http.post(
        url,
        content=rpc("tools/call", {"name": "test_trigger_tool_change", "arguments": {}}, id=100 + attempt),
        headers=hdrs(session, accept="application/json"),
    )
    assert response.json()["result"]["content"][0]["text"] == "tool list changed"


async def test_ids_that_are_not_strings_or_integers_are_invalid_requests(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient() as http:
        session = await initialize(http, gw.url)
        for bad in ({"x": 1}, [1], None, True):
            body = json.dumps({"jsonrpc": "2.0", "id": bad, "method": "tools/list", "params": {}}).encode()
            response = await http.post(gw.url, content=body, headers=hdrs(session))
            assert response.status_code == 400, (bad, response.text)
            assert response.json()["error"]["code"] == -32600
        # A cancellation naming an unhashable request id is ignored, not a crash.
        cancel = await http.post(gw.url, content=rpc("notifications/cancelled", {"requestId": [1]}, id=None),
                                 headers=hdrs(session))
        assert cancel.status_code == 202
        ok = await http.post(gw.url, content=rpc("tools/list", {}, id=7), headers=hdrs(session))
        assert ok.status_code == 200


async def test_malformed_posts_are_refused_and_the_session_survives(settings):
    """Each refusal has the status and code the transport names (400 -32700 for a body that
    is not JSON, 400 -32600 for one that is no single JSON-RPC 2.0 message; 2025-06-18 removed
    batches), and none of them costs the session anything."""
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url)
        refusals = {
            b"{not json": (400, -32700),
            b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]': (400, -32600),
            b'{"jsonrpc":"1.0","id":1,"method":"ping"}': (400, -32600),
            b'"ping"': (400, -32600),
        }
        for body, (status, code) in refusals.items():
            response = await http.post(gw.url, content=body, headers=hdrs(session))
            assert (response.status_code, response.json()["error"]["code"]) == (status, code), body
        assert "batches" in (await http.post(gw.url, content=b"[]", headers=hdrs(session))).json()["error"]["message"]
        ping = await http.post(gw.url, content=rpc("ping", id=9), headers=hdrs(session))
        assert ping.status_code == 200 and ping.json() == {"jsonrpc": "2.0", "id": 9, "result": {}}


async def test_malformed_initialize_and_subscribe_params(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        no_id = await http.post(gw.url, content=rpc("initialize", {"protocolVersion": LEGACY, "capabilities": {}},
                                                     id=None), headers={"content-type": "application/json",
                                                                        "accept": ACCEPT})
        assert no_id.status_code == 400 and no_id.json()["error"]["code"] == -32600
        assert "mcp-session-id" not in no_id.headers
        bad_caps = await http.post(gw.url, content=rpc("initialize", {"protocolVersion": LEGACY, "capabilities": []}),
                                   headers={"content-type": "application/json", "accept": ACCEPT})
        assert bad_caps.status_code == 400 and bad_caps.json()["error"]["code"] == -32602
        assert '"params.capabilities" must be an object' in bad_caps.json()["error"]["message"]
        session = await initialize(http, gw.url)
        # Inside a session a JSON-RPC error is an answer like any other: HTTP 200.
        no_uri = await http.post(gw.url, content=rpc("resources/subscribe", {}), headers=hdrs(session))
        assert no_uri.status_code == 200 and no_uri.json()["error"]["code"] == -32602


async def test_get_streams_need_event_stream_accept_and_a_new_one_replaces_the_old(settings):
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url)
        refused = await http.get(gw.url, headers=hdrs(session, accept="application/json"))
        assert refused.status_code == 406 and refused.json()["error"]["code"] == -32600
        unknown = await http.get(gw.url, headers=hdrs(session, accept="text/event-stream", **{"last-event-id": "x"}))
        assert unknown.status_code == 400 and "Last-Event-ID" in unknown.json()["error"]["message"]
        async with http.stream("GET", gw.url, headers=hdrs(session, accept="text/event-stream")) as first:
            assert first.status_code == 200
            first_events = sse_events(first)
            assert (await anext(first_events))[1] == ""  # primed
            async with http.stream("GET", gw.url, headers=hdrs(session, accept="text/event-stream")) as second:
                # L-TR §Multiple Connections: a message goes to one stream, so the new GET
                # replaces the old one, which ends.
                assert second.status_code == 200
                second_events = sse_events(second)
                with pytest.raises(StopAsyncIteration):
                    await asyncio.wait_for(anext(first_events), 5)
                await _trigger_tool_change(http, gw.url, session, 0)
                await _trigger_tool_change(http, gw.url, session, 1)
                _, data = await asyncio.wait_for(anext(second_events), 10)
                assert json.loads(data)["method"] == "notifications/tools/list_changed"


async def test_a_get_stream_reopened_after_the_previous_one_died_is_answered_at_once(conformance_backend):
    """The response head goes out with the first body bytes: a re-opened stream with nothing
    new used to be answered only at the next keep-alive (15 s by default). With a keep-alive
    far longer than the wait, each re-opened stream must still start at once."""
    settings = {"backends": [{"name": "conf", "url": conformance_backend.url, "era": "modern"}],
                "server": {"keepalive_seconds": 60}}
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=30) as http:
        session = await initialize(http, gw.url)
        for _ in range(3):  # the first opening, then two re-openings after the previous one died
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with http.stream("GET", gw.url, headers=hdrs(session, accept="text/event-stream")) as stream:
                assert stream.status_code == 200
                # The first opening starts with the priming event, a re-opening with a comment.
                first_line = await asyncio.wait_for(anext(stream.aiter_lines()), 5)
                assert first_line.startswith("id: ") or first_line.startswith(":"), first_line
            assert loop.time() - started < 5


async def test_a_session_cannot_pile_up_work_it_walked_away_from(settings):
    """A dropped stream does not cancel its request (L-TR), so each POST could leave work
    behind: a task, a backend call, an input request parked for up to the input timeout. A
    session has at most MAX_IN_FLIGHT_PER_SESSION of them, and a request id still in flight
    cannot be reused to start more untracked (L-BASIC: ids are unique within a session)."""
    from gateway.legacy_clients.server import MAX_IN_FLIGHT_PER_SESSION

    body = lambda i: rpc("tools/call", {"name": "test_elicitation", "arguments": {"message": "Name?"}}, id=i)  # noqa: E731

    async def walk_away(http: httpx.AsyncClient, url: str, session: str, i: int) -> dict[str, Any] | None:
        async with http.stream("POST", url, content=body(i), headers=hdrs(session)) as response:
            if not response.headers["content-type"].startswith("text/event-stream"):
                return json.loads(await response.aread())
            async for _, data in sse_events(response):
                if data and json.loads(data).get("method") == "elicitation/create":
                    return None  # the work now waits for an answer that never comes
        raise AssertionError("the stream ended without asking")

    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session = await initialize(http, gw.url, capabilities={"elicitation": {}})
        live = gw.app.legacy_clients.sessions.get(session, "|anonymous")
        for i in range(MAX_IN_FLIGHT_PER_SESSION):
            assert await walk_away(http, gw.url, session, i) is None
        assert len(live.in_flight) == MAX_IN_FLIGHT_PER_SESSION
        refused = await walk_away(http, gw.url, session, MAX_IN_FLIGHT_PER_SESSION)
        assert refused is not None and refused["error"]["code"] == -31004
        assert refused["id"] == MAX_IN_FLIGHT_PER_SESSION
        # Ending one makes room; reusing the id of one still waiting does not.
        cancel = await http.post(gw.url, content=rpc("notifications/cancelled", {"requestId": 0}, id=None),
                                 headers=hdrs(session))
        assert cancel.status_code == 202
        reused = await walk_away(http, gw.url, session, 1)
        assert reused is not None and reused["error"]["code"] == -32600 and "in flight" in reused["error"]["message"]
        assert await walk_away(http, gw.url, session, 0) is None
        assert len(live.in_flight) == MAX_IN_FLIGHT_PER_SESSION
