"""A legacy backend withdraws a question it asked during a client's call (digest §h.5, last
bullet: "Backend-sent `notifications/cancelled` referencing R: clear the parked continuation.
Never forward it"; L-CAN: the sender of a request may cancel it, and then expects no answer).

End to end: a modern client over raw HTTP, the real gateway in process, and a scripted legacy
backend that sends `notifications/cancelled` for its own request on cue: `FlakyLegacy`
(tests/integration/test_legacy_http_failures.py, Streamable HTTP), whose record of every
message shows what the backend was told, and tests/fixtures/servers/legacy_asking_stdio.py
(stdio). The mcp 1.30 SDK server cannot be made to cancel its own request on cue.

- Withdrawn while the call is parked (on the call's own POST stream, on the session's GET
  stream, on the stdio pipe): the retry answers nothing for it, even when the client sent an
  answer, does not ask for it again when the client sent none, and relays the call's stream on.
- Withdrawn before the call was parked: the InputRequiredResult does not ask for it.
- The parked call expires: the withdrawn request is not answered either.
- A cancellation of a request no call awaits is dropped, and never reaches the client.

Synchronisation without sleeps: a backend sends on one stream in order and the gateway routes
each stream's messages in order, so after the cancellation the backend sends a `ping` on the
same stream and the test waits for the gateway's answer to it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.test_legacy_http_failures import (
    Answer,
    FlakyLegacy,
    answer_of,
    flaky,  # noqa: F401 (the fixture)
    result,
    settings,
    sse_event,
    still_serves,
)
from tests.support import mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.listen import eventually
from tests.support.procs import FIXTURE_SERVERS

ELICIT = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
ELICIT_AND_SAMPLE = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "sampling": {}}}
COLOUR = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def question(request_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create",
            "params": {"message": f"{request_id}?", "requestedSchema": COLOUR}}


def cancelled(request_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "no longer needed"}}


def ping(request_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "ping"}


def accept(colour: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"answer": colour}}


def events(*messages: dict[str, Any]) -> bytes:
    """Several SSE events in one write: they reach the gateway together, as the messages a
    legacy server sends in one go (its gathering window is then irrelevant)."""
    return b"".join(sse_event(m) for m in messages)


def answers_to(server: FlakyLegacy, request_id: str) -> list[dict[str, Any]]:
    return [s["message"] for s in server.seen
            if (s["message"] or {}).get("id") == request_id and "method" not in s["message"]]


def cancellations(server: FlakyLegacy) -> list[Any]:
    return [s["message"]["params"]["requestId"] for s in server.requests("notifications/cancelled")]


def asking(held: list[Answer], *requests: dict[str, Any]) -> Any:
    """A tool that sends `requests` at once, then writes whatever the test queues."""
    async def tool(answer: Answer) -> None:
        held.append(answer)
        await answer.sse()
        await answer.write(events(*requests))
        await answer.hold()
    return tool


def parked(gw: RunningGateway) -> int:
    return len(gw.runtime.backends[0].continuations)


async def call(http: httpx.AsyncClient, gw: RunningGateway, tool: str, *, id: Any,
               meta: dict[str, Any] = ELICIT, **retry: Any) -> httpx.Response:
    params = {"name": tool, "arguments": {}, **retry}
    return await mcp_http.post(http, gw.url, "tools/call", params, id=id, meta=meta)


async def park(http: httpx.AsyncClient, gw: RunningGateway, tool: str, meta: dict[str, Any] = ELICIT
               ) -> dict[str, Any]:
    asked = answer_of(await call(http, gw, tool, id="first", meta=meta))["result"]
    assert asked["resultType"] == "input_required", asked
    return asked


async def routed_before(server: FlakyLegacy, stream: Answer, marker: str) -> None:
    """Send the ping `marker` on `stream` after what was sent there, and wait for the gateway's
    answer: everything sent before it on that stream has been routed."""
    stream.queue.put_nowait(sse_event(ping(marker)))
    await eventually(lambda: answers_to(server, marker))


# -- withdrawn while the call is parked (backend.py `_resume`, session.py `_withdrawn`) -----------


async def test_a_question_withdrawn_on_the_calls_stream_is_not_answered(flaky) -> None:  # noqa: F811
    """Two questions parked; the backend withdraws e1 on the call's own POST stream. The
    client answers both anyway: only e2's answer reaches the backend, and the call goes on."""
    server, url = flaky
    held: list[Answer] = []
    server.tools["ask_two"] = asking(held, question("e1"), question("e2"))
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        asked = await park(http, gw, "ask_two")
        assert sorted(asked["inputRequests"]) == ["re1", "re2"]
        held[0].queue.put_nowait(sse_event(cancelled("e1")))
        await routed_before(server, held[0], "p1")
        answers = {"re1": accept("red"), "re2": accept("blue")}
        state = asked["requestState"]
        retry = asyncio.ensure_future(call(http, gw, "ask_two", id="retry", requestState=state,
                                           inputResponses=answers))
        await eventually(lambda: answers_to(server, "e2"))  # the retry answered e2: the backend finishes
        held[0].queue.put_nowait(sse_event(result(held[0].message, "got blue")))
        done = answer_of(await retry)
        assert done["id"] == "retry" and done["result"]["content"][0]["text"] == "got blue", done
        assert answers_to(server, "e1") == []
        assert answers_to(server, "e2") == [{"jsonrpc": "2.0", "id": "e2", "result": accept("blue")}]
        assert parked(gw) == 0
        await still_serves(http, gw)


async def test_a_question_withdrawn_on_the_get_stream_is_not_asked_again(flaky) -> None:  # noqa: F811
    """The backend withdraws the call's only question on the session's GET stream (L-TR
    §Listening: the server MAY send notifications there, which SHOULD, not must, be unrelated
    to requests in flight). The retry carries no answer: that is no reason to ask again; the
    call's stream is relayed on, to the result the backend sends next.

    The gateway holds a GET stream only on the listen session, which declares no capability
    and so never carries a question; the test opens one on the call's session, as a listen
    there would (`LegacyHttpBackend.open_channel`), to reach the GET stream's routing."""
    server, url = flaky
    held: list[Answer] = []
    server.tools["ask"] = asking(held, question("e1"))
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        asked = await park(http, gw, "ask")
        backend = gw.runtime.backends[0]
        (session,) = [s for s in backend.pool.sessions() if "elicitation" in s.capabilities]
        has_channel, holder = await backend.open_channel(session)
        assert has_channel and holder is not None
        try:
            await eventually(lambda: server.live_streams(session.session_id))
            (get_stream,) = server.live_streams(session.session_id)
            get_stream.queue.put_nowait(sse_event(cancelled("e1")))
            await routed_before(server, get_stream, "p1")
            state = asked["requestState"]
            retry = asyncio.ensure_future(call(http, gw, "ask", id="retry", requestState=state,
                                               inputResponses={}))
            held[0].queue.put_nowait(sse_event(result(held[0].message, "gave up")))
            done = answer_of(await retry)
            assert done["id"] == "retry", done
            assert done["result"]["resultType"] == "complete"
            assert done["result"]["content"][0]["text"] == "gave up"
            assert answers_to(server, "e1") == []
            assert parked(gw) == 0
        finally:
            holder.cancel()
        await still_serves(http, gw)


async def test_a_question_withdrawn_on_the_stdio_pipe_is_not_answered_on_the_retry() -> None:
    """stdio: one pipe for every call, so the cancellation cannot be credited by stream (the
    parked call does not even count for `sole_origin`); it names its request. It arrives
    while another call (`withdraw`) is in flight, whose answer comes after it on the pipe."""
    command = [sys.executable, str(FIXTURE_SERVERS / "legacy_asking_stdio.py")]
    config = {"backends": [{"name": "old", "command": command, "era": "legacy", "timeout_seconds": 10}]}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        asked = await park(http, gw, "ask")
        assert list(asked["inputRequests"]) == ["re1"]
        withdrawn = answer_of(await call(http, gw, "withdraw", id="withdraw"))
        assert withdrawn["result"]["content"][0]["text"] == '["e1"]'
        done = answer_of(await call(http, gw, "ask", id="retry", requestState=asked["requestState"],
                                    inputResponses={"re1": accept("red")}))
        assert done["id"] == "retry" and done["result"]["content"][0]["text"] == "gave up on e1", done
        seen = answer_of(await call(http, gw, "seen", id="seen"))
        assert orjson.loads(seen["result"]["content"][0]["text"]) == []  # no answer to e1 reached it
        assert parked(gw) == 0


# -- withdrawn before the call was parked (backend.py `_next`) ------------------------------------


async def test_a_question_withdrawn_before_parking_is_not_asked(flaky) -> None:  # noqa: F811
    server, url = flaky
    held: list[Answer] = []
    server.tools["ask_two"] = asking(held, question("e1"), question("e2"), cancelled("e1"))

    async def changes_its_mind(answer: Answer) -> None:
        await answer.sse()
        await answer.write(events(question("e3"), cancelled("e3"), result(answer.message, "never mind")))
        await answer.end()

    server.tools["changes_its_mind"] = changes_its_mind
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        asked = await park(http, gw, "ask_two")
        assert asked["inputRequests"] == {"re2": {"method": "elicitation/create",
                                                  "params": question("e2")["params"]}}
        state = asked["requestState"]
        retry = asyncio.ensure_future(call(http, gw, "ask_two", id="retry", requestState=state,
                                           inputResponses={"re2": accept("green")}))
        await eventually(lambda: answers_to(server, "e2"))
        held[0].queue.put_nowait(sse_event(result(held[0].message, "got green")))
        assert answer_of(await retry)["result"]["content"][0]["text"] == "got green"
        assert answers_to(server, "e1") == []
        # Its only question withdrawn at once: the plain JSON answer of a call that never asked.
        response = await call(http, gw, "changes_its_mind", id="second")
        assert response.headers["content-type"].startswith("application/json"), response.text
        assert response.json()["result"]["content"][0]["text"] == "never mind"
        assert answers_to(server, "e3") == []
        assert parked(gw) == 0


# -- a parked call nobody retries (backend.py `_expired`) -----------------------------------------


async def test_an_expiring_call_does_not_answer_a_withdrawn_question(flaky) -> None:  # noqa: F811
    """Elicitation and sampling parked; the backend withdraws the elicitation; the call then
    expires (here at once, through the same path as its timer: `Continuations.close_all`).
    Only the sampling request gets its error, then the call is cancelled upstream."""
    server, url = flaky
    held: list[Answer] = []
    sample = {"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage",
              "params": {"messages": [], "maxTokens": 5}}
    server.tools["ask_two"] = asking(held, question("e1"), sample)
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        asked = await park(http, gw, "ask_two", ELICIT_AND_SAMPLE)
        assert sorted(asked["inputRequests"]) == ["re1", "rs1"]
        held[0].queue.put_nowait(sse_event(cancelled("e1")))
        await routed_before(server, held[0], "p1")
        gw.runtime.backends[0].continuations.close_all()
        await eventually(lambda: cancellations(server))
        assert answers_to(server, "s1") == [{"jsonrpc": "2.0", "id": "s1", "error": {
            "code": -32603, "message": "the client did not answer"}}]
        assert answers_to(server, "e1") == []
        assert cancellations(server) == [held[0].message["id"]]
        assert parked(gw) == 0
        await still_serves(http, gw)


# -- a cancellation nothing awaits (session.py `_withdrawn`) ---------------------------------------


async def test_a_cancellation_of_nothing_awaited_is_dropped_and_never_forwarded(
        flaky, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811 (the fixture)
    server, url = flaky
    caplog.set_level(logging.DEBUG, logger="gateway.backends.legacy")

    async def stray(answer: Answer) -> None:
        await answer.sse()
        await answer.write(events(cancelled("nobody"), result(answer.message, "done")))
        await answer.end()

    server.tools["stray"] = stray
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await call(http, gw, "stray", id="one")
        # Nothing but the answer: no stream begun for a notification the client never sees.
        assert response.headers["content-type"].startswith("application/json"), response.text
        assert response.json()["result"]["content"][0]["text"] == "done"
    assert any("cancellation of request 'nobody', which no call awaits, dropped" in r.getMessage()
               for r in caplog.records)
