"""Live reload inside one process, where the runtime can be looked at: which Backend objects
carry over, what the route table keeps, the cache after a backend's settings changed, the
notification a prefix change owes listeners, and a refusal that leaves the snapshot alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.readiness import BackendState
from gateway.reload.reloader import Reloader
from gateway.settings import ConfigError, GatewaySettings, load_settings
from tests.support import mcp_http
from tests.support.gateway import running_gateway
from tests.support.listen import ListenReader
from tests.support.scripted import Scripted


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Scripted]]:
    started = {name: Scripted(name).start() for name in ("one", "two")}
    yield started
    for server in started.values():
        server.stop()


def settings(servers: dict[str, Scripted], *names: str, **changes: dict[str, Any]) -> GatewaySettings:
    return load_settings(None, backends=[{"name": n, "url": servers[n].url, "era": "modern", **changes.get(n, {})}
                                         for n in names],
                         subscriptions={"poll_min_seconds": 1.0})


class Source:
    """What the reloader reads: the settings a test sets next, or a refusal."""

    def __init__(self, first: GatewaySettings) -> None:
        self.next: GatewaySettings | ConfigError = first

    def __call__(self) -> GatewaySettings:
        if isinstance(self.next, ConfigError):
            raise self.next
        return self.next


async def test_a_changed_backend_is_rebuilt_and_its_cached_answers_are_not_served(servers):
    first = settings(servers, "one", "two")
    async with running_gateway(first) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        source = Source(first)
        reloader = Reloader(gw.runtime, source)
        one, two = gw.runtime.backends
        # Learned before the reload: a URI `two` listed, and the answer cached.
        gw.runtime.table.learn_resources(gw.runtime.table.by_name["two"], [{"uri": "scripted://two/x"}])
        listed = await mcp_http.post(client, gw.url, "tools/list")
        assert listed.headers.get("x-cache") in ("miss", None)
        again = await mcp_http.post(client, gw.url, "tools/list")
        assert again.headers["x-cache"] == "hit"

        source.next = settings(servers, "one", "two", one={"headers": {"X-Tenant": "b"}})
        assert await reloader.reload("test") == "applied"
        new_one, same_two = gw.runtime.backends
        assert same_two is two and new_one is not one, "only the backend whose settings changed is rebuilt"
        assert gw.runtime.snapshot.generation == 1 and gw.app.runtime.live.snapshot is gw.runtime.snapshot
        # The kept backend's learned routes carried over; the changed one's cached list did not.
        assert gw.runtime.table.resolve_uri("scripted://two/x").backend is two
        after = await mcp_http.post(client, gw.url, "tools/list")
        assert after.headers["x-cache"] != "hit", "an answer keyed by the old settings was served after the change"
        assert after.json()["result"]["tools"]

        source.next = settings(servers, "one", "two", one={"headers": {"X-Tenant": "b"}})
        assert await reloader.reload("test") == "unchanged"
        assert gw.runtime.snapshot.generation == 1


async def test_a_refused_config_leaves_the_snapshot_serving(servers, caplog):
    first = settings(servers, "one")
    async with running_gateway(first) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        source = Source(first)
        reloader = Reloader(gw.runtime, source)
        snapshot = gw.runtime.snapshot
        source.next = ConfigError([("backends.0.url", "must be an http(s) URL")])
        assert await reloader.reload("test") == "refused"
        assert gw.runtime.snapshot is snapshot
        answer = await mcp_http.post(client, gw.url, "tools/call", {"name": "echo", "arguments": {"text": "x"}})
        assert answer.json()["result"]["content"][0]["text"] == "one: x"
    assert "backends.0.url: must be an http(s) URL" in caplog.text


async def test_a_prefix_change_tells_listeners_the_tool_names_changed(servers):
    # Alone, `one` has no prefix; with `two` beside it its tools become one__*: the names a
    # client sees changed although `one` itself did not.
    first = settings(servers, "one")
    async with running_gateway(first) as gw, httpx.AsyncClient(trust_env=False, timeout=10) as client:
        source = Source(first)
        reloader = Reloader(gw.runtime, source)
        (one,) = gw.runtime.backends
        reader = await ListenReader(client, gw.url, {"toolsListChanged": True}).open()
        try:
            source.next = settings(servers, "one", "two")
            assert await reloader.reload("test") == "applied"
            assert gw.runtime.backends[0] is one
            await reader.wait(lambda: any(m.get("method") == "notifications/tools/list_changed"
                                          for m in reader.notifications), timeout=10)
            assert not reader.ended
            names = {t["name"] for t in (await mcp_http.post(client, gw.url, "tools/list")).json()["result"]["tools"]}
            assert "one__echo" in names and "echo" not in names
        finally:
            await reader.close()


async def test_health_checks_and_readiness_follow_the_fleet(servers):
    """A replaced backend's active checks stop and the new object's start; /readyz reads the
    new object's health, so the one leaving no longer decides its name's state (that name may
    be the new backend's now)."""
    checked = {"health": {"check_interval_seconds": 5.0}}
    first = settings(servers, "one", "two", one=checked, two=checked)
    async with running_gateway(first) as gw:
        source = Source(first)
        reloader = Reloader(gw.runtime, source)
        one, two = gw.runtime.backends
        checks = gw.runtime.health_checks
        assert set(checks._tasks) == {one, two}
        old_tasks = dict(checks._tasks)

        source.next = settings(servers, "one", one={**checked, "headers": {"X-Tenant": "b"}})
        assert await reloader.reload("test") == "applied"
        (new_one,) = gw.runtime.backends
        assert new_one is not one
        assert set(checks._tasks) == {new_one}, "the removed and replaced backends' checks must stop"
        assert old_tasks[one].done() and old_tasks[two].done()
        # What the replaced object still reports while it drains leaves /readyz alone.
        for endpoint in new_one.health.endpoints:
            endpoint.check_passed()
        for endpoint in one.health.endpoints:
            for _ in range(5):
                endpoint.check_failed("gone")
        assert gw.runtime.readiness.state("one") is BackendState.OK
        assert "two" not in gw.runtime.readiness.report()["backends"]
