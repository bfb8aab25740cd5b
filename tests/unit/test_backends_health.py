"""The health state machine (gateway/backends/health.py) on a hand-moved clock: ejection after
consecutive failures, growing ejections, half-open trials, active checks, the cap on ejected
endpoints, and what it tells its listeners."""

from __future__ import annotations

import types

import pytest

from gateway.backends import health as health_module
from gateway.backends.health import BackendHealth
from gateway.protocol import jsonrpc as rpc
from gateway.settings import HealthSettings
from tests.support.clock import ManualClock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    clock = ManualClock(start=1000.0)
    monkeypatch.setattr(health_module, "time", types.SimpleNamespace(monotonic=clock))
    return clock


def make(*endpoints: str, **settings: object) -> BackendHealth:
    defaults = {"consecutive_failures": 3, "base_ejection_seconds": 10.0, "max_ejection_seconds": 25.0,
                "failed_checks": 2}
    return BackendHealth("b", HealthSettings(**{**defaults, **settings}), endpoints or ("default",))


def test_consecutive_failures_eject_and_a_success_resets_the_count(clock):
    h = make()
    h.failed("x")
    h.failed("x")
    h.succeeded()
    h.failed("x")
    h.failed("x")
    assert not h.ejected
    h.failed("boom")
    assert h.ejected
    with pytest.raises(rpc.McpError) as caught:
        h.admit(7)
    error = caught.value
    assert error.code == rpc.BACKEND_UNAVAILABLE and error.request_id == 7
    assert error.data == {"backend": "b", "reason": "3 consecutive failures (last: boom)"}
    assert h.state() == "3 consecutive failures (last: boom)"


def test_half_open_lets_one_trial_through_and_its_success_restores(clock):
    h = make()
    for _ in range(3):
        h.failed("x")
    clock.now += 9.9
    with pytest.raises(rpc.McpError):
        h.admit()
    clock.now += 0.2
    h.admit()  # the trial
    with pytest.raises(rpc.McpError):
        h.admit()  # others keep failing fast while it runs
    h.succeeded()
    assert not h.ejected and h.state() == "ok"
    h.admit()


def test_a_failed_trial_ejects_again_for_longer_up_to_the_cap(clock):
    h = make()
    for _ in range(3):
        h.failed("x")
    endpoint = h.endpoints[0]
    assert endpoint.ejected_until == pytest.approx(clock.now + 10)
    clock.now += 10
    h.admit()
    h.failed("still down")
    assert endpoint.ejected_until == pytest.approx(clock.now + 20)
    clock.now += 20
    h.admit()
    h.failed("still down")
    assert endpoint.ejected_until == pytest.approx(clock.now + 25)  # capped


def test_a_trial_whose_caller_vanished_does_not_keep_it_out_forever(clock):
    h = make()
    for _ in range(3):
        h.failed("x")
    clock.now += 10
    h.admit()  # the trial, never reported
    clock.now += 9
    with pytest.raises(rpc.McpError):
        h.admit()
    clock.now += 1.1
    h.admit()  # a new trial


def test_failed_checks_eject_and_a_passing_check_ends_an_ejection_at_once(clock):
    h = make()
    endpoint = h.endpoints[0]
    endpoint.check_failed("no")
    assert not h.ejected and h.state() == "health check failed: no"
    endpoint.check_failed("no")
    assert h.ejected
    endpoint.check_passed()
    assert not h.ejected and h.state() == "ok"


def test_listeners_hear_each_change_once(clock):
    h = make()
    heard: list[tuple[str, bool, str | None]] = []
    h.listeners.append(lambda name, up, reason: heard.append((name, up, reason)))
    h.succeeded()
    h.succeeded()
    for _ in range(5):
        h.failed("x")
    h.endpoints[0].check_passed()
    assert heard == [("b", True, None), ("b", False, "3 consecutive failures (last: x)"), ("b", True, None)]


def test_the_share_of_endpoints_ejected_at_once_is_capped(clock):
    h = make("a", "b", "c", "d", max_ejected_percent=50)
    a, b, c, d = h.endpoints
    for endpoint in (a, b, c):
        for _ in range(3):
            endpoint.failed("x")
    assert a.ejected and b.ejected and not c.ejected  # 2 of 4 is the cap
    assert not h.ejected
    h.admit()


def test_one_endpoint_may_always_be_ejected(clock):
    h = make("a", "b", max_ejected_percent=0)
    a, b = h.endpoints
    for endpoint in (a, b):
        for _ in range(3):
            endpoint.failed("x")
    assert a.ejected and not b.ejected


def test_repeated_ejections_are_forgotten_after_a_quiet_spell(clock):
    h = make()
    endpoint = h.endpoints[0]
    for _ in range(3):
        h.failed("x")
    endpoint.check_passed()
    clock.now += 26  # longer than max_ejection_seconds
    for _ in range(3):
        h.failed("x")
    assert endpoint.ejected_until == pytest.approx(clock.now + 10)
