"""gateway/subscriptions/poll.py: what is polled, when, and what a change publishes, driven in
process with a backend whose answers the test sets (over HTTP, against real backends:
tests/integration/test_listen_polling.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends.base import Backend, Reply
from gateway.protocol import jsonrpc as rpc
from gateway.settings import BackendSettings
from gateway.subscriptions.filters import SubscriptionFilter
from gateway.subscriptions.poll import PollSettings, Poller, minus, native_part, pollable, refuses_listen


class Answers(Backend):
    """Answers each method from `self.results` (a result, an error message, or an exception)."""

    def __init__(self) -> None:
        super().__init__(BackendSettings(name="b", url="http://127.0.0.1:1/mcp", list_timeout_seconds=1))
        self.results: dict[str, Any] = {}
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def send(self, call) -> Reply:
        params = {k: v for k, v in call.params.items() if k != "_meta"}
        self.asked.append((call.method, params))
        answer = self.results[call.method]
        if callable(answer):
            answer = answer(params)
        if isinstance(answer, Exception):
            raise answer
        if "code" in answer:
            return Reply("b", message={"jsonrpc": "2.0", "id": call.id, "error": answer})
        return Reply("b", message={"jsonrpc": "2.0", "id": call.id, "result": answer})


def tools(*names: str, ttl: int = 60_000, **extra: Any) -> dict[str, Any]:
    return {"tools": [{"name": n} for n in names], "ttlMs": ttl, "resultType": "complete", **extra}


SETTINGS = PollSettings(True, 1.0, 10.0)
LISTS = SubscriptionFilter(lists=frozenset({"toolsListChanged"}))


async def poller(backend: Answers, watch: SubscriptionFilter = LISTS) -> tuple[Poller, list[dict[str, Any]]]:
    published: list[dict[str, Any]] = []

    async def publish(message: dict[str, Any]) -> None:
        published.append(message)

    p = Poller(backend, watch, SETTINGS, publish)
    await p.baseline()
    return p, published


async def poll_all(p: Poller) -> list[bool]:
    return [await p._poll(part) for part in list(p.parts)]


def test_what_can_be_polled_and_what_is_asked_natively():
    caps = {"tools": {"listChanged": True}, "prompts": {}, "resources": {"subscribe": False}}
    assert pollable(caps) == (frozenset({"toolsListChanged", "promptsListChanged", "resourcesListChanged"}), True)
    assert pollable({"tools": {}}) == (frozenset({"toolsListChanged"}), False)
    assert pollable(None) == (frozenset(), False)
    wanted = SubscriptionFilter(frozenset({"toolsListChanged", "promptsListChanged"}), frozenset({"x://1"}))
    assert native_part(caps, wanted) == SubscriptionFilter(frozenset({"toolsListChanged"}))
    assert minus(wanted, native_part(caps, wanted)) == SubscriptionFilter(frozenset({"promptsListChanged"}),
                                                                          frozenset({"x://1"}))
    assert refuses_listen(rpc.backend_refused("b", 404, b""))
    assert refuses_listen(rpc.backend_refused("b", 405, b""))
    assert not refuses_listen(rpc.backend_refused("b", 403, b""))
    assert not refuses_listen(rpc.backend_unavailable("b", "connection refused"))


async def test_a_change_in_any_page_publishes_once_and_the_envelope_does_not_count():
    backend = Answers()
    pages = {None: tools("a", nextCursor="2"), "2": tools("b")}
    backend.results["tools/list"] = lambda params: pages[params.get("cursor")]
    p, published = await poller(backend)
    assert [m for m, _ in backend.asked] == ["tools/list", "tools/list"]  # every page
    pages[None] = tools("a", ttl=5, nextCursor="other", _meta={"io.modelcontextprotocol/serverInfo": {}})
    pages["other"] = tools("b")
    assert await poll_all(p) == [False]  # new ttl, cursor and _meta: the same list
    pages["other"] = tools("b", "c")
    assert await poll_all(p) == [True]


async def test_resources_lists_share_one_notification_and_reads_notify_their_uri():
    backend = Answers()
    backend.results.update({
        "resources/list": {"resources": [{"uri": "x://1"}], "ttlMs": 0},
        "resources/templates/list": {"resourceTemplates": [], "ttlMs": 0},
        "resources/read": {"contents": [{"uri": "x://1", "text": "v1"}], "ttlMs": 0},
    })
    watch = SubscriptionFilter(frozenset({"resourcesListChanged"}), frozenset({"x://1"}))
    p, published = await poller(backend, watch)
    assert sorted(p.parts[i].what for i in range(3)) == ["resources/list", "resources/read x://1",
                                                         "resources/templates/list"]
    backend.results["resources/list"] = {"resources": [{"uri": "x://1"}, {"uri": "x://2"}], "ttlMs": 0}
    backend.results["resources/templates/list"] = {"resourceTemplates": [{"uriTemplate": "x://{id}"}], "ttlMs": 0}
    backend.results["resources/read"] = {"contents": [{"uri": "x://1", "text": "v2"}], "ttlMs": 0}
    for part in p.parts:
        part.due = 0
    runner = asyncio.create_task(p.run())
    for _ in range(100):
        if len(published) >= 2:
            break
        await asyncio.sleep(0.01)
    runner.cancel()
    assert sorted(m["method"] for m in published) == ["notifications/resources/list_changed",
                                                      "notifications/resources/updated"]
    assert [m["params"] for m in published if m["method"].endswith("updated")] == [{"uri": "x://1"}]


async def test_the_interval_follows_ttl_within_the_bounds_with_jitter():
    backend = Answers()
    p, _ = await poller(backend, SubscriptionFilter())
    for _ in range(200):
        assert 0.9 <= p._interval(0) <= 1.1  # below the minimum: the minimum
        assert 4.5 <= p._interval(5_000) <= 5.5
        assert 9.0 <= p._interval(3_600_000) <= 11.0  # above the maximum: the maximum
        assert 0.9 <= p._interval(None) <= 1.1  # no ttlMs: as 0 (immediately stale)


async def test_failures_back_off_and_keep_the_digest_so_an_outage_hides_no_change():
    backend = Answers()
    backend.results["tools/list"] = tools("a")
    p, published = await poller(backend)
    (part,) = p.parts
    backend.results["tools/list"] = rpc.backend_unavailable("b", "connection refused")
    waits = []
    for _ in range(5):
        assert await p._poll(part) is False
        waits.append(part.due - asyncio.get_running_loop().time())
    # Doubling from the minimum (±10 %), capped at the maximum.
    for wait, expected in zip(waits, (2, 4, 8, 10, 10), strict=True):
        assert 0.9 * expected <= wait <= 1.1 * expected, waits
    backend.results["tools/list"] = tools("a", "changed while down")
    assert await p._poll(part) is True
    assert part.failures == 0


async def test_a_list_the_backend_lacks_is_dropped_and_an_error_answer_is_a_state():
    backend = Answers()
    backend.results.update({
        "resources/list": {"resources": [], "ttlMs": 0},
        "resources/templates/list": {"code": -32601, "message": "Method not found"},
        "resources/read": {"code": -32602, "message": "Resource not found (request 17)"},
    })
    p, _ = await poller(backend, SubscriptionFilter(frozenset({"resourcesListChanged"}), frozenset({"x://gone"})))
    assert sorted(part.what for part in p.parts) == ["resources/list", "resources/read x://gone"]
    read = next(part for part in p.parts if part.uri)
    backend.results["resources/read"] = {"code": -32602, "message": "Resource not found (request 18)"}
    assert await p._poll(read) is False  # the same error (its message aside): no change
    backend.results["resources/read"] = {"contents": [{"uri": "x://gone", "text": "back"}]}
    assert await p._poll(read) is True


@pytest.mark.parametrize(("lo", "hi", "ok"), [(5, 300, True), (1, 1, True), (10, 5, False)])
def test_poll_bounds_are_validated(lo, hi, ok):
    from gateway.settings import ConfigError, load_settings

    if ok:
        load_settings(None, subscriptions={"poll_min_seconds": lo, "poll_max_seconds": hi})
    else:
        with pytest.raises(ConfigError, match="poll_max_seconds"):
            load_settings(None, subscriptions={"poll_min_seconds": lo, "poll_max_seconds": hi})


# -- the upstream listen: what it asks natively, what it polls, what it publishes -------------


class Listener(Answers):
    """Answers `subscriptions/listen` with a stream: an ack granting `self.grant`, then whatever
    the test puts on `self.stream`."""

    def __init__(self, capabilities: dict[str, Any], grant: dict[str, Any]) -> None:
        super().__init__()
        self._discovered = {"capabilities": capabilities}
        self.grant = grant
        self.stream: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def send(self, call) -> Reply:
        if call.method != "subscriptions/listen":
            return await super().send(call)
        self.asked.append((call.method, {k: v for k, v in call.params.items() if k != "_meta"}))

        async def events():
            yield rpc.notification("notifications/subscriptions/acknowledged", {"notifications": self.grant})
            while True:
                yield await self.stream.get()

        return Reply("b", stream=events())


async def upstream_events(backend: Backend, wanted: SubscriptionFilter):
    from gateway.subscriptions.bus import LocalBus
    from gateway.subscriptions.upstream import StreamKey, Timing, UpstreamListen

    events: list[dict[str, Any]] = []

    async def heard(event: dict[str, Any]) -> None:
        events.append(event)

    bus = LocalBus(tick_seconds=0.05)
    await bus.start(heard, lambda: asyncio.sleep(0))
    stream = UpstreamListen(StreamKey("b", wanted), backend, bus, Timing(poll=PollSettings(True, 0.05, 0.05)),
                            retire=lambda s: False)
    stream.attach(object())  # a client, so that the holder keeps it
    stream.start()
    return stream, events


async def until(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_what_the_ack_leaves_out_is_polled_beside_the_native_stream():
    caps = {"tools": {"listChanged": True}, "prompts": {"listChanged": True}}
    backend = Listener(caps, grant={"toolsListChanged": True})  # its ack leaves prompts out
    backend.results["prompts/list"] = {"prompts": [{"name": "p"}], "ttlMs": 0}
    wanted = SubscriptionFilter(lists=frozenset({"toolsListChanged", "promptsListChanged"}))
    stream, events = await upstream_events(backend, wanted)
    try:
        await until(lambda: any(e["t"] == "ack" for e in events))
        assert backend.asked[0] == ("subscriptions/listen", {"notifications": {"toolsListChanged": True,
                                                                               "promptsListChanged": True}})
        (ack,) = [e for e in events if e["t"] == "ack"]
        assert ack["f"] == {"toolsListChanged": True, "promptsListChanged": True}  # granted + polled
        assert ("prompts/list", {}) in backend.asked and ("tools/list", {}) not in backend.asked
        await backend.stream.put(rpc.notification("notifications/tools/list_changed"))  # native
        backend.results["prompts/list"] = {"prompts": [{"name": "p"}, {"name": "q"}], "ttlMs": 0}  # polled
        await until(lambda: len([e for e in events if e["t"] == "event"]) >= 2)
        assert sorted(e["m"]["method"] for e in events if e["t"] == "event") == [
            "notifications/prompts/list_changed", "notifications/tools/list_changed"]
    finally:
        await stream.aclose()


async def test_nothing_native_to_ask_means_no_listen_at_all():
    backend = Listener({"tools": {}}, grant={})  # tools without listChanged
    backend.results["tools/list"] = tools("a", ttl=0)
    stream, events = await upstream_events(backend, SubscriptionFilter(lists=frozenset({"toolsListChanged"})))
    try:
        await until(lambda: any(e["t"] == "ack" for e in events))
        assert [m for m, _ in backend.asked if m == "subscriptions/listen"] == []
        backend.results["tools/list"] = tools("a", "b", ttl=0)
        await until(lambda: any(e["t"] == "event" for e in events))
    finally:
        await stream.aclose()


async def test_a_listen_refused_as_not_found_is_polled():
    class NotFound(Answers):
        async def send(self, call) -> Reply:
            if call.method == "subscriptions/listen":
                self.asked.append((call.method, {}))
                raise rpc.backend_refused("b", 404, b"Not Found")
            return await super().send(call)

    backend = NotFound()
    backend._discovered = {"capabilities": {"tools": {"listChanged": True}}}
    backend.results["tools/list"] = tools("a", ttl=0)
    stream, events = await upstream_events(backend, SubscriptionFilter(lists=frozenset({"toolsListChanged"})))
    try:
        await until(lambda: any(e["t"] == "ack" for e in events))
        assert [e["f"] for e in events if e["t"] == "ack"] == [{"toolsListChanged": True}]
        backend.results["tools/list"] = tools("b", ttl=0)
        await until(lambda: any(e["t"] == "event" for e in events))
        assert len([m for m, _ in backend.asked if m == "subscriptions/listen"]) == 1  # not asked again
    finally:
        await stream.aclose()
