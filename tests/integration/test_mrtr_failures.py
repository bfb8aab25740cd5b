"""MRTR in front of a legacy backend when the client or the timing misbehaves
(gateway/backends/legacy/backend.py, mrtr.py; docs/legacy.md "Backend requests → MRTR"; digest
§h.5 strategy B), end to end: a modern client over raw HTTP, the real gateway in process, and
either the mcp 1.30 fixture (tests/fixtures/servers/legacy_everything.py) or `FlakyLegacy`
(tests/integration/test_legacy_http_failures.py), whose record of every message shows what the
backend was told.

- Retries that cannot resume anything are -32602 (HTTP 400) and leave the parked call as it
  was: a requestState that is no string or not the gateway's, one presented to another backend
  or by another principal, one used twice; answers that are no answers are asked again.
- A retry whose state names another replica is forwarded there; a forwarded one is never
  forwarded again (-32602), and one whose owner is gone fails with -31001 naming the backend.
- A parked call nobody retries expires: the backend's requests are answered (elicitation:
  `cancel`, the others an error), the call is cancelled upstream, the retry is refused.
- A backend request after the stream began (progress first) still parks the call, or, when the
  client cannot answer it, ends the stream with -32021 and is refused upstream.
- A client that goes away before the backend's first message cancels the backend call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.backends.legacy import mrtr
from gateway.observability import metrics
from tests.integration.test_legacy_http_failures import (
    Answer,
    FlakyLegacy,
    answer_of,
    flaky,  # noqa: F401 (the fixture)
    result,
    settings,
    still_serves,
)
from tests.integration.test_legacy_http_failures import _progress as progress_event
from tests.support import legacy_venv, mcp_http
from tests.support.gateway import RunningGateway, running_gateway
from tests.support.listen import eventually
from tests.support.procs import Proc, refused_url

SECRET = "mrtr-failures-secret"
ELICIT = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
COLOUR = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def everything() -> Iterator[Proc]:
    proc = legacy_venv.legacy_server(name="legacy-mrtr-failures").start()
    yield proc
    proc.stop()


def ask(tool: str = "ask_user", **retry: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": {"question": "colour?"}, **retry}


async def post(http: httpx.AsyncClient, gw: RunningGateway, params: dict[str, Any], *, id: Any,
               meta: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    return await mcp_http.post(http, gw.url, "tools/call", params, id=id, meta=meta or ELICIT,
                               extra_headers=headers or None)


async def park(http: httpx.AsyncClient, gw: RunningGateway, tool: str = "ask_user", **headers: str
               ) -> tuple[str, str]:
    """Start a call that parks on the backend's elicitation: (its input key, its requestState)."""
    response = await post(http, gw, ask(tool), id="first", **headers)
    input_required = answer_of(response)["result"]
    assert input_required["resultType"] == "input_required", input_required
    ((key, request),) = input_required["inputRequests"].items()
    assert request["method"] == "elicitation/create" and request["params"]["message"] == "colour?"
    return key, input_required["requestState"]


def refused(response: httpx.Response, says: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == -32602 and says in error["message"], error


def accept(key: str, colour: str) -> dict[str, Any]:
    return {key: {"action": "accept", "content": {"answer": colour}}}


def parked(gw: RunningGateway, name: str = "old") -> int:
    return len(next(b for b in gw.runtime.backends if b.name == name).continuations)


# -- retries that resume nothing (backend.py `_resume`) ------------------------------------------


async def test_malformed_stale_and_replayed_retries_leave_the_parked_call_alone(everything: Proc) -> None:
    config = {"backends": [{"name": "old", "url": everything.url, "era": "legacy"}]}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        key, state = await park(http, gw)
        for bad, says in [(42, "requestState must be a string"),
                          ("not-a-state", "requestState was not minted by this gateway"),
                          (state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB"),
                           "requestState failed its integrity check")]:
            refused(await post(http, gw, ask(inputResponses=accept(key, "red"), requestState=bad), id="bad"), says)
        assert parked(gw) == 1
        # Answers that answer nothing: the call is asked again (MRTR: SHOULD, not an error)...
        for responses in ["not an object", {key: "not an object"}, {"some-other-key": {"action": "accept"}}]:
            again = answer_of(await post(http, gw, ask(inputResponses=responses, requestState=state), id="again"))
            asked = again["result"]
            assert asked["resultType"] == "input_required" and list(asked["inputRequests"]) == [key]
            # ... under a new state: each one is good for one retry.
            refused(await post(http, gw, ask(inputResponses=accept(key, "red"), requestState=state), id="stale"),
                    "expired or was already resumed")
            state = asked["requestState"]
            assert parked(gw) == 1
        done = answer_of(await post(http, gw, ask(inputResponses=accept(key, "teal"), requestState=state), id="done"))
        assert done["id"] == "done" and done["result"]["content"][0]["text"] == "accept: teal"
        assert parked(gw) == 0
        refused(await post(http, gw, ask(inputResponses=accept(key, "teal"), requestState=state), id="replay"),
                "expired or was already resumed")


async def test_a_retry_sent_to_another_backend_is_refused(everything: Proc) -> None:
    """Two backends (the same server under two names): a's state presented on a call routed
    to b is refused by b, and a's call still completes."""
    config = {"backends": [{"name": "a", "url": everything.url, "era": "legacy"},
                           {"name": "b", "url": everything.url, "era": "legacy"}]}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        key, state = await park(http, gw, "a__ask_user")
        refused(await post(http, gw, ask("b__ask_user", inputResponses=accept(key, "red"), requestState=state),
                           id="b"), "requestState belongs to another backend")
        assert (parked(gw, "a"), parked(gw, "b")) == (1, 0)
        done = answer_of(await post(http, gw, ask("a__ask_user", inputResponses=accept(key, "red"),
                                                  requestState=state), id="a"))
        assert done["result"]["content"][0]["text"] == "accept: red"


async def test_a_retry_by_another_principal_is_refused_and_the_owner_resumes(everything: Proc) -> None:
    config = {"backends": [{"name": "old", "url": everything.url, "era": "legacy"}]}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        key, state = await park(http, gw, authorization="Bearer alice")
        stolen = ask(inputResponses=accept(key, "black"), requestState=state)
        refused(await post(http, gw, stolen, id="mallory", authorization="Bearer mallory"),
                "requestState was issued to another principal")
        refused(await post(http, gw, stolen, id="nobody"), "requestState was issued to another principal")
        assert parked(gw) == 1
        mine = answer_of(await post(http, gw, ask(inputResponses=accept(key, "white"), requestState=state),
                                    id="alice", authorization="Bearer alice"))
        assert mine["result"]["content"][0]["text"] == "accept: white"


# -- retries for a call another replica holds (backend.py `_resume`, mrtr.py `Forwarder`) --------


async def test_a_retry_for_another_replica_is_forwarded_once_and_fails_cleanly_when_it_is_gone(
        everything: Proc) -> None:
    """What another replica sharing the secret would have issued: this one's state, its owner
    replaced. Forwarded to a replica that is gone: -31001 naming the backend and the owner.
    Already forwarded once (the marker header): -32602, never forwarded again (no loops)."""
    config = {"backends": [{"name": "old", "url": everything.url, "era": "legacy"}],
              "security": {"secret": SECRET}}
    async with running_gateway(config) as gw, httpx.AsyncClient(timeout=30) as http:
        key, state = await park(http, gw)
        sealer = mrtr.StateSealer(SECRET.encode())
        gone = refused_url()
        elsewhere = sealer.seal({**sealer.open(state), "o": gone, "c": "held-elsewhere"})
        retry = ask(inputResponses=accept(key, "red"), requestState=elsewhere)
        looped = await post(http, gw, retry, id="looped", **{mrtr.FORWARDED_HEADER: "1"})
        refused(looped, "requestState refers to a call this replica does not hold")
        lost = await post(http, gw, retry, id="lost")
        assert lost.status_code == 502, lost.text
        error = lost.json()["error"]
        assert error["code"] == -31001 and error["data"] == {"backend": "old"}
        assert f"forwarding the MRTR retry to the replica {gone} that owns this requestState" in error["message"]
        assert parked(gw) == 1  # this replica's own call is untouched
        done = answer_of(await post(http, gw, ask(inputResponses=accept(key, "red"), requestState=state), id="ok"))
        assert done["result"]["content"][0]["text"] == "accept: red"


# -- parked calls nobody retries (backend.py `_expired`) -----------------------------------------


def _answers_to(server: FlakyLegacy, request_id: str) -> list[dict[str, Any]]:
    return [s["message"] for s in server.seen
            if (s["message"] or {}).get("id") == request_id and "method" not in s["message"]]


def _cancellations(server: FlakyLegacy) -> list[Any]:
    return [s["message"]["params"]["requestId"] for s in server.requests("notifications/cancelled")]


async def test_a_parked_call_nobody_retries_expires_and_is_cancelled_upstream(flaky) -> None:  # noqa: F811
    server, url = flaky
    called: list[dict[str, Any]] = []

    async def ask_two(answer: Answer) -> None:  # elicitation and sampling at once (asyncio.gather)
        called.append(answer.message)
        await answer.sse()
        await answer.event({"jsonrpc": "2.0", "id": "e1", "method": "elicitation/create",
                            "params": {"message": "Colour?", "requestedSchema": COLOUR}})
        await answer.event({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage",
                            "params": {"messages": [], "maxTokens": 5}})
        await answer.hold()

    server.tools["ask_two"] = ask_two
    caps = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "sampling": {}}}
    async with (running_gateway(settings(url, input_wait_seconds=0.5)) as gw,
                httpx.AsyncClient(timeout=30) as http):
        response = await post(http, gw, {"name": "ask_two", "arguments": {}}, id="first", meta=caps)
        asked = answer_of(response)["result"]
        assert asked["resultType"] == "input_required"
        assert {k: r["method"] for k, r in asked["inputRequests"].items()} == {
            "re1": "elicitation/create", "rs1": "sampling/createMessage"}
        await eventually(lambda: parked(gw) == 0 and _cancellations(server))
        # Each backend request answered as if the user had cancelled, then the call cancelled.
        assert _answers_to(server, "e1") == [{"jsonrpc": "2.0", "id": "e1", "result": {"action": "cancel"}}]
        assert _answers_to(server, "s1") == [{"jsonrpc": "2.0", "id": "s1", "error": {
            "code": -32603, "message": "the client did not answer"}}]
        assert _cancellations(server) == [called[0]["id"]]
        assert metrics.MRTR_PARKED.labels("old")._value.get() == 0
        late = await post(http, gw, {"name": "ask_two", "arguments": {}, "requestState": asked["requestState"],
                                     "inputResponses": {"re1": {"action": "decline"}}}, id="late", meta=caps)
        refused(late, "requestState has expired")
        await still_serves(http, gw)


# -- backend requests after the stream began (backend.py `_relay`) ------------------------------


def _progress_then(request: dict[str, Any], finish: Any = None) -> Any:
    """A tool that reports progress, sends a legacy-only notification (dropped: it has no
    modern meaning, CL minor 11), asks `request`, then holds its stream or runs `finish`."""
    async def tool(answer: Answer) -> None:
        await answer.sse()
        await answer.event(progress_event(answer.message, 1))
        await answer.event({"jsonrpc": "2.0", "method": "notifications/elicitation/complete",
                            "params": {"elicitationId": "elsewhere"}})
        await answer.event(request)
        await (answer.hold() if finish is None else finish(answer))
    return tool


async def test_a_backend_request_after_progress_parks_the_streamed_call(flaky) -> None:  # noqa: F811
    server, url = flaky
    question = {"jsonrpc": "2.0", "id": "e7", "method": "elicitation/create",
                "params": {"message": "Colour?", "requestedSchema": COLOUR}}

    async def answered(answer: Answer) -> None:  # the same stream goes on once the answer came
        await eventually(lambda: _answers_to(server, "e7"))
        colour = _answers_to(server, "e7")[0]["result"]["content"]["answer"]
        await answer.event(result(answer.message, f"got {colour}"))
        await answer.end()

    server.tools["progress_then_ask"] = _progress_then(question, answered)
    meta = {**ELICIT, "progressToken": "mine"}
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        first = await post(http, gw, {"name": "progress_then_ask", "arguments": {}}, id="first", meta=meta)
        assert first.headers["content-type"].startswith("text/event-stream")
        progress, parked_call = mcp_http.sse_messages(first.text)
        assert progress == {"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": "mine", "progress": 1}}
        input_required = parked_call["result"]
        assert parked_call["id"] == "first" and input_required["resultType"] == "input_required"
        assert input_required["inputRequests"] == {"re7": {"method": "elicitation/create",
                                                           "params": question["params"]}}
        assert parked(gw) == 1
        retry = {"name": "progress_then_ask", "arguments": {}, "requestState": input_required["requestState"],
                 "inputResponses": {"re7": {"action": "accept", "content": {"answer": "green"}}}}
        done = answer_of(await post(http, gw, retry, id="retry", meta=meta))
        assert done["id"] == "retry" and done["result"]["content"][0]["text"] == "got green"
        assert parked(gw) == 0
        await still_serves(http, gw)


async def test_a_backend_request_the_client_cannot_answer_ends_the_stream_with_32021(flaky) -> None:  # noqa: F811
    """The client declared form elicitation only; after progress the backend asks for a URL
    elicitation. The stream (already begun with 200) ends with -32021 naming what is missing;
    the backend's request is refused and its call cancelled: never a hang."""
    server, url = flaky
    called: list[dict[str, Any]] = []
    url_question = {"jsonrpc": "2.0", "id": "u1", "method": "elicitation/create",
                    "params": {"mode": "url", "message": "Sign in", "url": "https://example.com/login",
                               "elicitationId": "login-1"}}
    asks = _progress_then(url_question)

    async def tool(answer: Answer) -> None:
        called.append(answer.message)
        await asks(answer)

    server.tools["needs_url"] = tool
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await post(http, gw, {"name": "needs_url", "arguments": {}}, id="first",
                              meta={**ELICIT, "progressToken": "mine"})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        progress, final = mcp_http.sse_messages(response.text)
        assert progress["method"] == "notifications/progress"
        assert final["id"] == "first" and final["error"]["code"] == -32021
        assert final["error"]["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}
        assert "backend 'old' sent elicitation/create" in final["error"]["message"]
        await eventually(lambda: _cancellations(server))
        (refusal,) = _answers_to(server, "u1")
        assert refusal["error"]["code"] == -32021
        assert _cancellations(server) == [called[0]["id"]]
        assert parked(gw) == 0
        await still_serves(http, gw)


async def test_a_url_elicitation_error_with_no_url_to_open_is_an_error_not_a_retry(flaky) -> None:  # noqa: F811
    """A legacy -32042 is never passed on (BASIC). With no elicitation a client could open (no
    `url`), there is nothing to retry with: the client gets -32603 saying what the backend
    required, and nothing is parked."""
    server, url = flaky

    async def requires_nothing_openable(answer: Answer) -> None:
        await answer.json({"jsonrpc": "2.0", "id": answer.message["id"], "error": {
            "code": -32042, "message": "Authorization required",
            "data": {"elicitations": [{"mode": "url", "message": "Sign in", "elicitationId": "no-url"}]}}})

    server.tools["sign_in"] = requires_nothing_openable
    url_capable = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}, "url": {}}}}
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        response = await post(http, gw, {"name": "sign_in", "arguments": {}}, id="first", meta=url_capable)
        error = answer_of(response)["error"]
        assert error == {"code": -32603, "message": "Backend requires a URL elicitation: Authorization required"}
        assert response.status_code == 200  # an ordinary JSON-RPC error answer (digest §a.3 names no status)
        assert parked(gw) == 0
        await still_serves(http, gw)


# -- a client that goes away before anything arrived (backend.py `_answer`) ----------------------


async def test_a_client_that_leaves_before_the_first_event_cancels_the_backend_call(flaky) -> None:  # noqa: F811
    server, url = flaky
    held: list[Answer] = []

    async def silent(answer: Answer) -> None:  # works on, and says nothing yet
        held.append(answer)
        await answer.sse()
        await answer.hold()

    server.tools["silent"] = silent
    async with running_gateway(settings(url)) as gw, httpx.AsyncClient(timeout=30) as http:
        body = mcp_http.body("tools/call", {"name": "silent", "arguments": {}}, id="gone")
        head = "".join(f"{k}: {v}\r\n" for k, v in mcp_http.headers("tools/call", "silent").items())
        payload = orjson.dumps(body)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{gw.port}\r\n{head}content-length: {len(payload)}\r\n\r\n"
                     .encode() + payload)
        await writer.drain()
        await eventually(lambda: held)
        writer.close()
        await eventually(lambda: _cancellations(server))
        assert _cancellations(server) == [held[0].message["id"]]
        await eventually(held[0].gone.is_set)  # and its stream closed
        await still_serves(http, gw)
