"""TokenSource on a hand-moved clock: when a token is used, refreshed and dropped; one fetch
shared by concurrent callers; a failed background refresh leaves the good token serving."""

from __future__ import annotations

import asyncio

import pytest

from gateway.backends.credentials import SessionHeaders, TokenSource, static_headers
from gateway.settings import BackendSettings
from tests.support.clock import ManualClock


class Fetcher:
    def __init__(self, lifetime: float | None = 100.0) -> None:
        self.calls = 0
        self.lifetime = lifetime
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> tuple[str, float | None]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("the AS is down")
        return f"t{self.calls}", self.lifetime


def source(fetch: Fetcher, clock: ManualClock, refresh_before: float = 30.0) -> TokenSource:
    return TokenSource(fetch, refresh_before=refresh_before, default_lifetime=50.0, clock=clock)


async def test_used_until_refresh_time_then_refreshed_in_the_background_then_replaced():
    clock, fetch = ManualClock(), Fetcher(lifetime=100.0)
    tokens = source(fetch, clock)
    assert tokens.current() is None
    assert await tokens.get() == "Bearer t1"
    clock.now += 69
    assert tokens.current() == "Bearer t1" and fetch.calls == 1  # refresh at 70 s (100 - 30)
    clock.now += 2
    assert tokens.current() == "Bearer t1"  # still good: the refresh starts beside it
    await asyncio.sleep(0)
    assert fetch.calls == 2
    assert tokens.current() == "Bearer t2"


async def test_never_used_in_its_last_seconds():
    clock, fetch = ManualClock(), Fetcher(lifetime=100.0)
    tokens = source(fetch, clock, refresh_before=0)
    await tokens.get()
    clock.now += 95.5  # within the 5 s safety margin
    assert tokens.current() is None


async def test_concurrent_callers_share_one_fetch():
    clock, fetch = ManualClock(), Fetcher()
    fetch.gate = asyncio.Event()
    tokens = source(fetch, clock)
    waiting = [asyncio.ensure_future(tokens.get()) for _ in range(50)]
    await asyncio.sleep(0.01)
    fetch.gate.set()
    assert set(await asyncio.gather(*waiting)) == {"Bearer t1"}
    assert fetch.calls == 1


async def test_a_failed_background_refresh_keeps_the_good_token_and_a_failed_fetch_raises():
    clock, fetch = ManualClock(), Fetcher(lifetime=100.0)
    tokens = source(fetch, clock)
    await tokens.get()
    fetch.fail = True
    clock.now += 80
    assert tokens.current() == "Bearer t1"
    await asyncio.sleep(0)
    assert tokens.current() == "Bearer t1"  # the refresh failed; the token is still good
    clock.now += 20
    with pytest.raises(RuntimeError):
        await tokens.get()


async def test_invalidate_drops_only_the_refused_token_and_no_expiry_means_the_default_lifetime():
    clock, fetch = ManualClock(), Fetcher(lifetime=None)
    tokens = source(fetch, clock)
    await tokens.get()
    tokens.invalidate("Bearer something-else")
    assert tokens.current() == "Bearer t1"
    tokens.invalidate("Bearer t1")
    assert tokens.current() is None
    assert await tokens.get() == "Bearer t2"
    clock.now += 50
    assert tokens.current() is None  # default_lifetime_seconds


def test_static_and_session_headers_reveal_only_to_the_request_builder():
    settings = BackendSettings(name="a", url="http://127.0.0.1:1/mcp", headers={"X-Tenant": "t"},
                               auth={"type": "headers", "headers": {"x-api-key": "k-secret"}})
    assert static_headers(settings) == {"x-tenant": "t", "x-api-key": "k-secret"}
    from gateway.backends.credentials import credentials_for

    headers = SessionHeaders(credentials_for(settings), "")
    assert dict(headers) == {"x-tenant": "t", "x-api-key": "k-secret"}
    assert "k-secret" not in repr(headers)
