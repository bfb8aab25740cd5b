"""gateway/dispatch.py on FakeBackends (tests/support/fake_backend.py): routing by name and
URI, aggregated lists, `modernize`, and the fleet's server/discover. Over HTTP against real
backends: tests/integration/test_front_door_routing.py, test_fleet.py, test_discover.py."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.backends.base import Reply, internal_call
from gateway.dispatch import Dispatcher, modernize
from gateway.protocol import jsonrpc as rpc
from gateway.protocol.request import Call, parse_call
from gateway.routing.table import RouteTable, Target
from tests.support.fake_backend import FakeBackend, answers, discover_result, progress, stream

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
TOOLS = {"tools": {}}


def request(method: str, **params: Any) -> Call:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 5, "method": method, "params": {**params, "_meta": META}})
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    if "name" in params:
        headers["mcp-name"] = params["name"]
    if "uri" in params:
        headers["mcp-name"] = params["uri"]
    return parse_call(body, headers)


def tool_backend(name: str, tools: list[str], **extra: Any) -> FakeBackend:
    return FakeBackend(answers({
        "server/discover": discover_result(TOOLS),
        "tools/list": {"tools": [{"name": t, "inputSchema": {"type": "object"}} for t in tools],
                       "resultType": "complete", "ttlMs": 1000, "cacheScope": "public"},
        "tools/call": lambda call: {"content": [{"type": "text", "text": f"{name}:{call.name}"}],
                                    "resultType": "complete"},
        **extra,
    }), name=name)


async def fleet(*backends: FakeBackend, prefixes: tuple[str, ...] | None = None) -> Dispatcher:
    prefixes = prefixes or tuple(f"{b.name}__" for b in backends)
    table = RouteTable([Target(b, p) for b, p in zip(backends, prefixes, strict=True)])
    for b in backends:
        await b.discover()
    return Dispatcher(table)


# -- routing ------------------------------------------------------------------------------


async def test_a_named_call_goes_to_the_backend_that_owns_the_prefix_with_its_own_name():
    a, b = tool_backend("a", ["echo"]), tool_backend("b", ["echo"])
    dispatcher = await fleet(a, b)
    reply = await dispatcher.dispatch(request("tools/call", name="b__echo", arguments={}))
    assert reply.message["result"]["content"][0]["text"] == "b:echo"
    assert reply.message["id"] == 5
    sent = [c for c in b.calls if c.method == "tools/call"]
    assert [c.name for c in sent] == ["echo"] and sent[0].params["name"] == "echo"
    assert "tools/call" not in a.methods


async def test_an_unknown_name_is_invalid_params_and_reaches_no_backend():
    a = tool_backend("a", ["echo"])
    dispatcher = await fleet(a)
    with pytest.raises(rpc.McpError) as caught:
        await dispatcher.dispatch(request("tools/call", name="zz__echo", arguments={}))
    assert caught.value.code == rpc.INVALID_PARAMS and caught.value.data == {"name": "zz__echo"}
    assert a.methods == ["server/discover"]


async def test_arguments_that_are_not_an_object_are_refused_before_any_backend():
    a = tool_backend("a", ["echo"])
    dispatcher = await fleet(a)
    with pytest.raises(rpc.McpError) as caught:
        await dispatcher.dispatch(request("tools/call", name="a__echo", arguments=[1, 2]))
    assert caught.value.code == rpc.INVALID_PARAMS and caught.value.status == 400
    assert "tools/call" not in a.methods


async def test_a_read_goes_to_the_backend_that_listed_the_uri():
    docs = FakeBackend(answers({
        "server/discover": discover_result({"resources": {}}),
        "resources/list": {"resources": [{"uri": "docs://readme", "name": "readme"}], "resultType": "complete"},
        "resources/read": {"contents": [{"uri": "docs://readme", "text": "hello"}], "resultType": "complete"},
    }), name="docs")
    other = FakeBackend(answers({"server/discover": discover_result({"resources": {}}),
                                 "resources/list": {"resources": [], "resultType": "complete"}}), name="other")
    dispatcher = await fleet(docs, other)
    await dispatcher.dispatch(request("resources/list"))  # the fleet's URIs are learned from lists
    reply = await dispatcher.dispatch(request("resources/read", uri="docs://readme"))
    assert reply.message["result"]["contents"][0]["text"] == "hello"
    assert "resources/read" not in other.methods


async def test_listen_without_a_hub_is_method_not_found():
    dispatcher = await fleet(tool_backend("a", []))
    with pytest.raises(rpc.McpError) as caught:
        await dispatcher.dispatch(request("subscriptions/listen", notifications={}))
    assert caught.value.code == rpc.METHOD_NOT_FOUND


async def test_a_method_no_backend_advertises_is_method_not_found():
    dispatcher = await fleet(tool_backend("a", []))  # tools only
    with pytest.raises(rpc.McpError) as caught:
        await dispatcher.dispatch(request("prompts/list"))
    assert caught.value.code == rpc.METHOD_NOT_FOUND and caught.value.status == 404


# -- aggregated lists ---------------------------------------------------------------------


async def test_a_list_merges_the_fleet_in_order_with_prefixes_and_the_strictest_freshness():
    a, b = tool_backend("a", ["x", "y"]), tool_backend("b", ["x"])
    b.handler = answers({"server/discover": discover_result(TOOLS),
                         "tools/list": {"tools": [{"name": "x", "inputSchema": {"type": "object"}}],
                                        "resultType": "complete", "ttlMs": 200, "cacheScope": "private"}})
    dispatcher = await fleet(a, b)
    reply = await dispatcher.dispatch(request("tools/list"))
    result = reply.message["result"]
    assert [t["name"] for t in result["tools"]] == ["a__x", "a__y", "b__x"]
    assert result["ttlMs"] == 200 and result["cacheScope"] == "private"
    assert result["resultType"] == "complete" and reply.message["id"] == 5


async def test_a_failing_backend_is_left_out_of_the_list_and_the_answer_is_not_cacheable():
    a = tool_backend("a", ["x"])
    down = tool_backend("down", ["y"])
    dispatcher = await fleet(a, down)

    def unavailable(call: Call) -> Any:
        raise rpc.backend_unavailable("down", "connection refused", call.id)

    down.handler = unavailable
    result = (await dispatcher.dispatch(request("tools/list"))).message["result"]
    assert [t["name"] for t in result["tools"]] == ["a__x"]
    assert result["ttlMs"] == 0


async def test_a_late_backend_is_left_out_after_its_list_timeout():
    a = tool_backend("a", ["x"])
    slow = FakeBackend(answers({"server/discover": discover_result(TOOLS)}), name="slow", list_timeout_seconds=0.05)
    dispatcher = await fleet(a, slow)

    async def never(call: Call) -> Any:
        await asyncio.sleep(10)

    slow.handler = never
    result = (await asyncio.wait_for(dispatcher.dispatch(request("tools/list")), 2)).message["result"]
    assert [t["name"] for t in result["tools"]] == ["a__x"]


# -- modernize ----------------------------------------------------------------------------


def test_modernize_adds_a_missing_result_type_and_keeps_the_same_object_otherwise():
    call = request("tools/call", name="a__t", arguments={})
    bare = {"jsonrpc": "2.0", "id": 5, "result": {"content": []}}
    fixed = modernize(bare, call, "a")
    assert fixed["result"]["resultType"] == "complete" and "resultType" not in bare["result"]
    complete = {"jsonrpc": "2.0", "id": 5, "result": {"content": [], "resultType": "complete"}}
    assert modernize(complete, call, "a") is complete


def test_modernize_maps_the_legacy_resource_not_found_code():
    call = request("resources/read", uri="x://y")
    legacy = {"jsonrpc": "2.0", "id": 5, "error": {"code": rpc.LEGACY_RESOURCE_NOT_FOUND, "message": "gone"}}
    assert modernize(legacy, call, "a")["error"] == {"code": rpc.INVALID_PARAMS, "message": "gone"}


@pytest.mark.parametrize(("method", "params", "result"), [
    ("tools/list", {}, {"resultType": "input_required", "inputRequests": {}}),  # not an MRTR method
    ("tools/call", {"name": "a__t", "arguments": {}}, {"resultType": "task"}),  # tasks not negotiated
    ("tools/call", {"name": "a__t", "arguments": {}}, {"resultType": "surprise"}),
])
def test_modernize_refuses_result_types_the_call_cannot_take(method, params, result):
    with pytest.raises(rpc.McpError) as caught:
        modernize({"jsonrpc": "2.0", "id": 5, "result": result}, request(method, **params), "a")
    assert caught.value.code == rpc.BACKEND_PROTOCOL_ERROR and caught.value.data == {"backend": "a"}


async def test_a_whole_answer_forwarded_is_what_modernize_makes_of_it():
    """`_forward` passes a `"resultType": "complete"` answer on without calling `modernize`:
    for every kind of answer the reply is modernize's (the same object when it keeps it), or
    the same refusal."""
    a = tool_backend("a", ["t"])
    dispatcher = await fleet(a)
    answers_ = [{"content": [], "resultType": "complete"}, {"content": []}, {"content": [], "resultType": "task"},
                {"content": [], "resultType": "surprise"}, {"content": [], "resultType": "input_required"},
                {"error": {"code": rpc.LEGACY_RESOURCE_NOT_FOUND, "message": "gone"}},
                {"error": {"code": -32000, "message": "no"}}, {"result": "done"}]
    for answer in answers_:
        message = {"jsonrpc": "2.0", "id": 5, **answer} if "error" in answer or "result" in answer else {
            "jsonrpc": "2.0", "id": 5, "result": answer}
        a.handler = lambda call, message=message: Reply("a", message=message)
        call = request("tools/call", name="a__t", arguments={})
        try:
            expected: Any = modernize(message, call, "a")
        except rpc.McpError as exc:
            expected = exc
        try:
            got: Any = (await dispatcher.dispatch(call)).message
        except rpc.McpError as exc:
            got = exc
        if isinstance(expected, rpc.McpError):
            assert isinstance(got, rpc.McpError) and (got.code, got.message) == (expected.code, expected.message)
        else:
            assert got == expected and (got is message) == (expected is message), answer


def test_modernize_refuses_an_answer_with_neither_result_nor_error_object():
    with pytest.raises(rpc.McpError) as caught:
        modernize({"jsonrpc": "2.0", "id": 5, "result": "done"}, request("tools/list"), "a")
    assert caught.value.code == rpc.BACKEND_PROTOCOL_ERROR


async def test_a_streamed_answer_is_modernized_and_drops_requests_and_unasked_logs():
    a = tool_backend("a", ["t"])
    dispatcher = await fleet(a)
    log = rpc.notification("notifications/message", {"level": "info", "data": "x"})
    server_request = {"jsonrpc": "2.0", "id": 99, "method": "sampling/createMessage", "params": {}}
    a.handler = answers({"tools/list": {"tools": [{"name": "t", "inputSchema": {"type": "object"}}],
                                        "resultType": "complete"},
                         "tools/call": stream(progress(1), log, server_request, {"content": []})})
    reply = await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    got = [m async for m in reply.stream]
    assert [m.get("method") for m in got] == ["notifications/progress", None]
    assert got[-1]["result"] == {"content": [], "resultType": "complete"}
    assert a.closed_streams == 1


async def test_a_call_is_counted_in_flight_until_its_stream_ends_or_is_dropped_unread():
    """What a reload's drain waits for (Backend.drain): a stream never read must not stay
    counted, or the drain would wait out its deadline for nothing."""
    a = tool_backend("a", ["t"])
    dispatcher = await fleet(a)
    a.handler = answers({"tools/list": {"tools": [{"name": "t", "inputSchema": {"type": "object"}}],
                                        "resultType": "complete"},
                         "tools/call": stream(progress(1), {"content": []})})
    read = await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    assert a.in_flight == 1
    assert [m async for m in read.stream][-1]["result"]["content"] == []
    assert a.in_flight == 0
    dropped = await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    assert a.in_flight == 1
    await dropped.aclose()
    await dropped.aclose()
    assert a.in_flight == 0, "a stream dropped unread is no longer under way, and counted down once"


async def test_a_whole_answer_or_a_failure_is_counted_in_flight_only_while_under_way():
    """`_forward` counts a whole answer itself (no _UnderWay object): it is uncounted once the
    answer is in, when the backend fails, and when the answer is not a valid modern one."""
    a = tool_backend("a", ["t"])
    dispatcher = await fleet(a)
    seen: list[int] = []

    def answer(call: Call) -> dict[str, Any]:
        seen.append(a.in_flight)
        return {"content": [], "resultType": "complete"}

    a.handler = answers({"tools/call": answer})
    await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    assert seen == [1] and a.in_flight == 0
    a.handler = answers({"tools/call": lambda call: {"content": [], "resultType": "bogus"}})
    with pytest.raises(rpc.McpError):
        await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    assert a.in_flight == 0
    a.handler = answers({})  # method not found: the backend's own error, a whole answer too
    await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    assert a.in_flight == 0

    def unreachable(call: Call) -> dict[str, Any]:
        raise rpc.backend_unavailable("a", "connection refused", call.id)

    a.handler = unreachable
    with pytest.raises(rpc.McpError):
        await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    assert a.in_flight == 0


async def test_a_success_through_the_dispatcher_resets_its_endpoint_only_when_whole_calls_report():
    """`_send` reports a success to `health.single` itself (BackendHealth.succeeded, inline): a
    success after failures puts the one endpoint's count back to 0, as `succeeded()` does, and
    once the backend reports per endpoint the dispatcher's success changes nothing."""
    a = tool_backend("a", ["t"], health={"consecutive_failures": 10})
    dispatcher = await fleet(a)
    ok = a.handler

    def unreachable(call: Call) -> dict[str, Any]:
        raise rpc.backend_unavailable("a", "connection refused", call.id)

    endpoint = a.health.endpoints[0]
    for per_endpoint in (False, True):
        if per_endpoint:
            a.health.reported_per_endpoint()
            endpoint.failures = 2  # what the backend itself reported of that endpoint (still up)
        else:
            a.handler = unreachable
            for _ in range(2):
                with pytest.raises(rpc.McpError):
                    await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
            assert endpoint.failures >= 2 and endpoint.up is False  # (retries are failures too)
        a.handler = ok
        await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
        assert (endpoint.failures, endpoint.up) == ((2, True) if per_endpoint else (0, True))


async def test_a_stream_that_ends_without_a_response_is_a_protocol_error():
    a = tool_backend("a", ["t"])
    dispatcher = await fleet(a)
    a.handler = answers({"tools/list": {"tools": [{"name": "t", "inputSchema": {"type": "object"}}],
                                        "resultType": "complete"},
                         "tools/call": stream(progress(1))})
    reply = await dispatcher.dispatch(request("tools/call", name="a__t", arguments={}))
    with pytest.raises(rpc.McpError) as caught:
        _ = [m async for m in reply.stream]
    assert caught.value.code == rpc.BACKEND_PROTOCOL_ERROR and caught.value.request_id == 5


# -- server/discover of the fleet ---------------------------------------------------------


async def test_the_fleet_discover_merges_capabilities_and_leaves_out_a_failing_backend():
    tools = tool_backend("a", [])
    prompts = FakeBackend(answers({"server/discover": discover_result({"prompts": {"listChanged": True}})}), name="p")
    down = FakeBackend(answers({}), name="down")  # -32601 for server/discover: not a DiscoverResult
    dispatcher = Dispatcher(RouteTable([Target(tools, "a__"), Target(prompts, "p__"), Target(down, "d__")]))
    reply = await dispatcher.dispatch(internal_call("server/discover", request_id=3))
    result = reply.message["result"]
    assert result["capabilities"] == {"tools": {}, "prompts": {"listChanged": True}}
    assert result["resultType"] == "complete" and reply.message["id"] == 3
