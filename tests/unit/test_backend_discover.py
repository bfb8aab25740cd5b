"""`Backend.discover`: the cached DiscoverResult, the failure memory and `stale_ok`, on a
FakeBackend and a ManualClock (tests/support/clock.py). Over HTTP: tests/integration/test_discover.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends.base import DISCOVER_FAILURE_MEMORY_SECONDS
from gateway.protocol import jsonrpc as rpc
from tests.support.clock import ManualClock
from tests.support.fake_backend import FakeBackend, discover_result


class Switch:
    """server/discover answers while `up`, else the backend is unreachable."""

    def __init__(self) -> None:
        self.up = True

    def __call__(self, call: Any) -> Any:
        assert call.method == "server/discover"
        if not self.up:
            raise rpc.backend_unavailable("fake", "connection refused")
        return discover_result({"tools": {}})


def backend(**settings: Any) -> tuple[FakeBackend, Switch, ManualClock]:
    switch, clock = Switch(), ManualClock()
    # No retries: these tests count the discoveries asked (a retry is backends/retry.py's).
    fake = FakeBackend(switch, **{"retries": 0, **settings})
    fake.clock = clock
    return fake, switch, clock


async def test_a_result_is_reused_until_it_is_older_than_max_age():
    fake, _, clock = backend()
    first = await fake.discover(max_age=60)
    assert fake.capabilities == {"tools": {}}
    clock.now += 59
    assert await fake.discover(max_age=60) is first
    assert len(fake.calls) == 1
    clock.now += 2
    await fake.discover(max_age=60)
    assert len(fake.calls) == 2


async def test_a_failure_is_remembered_for_a_few_seconds_then_asked_again():
    fake, switch, clock = backend()
    switch.up = False
    with pytest.raises(rpc.McpError) as first:
        await fake.discover()
    assert first.value.code == rpc.BACKEND_UNAVAILABLE and fake.last_error == first.value.message
    clock.now += DISCOVER_FAILURE_MEMORY_SECONDS - 0.5
    switch.up = True  # back, but the memory answers until it expires
    with pytest.raises(rpc.McpError) as remembered:
        await fake.discover()
    assert len(fake.calls) == 1
    assert remembered.value is not first.value and remembered.value.message == first.value.message
    clock.now += 1
    assert (await fake.discover())["capabilities"] == {"tools": {}}
    assert len(fake.calls) == 2 and fake.last_error is None


async def test_max_age_zero_skips_the_failure_memory():
    fake, switch, _ = backend()
    switch.up = False
    for _ in range(2):
        with pytest.raises(rpc.McpError):
            await fake.discover(max_age=0)
    assert len(fake.calls) == 2


async def test_a_remembered_failure_takes_each_request_id():
    fake, switch, _ = backend()
    switch.up = False
    with pytest.raises(rpc.McpError):
        await fake.discover()
    errors = []
    for request_id in (1, 2):
        with pytest.raises(rpc.McpError) as caught:
            await fake.discover()
        errors.append(caught.value.with_id(request_id))
    assert [e.request_id for e in errors] == [1, 2]


async def test_stale_ok_serves_the_last_result_when_a_refresh_fails_and_while_it_is_remembered():
    fake, switch, clock = backend()
    known = await fake.discover()
    switch.up = False
    clock.now += 3600
    assert await fake.discover(max_age=60, stale_ok=True) is known  # refresh failed: last known
    assert len(fake.calls) == 2
    assert await fake.discover(max_age=60, stale_ok=True) is known  # remembered: not asked again
    assert len(fake.calls) == 2
    with pytest.raises(rpc.McpError):
        await fake.discover(max_age=60)  # without stale_ok the failure is raised


async def test_a_refresh_gets_list_timeout_seconds():
    fake, _, _ = backend(list_timeout_seconds=0.05)

    async def hangs(call: Any) -> Any:
        await asyncio.sleep(10)

    fake.handler = hangs
    with pytest.raises(rpc.McpError) as caught:
        await asyncio.wait_for(fake.discover(), 2)
    assert caught.value.code == rpc.BACKEND_TIMEOUT and caught.value.status == 504
    assert caught.value.data == {"backend": "fake"}


async def test_callers_at_once_share_one_refresh():
    fake, _, _ = backend()
    gate = asyncio.Event()

    async def slow(call: Any) -> Any:
        await gate.wait()
        return discover_result({})

    fake.handler = slow
    waiting = [asyncio.ensure_future(fake.discover()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*waiting)
    assert len(fake.calls) == 1 and all(r is results[0] for r in results)
