"""Initialize-era clients that misbehave, walk away, cancel, resume or hit a limit, through the
real gateway (tests/support/gateway.py) to real backends: what the client sees, and that its
session and everything else keep working with nothing left behind (in-flight requests,
requests waiting for the client's answer, streams, sessions).

- A JSON-answered call whose client disconnects is cancelled upstream; one cancelled with
  `notifications/cancelled` gets 202 and no response (L-CAN), and the backend sees it go.
- A client that never answers the gateway's input requests gets `notifications/cancelled` for
  each one still unanswered, and an error, after `legacy_input_timeout_seconds`; an answer
  sent twice (the first counts) or with neither `result` nor `error` (400 -32600) does not
  disturb the round; a backend that keeps asking is given up after MAX_INPUT_ROUNDS; input
  requests a backend garbles end the call with -32603 before anything reaches the client.
- Streams: resuming one that is still being read is 409 (L-TR §Resumability: one reader); a
  notification stream reopened without `Last-Event-ID` goes on where the client left it; a
  quiet one gets keep-alive comments; a session whose listen is refused at
  `subscriptions.max_listens_per_principal` keeps working and listens once there is room;
  subscribing twice is one subscription, `resources/unsubscribe` reaches the backend, and a
  subscription the gateway did not offer is -32601.
- The HTTP+SSE (2024-11-05) front: a client that stops reading is cut once 1,000 messages wait
  for it, and its session ends; a shutdown cuts such a stream at once too; a second `initialize` on one stream replaces its session;
  oversized, batched and session-less POSTs are refused and the stream survives.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from gateway.legacy_clients.calls import MAX_INPUT_ROUNDS
from tests.integration.test_legacy_clients_http import LEGACY, hdrs, initialize, rpc, sse_events
from tests.integration.test_legacy_clients_sse import RawSseClient, sse_url
from tests.integration.test_modern_failures import RawBackend, answers, gateway_before
from tests.support import legacy_venv
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.listen import eventually
from tests.support.procs import Proc
from tests.support.scripted import Scripted
from tests.support.sockets import read_now

pytestmark = pytest.mark.filterwarnings("ignore:.*(ping is removed|logging capability is deprecated).*")

ANONYMOUS = "|anonymous"  # the session key of a caller without credentials (auth mode none)


def conformance(backend: Proc, **server: Any) -> dict[str, Any]:
    return {"backends": [{"name": "conf", "url": backend.url, "era": "modern"}], "server": server}


def scripted(backend: Scripted) -> dict[str, Any]:
    return {"backends": [{"name": "alpha", "url": backend.url, "era": "modern"}]}


def live(gw: RunningGateway, session_id: str) -> Any:
    session = gw.app.legacy_clients.sessions.get(session_id, ANONYMOUS)
    assert session is not None, "the session ended"
    return session


async def called(backend: Scripted, key: str) -> bool:
    return any(c["params"].get("arguments", {}).get("key") == key for c in await backend.calls("tools/call"))


async def cancelled(backend: Scripted, key: str) -> bool:
    return key in (await backend.state())["cancelled"]


async def still_serves(http: httpx.AsyncClient, gw: RunningGateway, session_id: str) -> None:
    ping = await http.post(gw.url, content=rpc("ping", id="still"), headers=hdrs(session_id))
    assert ping.status_code == 200 and ping.json() == {"jsonrpc": "2.0", "id": "still", "result": {}}
    listed = await http.post(gw.url, content=rpc("tools/list", id="list"), headers=hdrs(session_id))
    assert listed.status_code == 200 and listed.json()["result"]["tools"], listed.text


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body, priming events (empty data) skipped."""
    return [json.loads(data) for block in text.replace("\r\n", "\n").split("\n\n")
            if (data := "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")))]


def gated(key: str, id: Any) -> bytes:
    return rpc("tools/call", {"name": "gated", "arguments": {"key": key}}, id=id)


# -- a call the client walks away from, or cancels (server.py `_forward`) ---------------------


async def test_a_json_answered_call_whose_client_goes_away_is_cancelled_upstream(alpha: Scripted) -> None:
    """A JSON answer has nowhere to go once its connection is gone (unlike a stream, which can
    be resumed): the work stops, the backend sees its request go, and the session lives on."""
    async with running_gateway(scripted(alpha)) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url)
        session = live(gw, session_id)
        body = gated("walked-away", 5)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
                     b"accept: application/json\r\nmcp-protocol-version: %s\r\nmcp-session-id: %s\r\n"
                     b"content-length: %d\r\n\r\n%s" % (gw.port, LEGACY.encode(), session_id.encode(), len(body), body))
        await writer.drain()
        await eventually(lambda: called(alpha, "walked-away"))
        assert list(session.in_flight) == [5]
        writer.close()
        await eventually(lambda: cancelled(alpha, "walked-away"))
        await eventually(lambda: not session.in_flight)
        await still_serves(http, gw, session_id)


async def test_a_cancelled_json_answered_call_gets_202_and_no_response(alpha: Scripted) -> None:
    async with running_gateway(scripted(alpha)) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url)
        session = live(gw, session_id)
        pending = asyncio.ensure_future(
            http.post(gw.url, content=gated("cancelled-json", 6), headers=hdrs(session_id, accept="application/json")))
        await eventually(lambda: called(alpha, "cancelled-json"))
        cancel = await http.post(gw.url, content=rpc("notifications/cancelled", {"requestId": 6, "reason": "no"},
                                                     id=None), headers=hdrs(session_id))
        assert cancel.status_code == 202
        answered = await pending
        # L-CAN: no response for a cancelled request; the POST that carried it is just accepted.
        assert answered.status_code == 202 and answered.content == b""
        await eventually(lambda: cancelled(alpha, "cancelled-json"))
        assert not session.in_flight
        await still_serves(http, gw, session_id)


# -- the gateway's own requests to the client (calls.py `_ask_client`) -------------------------


async def test_a_client_that_never_answers_is_told_and_the_call_fails(conformance_backend: Proc) -> None:
    settings = conformance(conformance_backend, legacy_input_timeout_seconds=0.5)
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url, capabilities={"elicitation": {}})
        body = rpc("tools/call", {"name": "test_elicitation", "arguments": {"message": "Name?"}}, id=7)
        response = await http.post(gw.url, content=body, headers=hdrs(session_id))
        assert response.headers["content-type"].startswith("text/event-stream")
        asked, withdrawn, final = sse_messages(response.text)
        assert asked["method"] == "elicitation/create" and asked["params"]["message"] == "Name?"
        assert withdrawn == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": asked["id"], "reason": "no answer in time"}}
        assert final["id"] == 7 and final["error"]["code"] == -32603
        assert "did not answer the gateway's elicitation/create request(s) within 0.5s" in final["error"]["message"]
        session = live(gw, session_id)
        assert not session.pending and not session.in_flight
        late = await http.post(gw.url, content=json.dumps({"jsonrpc": "2.0", "id": asked["id"], "result": {
            "action": "accept", "content": {"username": "a", "email": "b"}}}), headers=hdrs(session_id))
        assert late.status_code == 400 and late.json()["error"]["code"] == -32600
        await still_serves(http, gw, session_id)


SAMPLED = {"role": "assistant", "content": {"type": "text", "text": "Hello!"}, "model": "m"}
ROOTS = {"roots": [{"uri": "file:///tmp/project", "name": "project"}]}


async def test_a_client_that_answers_some_requests_is_told_which_ones_are_withdrawn(
        conformance_backend: Proc) -> None:
    settings = conformance(conformance_backend, legacy_input_timeout_seconds=0.5)
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url, capabilities={"elicitation": {}, "sampling": {}, "roots": {}})
        body = rpc("tools/call", {"name": "test_input_required_result_multiple_inputs", "arguments": {}}, id=11)
        messages: list[dict[str, Any]] = []
        async with http.stream("POST", gw.url, content=body, headers=hdrs(session_id)) as response:
            async for _, data in sse_events(response):
                if data:
                    messages.append(json.loads(data))
                if messages and messages[-1].get("method") == "elicitation/create":
                    answered = await http.post(gw.url, content=json.dumps({
                        "jsonrpc": "2.0", "id": messages[-1]["id"],
                        "result": {"action": "accept", "content": {"name": "Ada"}}}), headers=hdrs(session_id))
                    assert answered.status_code == 202
        asked = {m["method"]: m["id"] for m in messages[:3]}
        assert set(asked) == {"elicitation/create", "sampling/createMessage", "roots/list"}
        withdrawn = [m["params"]["requestId"] for m in messages[3:-1] if m["method"] == "notifications/cancelled"]
        assert withdrawn == [asked["sampling/createMessage"], asked["roots/list"]]  # not the one answered
        assert messages[-1]["id"] == 11 and messages[-1]["error"]["code"] == -32603
        session = live(gw, session_id)
        assert not session.pending and not session.in_flight


async def test_answers_sent_twice_or_without_a_result_do_not_disturb_the_round(conformance_backend: Proc) -> None:
    """Three requests in one round (elicitation, sampling, roots). The elicitation is answered
    twice (the second is accepted and ignored: the first answer counts) and once more with
    neither result nor error (400 -32600, the request still waits); the round then completes,
    and an answer after it is refused."""
    caps = {"elicitation": {}, "sampling": {}, "roots": {}}
    async with running_gateway(conformance(conformance_backend)) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url, capabilities=caps)
        session = live(gw, session_id)
        body = rpc("tools/call", {"name": "test_input_required_result_multiple_inputs", "arguments": {}}, id=8)

        async def answer(request_id: str, **outcome: Any) -> httpx.Response:
            return await http.post(gw.url, content=json.dumps({"jsonrpc": "2.0", "id": request_id, **outcome}),
                                   headers=hdrs(session_id))

        asked: dict[str, str] = {}
        messages: list[dict[str, Any]] = []
        async with http.stream("POST", gw.url, content=body, headers=hdrs(session_id)) as response:
            async for _, data in sse_events(response):
                if not data:
                    continue
                messages.append(json.loads(data))
                if "method" in messages[-1]:
                    asked[messages[-1]["method"]] = messages[-1]["id"]
                if len(asked) < 3 or "answered" in asked:
                    continue
                asked["answered"] = ""
                elicit = asked["elicitation/create"]
                first = await answer(elicit, result={"action": "accept", "content": {"name": "Ada"}})
                twice = await answer(elicit, result={"action": "accept", "content": {"name": "Eve"}})
                assert (first.status_code, twice.status_code) == (202, 202)
                empty = await answer(asked["sampling/createMessage"])
                assert empty.status_code == 400 and empty.json()["error"]["code"] == -32600
                assert len(session.pending) == 3  # nothing resolved the sampling request
                assert (await answer(asked["sampling/createMessage"], result=SAMPLED)).status_code == 202
                assert (await answer(asked["roots/list"], result=ROOTS)).status_code == 202
        assert [m.get("method") for m in messages] == ["elicitation/create", "sampling/createMessage",
                                                       "roots/list", None]
        assert messages[-1]["id"] == 8
        assert messages[-1]["result"]["content"][0]["text"] == "All inputs received: client_roots, greeting, user_name"
        assert not session.pending and not session.in_flight
        after = await answer(asked["roots/list"], result=ROOTS)
        assert after.status_code == 400 and "no request with id" in after.json()["error"]["message"]
        await still_serves(http, gw, session_id)


async def test_a_backend_that_keeps_asking_is_given_up_after_max_rounds(conformance_backend: Proc) -> None:
    """test_input_required_result_elicitation asks again until it gets a name; a client that
    always declines would be asked for ever."""
    asked: list[str] = []

    async def decline(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    async with (running_gateway(conformance(conformance_backend)) as gw,
                Client(gw.url, mode="legacy", elicitation_callback=decline) as client):
        with pytest.raises(MCPError) as gave_up:
            await client.call_tool("test_input_required_result_elicitation", {})
        assert gave_up.value.error.code == -32603
        assert f"Gave up after {MAX_INPUT_ROUNDS} rounds of input requests for tools/call" in gave_up.value.error.message
        assert len(asked) == MAX_INPUT_ROUNDS
        (session,) = gw.app.legacy_clients.sessions._sessions.values()
        assert not session.pending and not session.in_flight
        assert (await client.call_tool("test_simple_text", {})).content[0].text.startswith("This is a simple text")


def _input_required(**result: Any) -> Any:
    return answers({"jsonrpc": "2.0", "result": {"resultType": "input_required", **result}})


@pytest.mark.parametrize(("tool", "script", "says"), [
    ("garbled", _input_required(inputRequests={"k": "not a request"}, requestState="s"),
     "The backend sent a malformed input request 'k'"),
    ("unknown", _input_required(inputRequests={"k": {"method": "tasks/get", "params": {}}}),
     "The backend asked for unknown input 'tasks/get'"),
    ("endless", _input_required(requestState="s"),
     f"Gave up after {MAX_INPUT_ROUNDS} rounds of input requests for tools/call"),
], ids=["malformed", "unknown-method", "no-requests-ever"])
async def test_input_requests_a_backend_garbles_end_the_call(tool: str, script: Any, says: str) -> None:
    backend = RawBackend({tool: script})
    async with gateway_before(("raw", backend)) as (gw, http):
        session_id = await initialize(http, gw.url, capabilities={"elicitation": {}})
        # Bounded: keep-alive comments would hold a read timeout off while a wrongly sent
        # request waits for its answer.
        response = await asyncio.wait_for(http.post(
            gw.url, content=rpc("tools/call", {"name": tool, "arguments": {}}, id=9), headers=hdrs(session_id)), 30)
        assert response.status_code == 200
        (final,) = sse_messages(response.text)  # nothing was asked of the client
        assert final["id"] == 9 and final["error"]["code"] == -32603 and says in final["error"]["message"]
        assert backend.asked("tools/call", tool) == (MAX_INPUT_ROUNDS if tool == "endless" else 1)
        session = live(gw, session_id)
        assert not session.pending and not session.in_flight
        await still_serves(http, gw, session_id)


# -- streams: resumption, the notification stream, subscriptions ---------------------------------


async def test_resuming_a_stream_that_is_still_being_read_is_409(alpha: Scripted) -> None:
    async with running_gateway(scripted(alpha)) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url)
        async with http.stream("POST", gw.url, content=gated("read-twice", 10), headers=hdrs(session_id)) as first:
            events = sse_events(first)
            primed, _ = await anext(events)
            resumed = await http.get(gw.url, headers=hdrs(session_id, **{"last-event-id": primed}))
            # One reader per stream: a message goes to one connection, never two.
            assert resumed.status_code == 409 and resumed.json()["error"]["code"] == -32600
            await alpha.release("read-twice")
            rest = [json.loads(data) async for _, data in events if data]
        assert [(m["id"], m["result"]["content"][0]["text"]) for m in rest] == [(10, "alpha: read-twice released")]
        # Once nobody reads it, the same stream can be replayed from the same point.
        again = await http.get(gw.url, headers=hdrs(session_id, **{"last-event-id": primed}))
        assert again.status_code == 200 and sse_messages(again.text) == rest


async def _toggle_tool(http: httpx.AsyncClient, url: str, session_id: str, id: Any) -> None:
    response = await http.post(url, content=rpc("tools/call", {"name": "test_trigger_tool_change", "arguments": {}},
                                                 id=id), headers=hdrs(session_id, accept="application/json"))
    assert response.json()["result"]["content"][0]["text"] == "tool list changed"


async def _next_data(events: Any) -> tuple[str, str]:
    while True:
        event_id, data = await asyncio.wait_for(anext(events), 10)
        if data:
            return event_id, data


async def test_a_reopened_notification_stream_gets_what_arrived_while_it_was_closed(
        conformance_backend: Proc) -> None:
    get = {"accept": "text/event-stream"}
    async with running_gateway(conformance(conformance_backend)) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url)
        async with http.stream("GET", gw.url, headers=hdrs(session_id, **get)) as stream:
            events = sse_events(stream)
            primed, data = await anext(events)
            assert data == ""
            await _toggle_tool(http, gw.url, session_id, 1)  # the fixture's dynamic tool appears
            first_id, first = await _next_data(events)
            assert json.loads(first)["method"] == "notifications/tools/list_changed"
        # No GET is open: the next change waits in the session for the client's return.
        await _toggle_tool(http, gw.url, session_id, 2)  # ... and disappears again
        async with http.stream("GET", gw.url, headers=hdrs(session_id, **get)) as reopened:
            events = sse_events(reopened)
            buffered = await anext(events)
            await _toggle_tool(http, gw.url, session_id, 3)
            live_again = await anext(events)
        await _toggle_tool(http, gw.url, session_id, 4)  # as it was
        # The same stream goes on where the client left it: no second priming event, no gap.
        stream_id, seq = first_id.rsplit(":", 1)
        for n, (event_id, data) in enumerate([buffered, live_again], start=1):
            assert event_id == f"{stream_id}:{int(seq) + n}"
            assert json.loads(data)["method"] == "notifications/tools/list_changed"


async def test_a_quiet_notification_stream_gets_keepalive_comments(conformance_backend: Proc) -> None:
    """Proxies cut idle connections: a GET stream with nothing to say sends SSE comments."""
    async with (running_gateway(conformance(conformance_backend, keepalive_seconds=0.1)) as gw,
                httpx.AsyncClient(timeout=10) as http):
        session_id = await initialize(http, gw.url)
        async with http.stream("GET", gw.url, headers=hdrs(session_id, accept="text/event-stream")) as stream:
            lines = stream.aiter_lines()
            seen = [await asyncio.wait_for(anext(lines), 5) for _ in range(6)]
        assert seen[0].startswith("id: ") and ":" in seen[3:], seen  # the priming event, then comments


async def test_a_session_whose_listen_is_refused_at_the_limit_keeps_working_and_listens_later(
        conformance_backend: Proc, caplog: pytest.LogCaptureFixture) -> None:
    """`subscriptions.max_listens_per_principal` reached: the second session's listen is
    refused (-31004). Its GET stream stays open, its requests are served, and its listen is
    retried: once the first session ends, it hears the backend's list changes."""
    settings = {**conformance(conformance_backend), "subscriptions": {"max_listens_per_principal": 1}}
    get = {"accept": "text/event-stream"}
    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        first, second = await initialize(http, gw.url), await initialize(http, gw.url)
        async with http.stream("GET", gw.url, headers=hdrs(first, **get)) as holding:
            events = sse_events(holding)
            await anext(events)
            await _toggle_tool(http, gw.url, first, 1)  # the first session's listen is up
            assert json.loads((await _next_data(events))[1])["method"] == "notifications/tools/list_changed"
            async with http.stream("GET", gw.url, headers=hdrs(second, **get)) as waiting:
                assert waiting.status_code == 200
                second_events = sse_events(waiting)
                assert (await anext(second_events))[1] == ""
                await eventually(lambda: "max_listens_per_principal" in caplog.text)
                await still_serves(http, gw, second)
                hub = gw.runtime.dispatcher.hub
                firsts = set(hub._clients)
                assert (await http.delete(gw.url, headers=hdrs(first))).status_code == 200
                await eventually(lambda: hub._clients and not hub._clients & firsts)  # the retry got in
                await _toggle_tool(http, gw.url, second, 2)  # as it was
                _, data = await _next_data(second_events)
                assert json.loads(data)["method"] == "notifications/tools/list_changed"


@pytest.fixture(scope="module")
def legacy_backend() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-clients-failures").start()
    yield proc
    proc.stop()


async def test_subscriptions_are_idempotent_and_unsubscribe_reaches_the_backend(legacy_backend: Proc) -> None:
    """A legacy client in front of a legacy backend: `resources/subscribe` becomes the
    backend's own subscription (its `touch_resource` then sends `resources/updated`, which the
    client's GET stream receives); subscribing twice is one subscription; `unsubscribe` ends
    it upstream."""
    settings = {"backends": [{"name": "old", "url": legacy_backend.url, "era": "legacy"}],
                "subscriptions": {"linger_seconds": 0}}
    uri = "demo://greeting"

    async def touch(http: httpx.AsyncClient, url: str, session_id: str) -> str:
        response = await http.post(url, content=rpc("tools/call", {"name": "touch_resource", "arguments": {"uri": uri}},
                                                    id="touch"), headers=hdrs(session_id, accept="application/json"))
        return response.json()["result"]["content"][0]["text"]

    async def request(http: httpx.AsyncClient, url: str, session_id: str, method: str) -> dict[str, Any]:
        response = await http.post(url, content=rpc(method, {"uri": uri}, id=method), headers=hdrs(session_id))
        assert response.status_code == 200
        return response.json()

    async with running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http:
        session_id = await initialize(http, gw.url)
        session = live(gw, session_id)
        async with http.stream("GET", gw.url, headers=hdrs(session_id, accept="text/event-stream")) as stream:
            events = sse_events(stream)
            assert (await anext(events))[1] == ""
            for _ in range(2):  # the second changes nothing
                assert (await request(http, gw.url, session_id, "resources/subscribe"))["result"] == {}
            assert session.subscriptions == {uri}
            await eventually(lambda: _says(touch(http, gw.url, session_id), f"updated: {uri}"))
            _, data = await _next_data(events)
            assert json.loads(data) == {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                        "params": {"uri": uri}}
            # One unsubscribe ends what two subscribes made; a second one changes nothing.
            assert (await request(http, gw.url, session_id, "resources/unsubscribe"))["result"] == {}
            assert session.subscriptions == set()
            await eventually(lambda: _says(touch(http, gw.url, session_id), f"not subscribed: {uri}"))
            assert (await request(http, gw.url, session_id, "resources/unsubscribe"))["result"] == {}


async def _says(text: Any, expected: str) -> bool:
    return await text == expected


async def test_misplaced_messages_are_refused_and_ignored_without_harm(alpha: Scripted) -> None:
    """A GET without a session from a legacy client (400), a subscription the gateway never
    offered (the scripted fleet cannot `subscribe`: -32601, HTTP 200 inside a session), and
    notifications with no modern meaning or malformed params (202, ignored)."""
    async with running_gateway(scripted(alpha)) as gw, httpx.AsyncClient(timeout=10) as http:
        no_session = await http.get(gw.url, headers=hdrs(accept="text/event-stream"))
        assert no_session.status_code == 400 and no_session.json()["error"]["code"] == -32600
        assert "Mcp-Session-Id header is required" in no_session.json()["error"]["message"]
        session_id = await initialize(http, gw.url)
        subscribe = await http.post(gw.url, content=rpc("resources/subscribe", {"uri": "scripted://alpha/doc-0"}),
                                    headers=hdrs(session_id))
        assert subscribe.status_code == 200 and subscribe.json()["error"]["code"] == -32601
        assert not live(gw, session_id).subscriptions
        for method, params in [("notifications/roots/list_changed", None),
                               ("notifications/progress", {"progressToken": "x", "progress": 1}),
                               ("notifications/cancelled", "not an object"),
                               ("notifications/cancelled", {"requestId": "nothing-in-flight"})]:
            sent = await http.post(gw.url, content=rpc(method, params, id=None), headers=hdrs(session_id))
            assert sent.status_code == 202, (method, sent.text)
        await still_serves(http, gw, session_id)


# -- the HTTP+SSE front (sse_front.py) -----------------------------------------------------------


INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "stalled", "version": "0"}}}


async def _stream_nobody_reads(gw: RunningGateway) -> tuple[socket.socket, str]:
    """GET /sse on a socket with tiny buffers whose reader stops after the endpoint event."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)  # keeps the gateway's send buffer small
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", gw.port))
    await loop.sock_sendall(sock, b"GET /sse HTTP/1.1\r\nhost: 127.0.0.1:%d\r\naccept: text/event-stream\r\n\r\n"
                            % gw.port)
    head = b""
    while b"session_id=" not in head or b"\n\n" not in head.split(b"session_id=", 1)[1]:
        head += await loop.sock_recv(sock, 4096)
    endpoint = head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
    return sock, gw.base + endpoint


async def test_an_http_sse_client_that_stops_reading_is_cut_at_the_queue_limit(conformance_backend: Proc) -> None:
    """Every answer waits in the stream's queue once the socket takes no more; at 1,000 the
    stream is cut and its session ended, at once (it used to wait out the 60 s stalled-write
    limit, running the work of every POST meanwhile). Another client is not disturbed."""
    async with (running_gateway(conformance(conformance_backend)) as gw, httpx.AsyncClient(timeout=30) as http,
                RawSseClient(http, sse_url(gw)) as bystander):
        await bystander.initialize()
        sock, endpoint = await _stream_nobody_reads(gw)
        assert (await http.post(endpoint, json=INITIALIZE)).status_code == 202
        await eventually(lambda: len(gw.app.legacy_clients.sessions) == 2)
        posted = 0
        statuses: set[int] = {202}
        while statuses == {202} and posted < 4000:
            batch = await asyncio.gather(*(http.post(endpoint, json={"jsonrpc": "2.0", "id": posted + i,
                                                                     "method": "tools/list"}) for i in range(50)))
            posted += 50
            statuses = {r.status_code for r in batch}
        assert statuses <= {202, 404}
        assert 404 in statuses, f"{posted} messages posted, the stream is still served"
        assert len(gw.app.legacy_clients.sessions) == 1  # the bystander's
        late = await http.post(endpoint, json={"jsonrpc": "2.0", "id": "late", "method": "ping"})
        assert late.status_code == 404
        assert (await bystander.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status_code == 202
        assert await bystander.next_message() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        held: list[bytes] = []
        # What the socket held, then the end of the connection.
        await eventually(lambda: held.append(read_now(sock)) or held[-1].endswith(b"<EOF>"))
        sock.close()


async def test_shutdown_ends_a_stream_whose_client_stopped_reading(conformance_backend: Proc) -> None:
    """The graceful drain must not wait for a client that reads nothing: its stream is cut at
    once, not when the stalled write gives up (60 s)."""
    async with running_gateway(conformance(conformance_backend)) as gw, httpx.AsyncClient(timeout=30) as http:
        sock, endpoint = await _stream_nobody_reads(gw)
        (connection,) = gw.app.sse_front._connections.values()
        assert (await http.post(endpoint, json=INITIALIZE)).status_code == 202
        posted = 0
        # Until the writer waits on a write the socket does not take, with answers queued behind it.
        while posted < 3000 and not (connection.write_deadline is not None and connection.outbox.qsize()):
            await asyncio.gather(*(http.post(endpoint, json={"jsonrpc": "2.0", "id": posted + i,
                                                             "method": "tools/list"}) for i in range(50)))
            posted += 50
            await asyncio.sleep(0.05)  # the writer's turn
        assert connection.write_deadline is not None and connection.outbox.qsize()
        await gw.app.begin_shutdown()
        await eventually(lambda: not gw.app.sse_front._connections)
        sock.close()


async def test_a_second_initialize_on_one_stream_replaces_its_session(conformance_backend: Proc) -> None:
    async with (running_gateway(conformance(conformance_backend)) as gw, httpx.AsyncClient(timeout=10) as http,
                RawSseClient(http, sse_url(gw)) as client):
        sessions = gw.app.legacy_clients.sessions
        await client.initialize("2024-11-05")
        await client.initialize("2025-06-18")
        await eventually(lambda: len(sessions) == 1)  # the first one ended
        (session,) = sessions._sessions.values()
        assert session.protocol_version == "2025-06-18"
        assert (await client.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).status_code == 202
        listed = await client.next_message()
        assert listed["id"] == 1 and listed["result"]["tools"]


async def test_garbage_posted_to_the_http_sse_front_is_refused_and_the_stream_survives(
        conformance_backend: Proc) -> None:
    settings = conformance(conformance_backend, max_body_bytes=4096)
    async with (running_gateway(settings) as gw, httpx.AsyncClient(timeout=10) as http,
                RawSseClient(http, sse_url(gw)) as client):

        async def chunked() -> Any:  # no Content-Length: the limit is enforced while reading
            for _ in range(8):
                yield b" " * 1024

        too_large = await http.post(client.endpoint, content=chunked(), headers={"content-type": "application/json"})
        assert too_large.status_code == 413 and too_large.json()["error"]["code"] == -32600
        # Messages the transport accepts (202) but the server refuses, on the stream.
        before = await client.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert before.status_code == 202
        refused = await client.next_message()
        assert refused["id"] == 1 and refused["error"]["code"] == -32600
        assert "initialize" in refused["error"]["message"]
        assert (await client.post(b'[{"jsonrpc": "2.0", "id": 2, "method": "ping"}]')).status_code == 202
        batch = await client.next_message()
        assert batch["error"]["code"] == -32600 and "batches" in batch["error"]["message"]
        await client.initialize()
        assert (await client.post({"jsonrpc": "2.0", "id": 3, "method": "ping"})).status_code == 202
        assert await client.next_message() == {"jsonrpc": "2.0", "id": 3, "result": {}}
