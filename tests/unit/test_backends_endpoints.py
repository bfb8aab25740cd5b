"""backends/endpoints.py: power of two choices over the endpoints in rotation."""

from __future__ import annotations

import collections

from gateway.backends.endpoints import choose
from gateway.backends.health import BackendHealth
from gateway.settings import HealthSettings


def fleet(n: int) -> BackendHealth:
    return BackendHealth("b", HealthSettings(consecutive_failures=1, max_ejected_percent=100),
                         tuple(f"e{i}" for i in range(n)))


def test_the_less_loaded_of_two_wins_and_the_busiest_is_never_chosen():
    h = fleet(3)
    a, b, c = h.endpoints
    a.in_flight, b.in_flight, c.in_flight = 0, 5, 10
    picks = collections.Counter(choose(h.endpoints).label for _ in range(3000))
    assert picks["e2"] == 0  # the busiest loses every pair it is in
    assert picks["e0"] > picks["e1"] > 0


def test_equal_load_spreads_evenly():
    h = fleet(2)
    picks = collections.Counter(choose(h.endpoints).label for _ in range(4000))
    assert abs(picks["e0"] - picks["e1"]) < 400


def test_ejected_and_avoided_endpoints_are_not_chosen():
    h = fleet(3)
    a, b, c = h.endpoints
    a.failed("down")
    assert a.ejected
    assert {choose(h.endpoints, avoid=[b]).label for _ in range(200)} == {"e2"}
    assert choose(h.endpoints, avoid=[b, c]) is None  # a's ejection has time to run


def test_with_all_ejected_one_due_a_trial_is_offered_once():
    h = fleet(2)
    for endpoint in h.endpoints:
        endpoint.failed("down")
    assert h.ejected and choose(h.endpoints) is None
    h.endpoints[0].ejected_until = 1.0  # its time is up
    assert choose(h.endpoints) is h.endpoints[0]
    assert choose(h.endpoints) is None  # the trial is under way


def test_a_caller_may_compare_its_own_load():
    # A legacy session's placement counts sessions, not requests in flight.
    h = fleet(2)
    a, b = h.endpoints
    a.in_flight = 10
    sessions = {a: 0, b: 3}
    assert {choose(h.endpoints, load=sessions.__getitem__).label for _ in range(100)} == {"e0"}


def test_reconcile_adds_with_fresh_health_keeps_the_others_and_drains_the_gone():
    from prometheus_client import REGISTRY

    from gateway.backends.endpoints import HttpTarget, reconcile

    h = BackendHealth("rec", HealthSettings(consecutive_failures=1), ("placeholder",),
                      (HttpTarget("http://svc:80/mcp"),))
    url = "http://svc:80/mcp"
    owns = lambda e: e.target.url == url  # noqa: E731
    assert reconcile(h, {"10.0.0.1:80": HttpTarget(url, "10.0.0.1"), "10.0.0.2:80": HttpTarget(url, "10.0.0.2")}, owns)
    assert [e.label for e in h.endpoints] == ["10.0.0.1:80", "10.0.0.2:80"]
    first, second = h.endpoints
    first.failures = 1  # remembered health survives a re-resolution that keeps the address
    second.in_flight = 1  # a call under way when its address leaves the answer
    value = lambda label: REGISTRY.get_sample_value(  # noqa: E731
        "mcp_gateway_backend_endpoint_up", {"backend": "rec", "endpoint": label})
    assert value("10.0.0.2:80") == 1.0  # in rotation, shown at once
    assert reconcile(h, {"10.0.0.1:80": HttpTarget(url, "10.0.0.1"), "10.0.0.3:80": HttpTarget(url, "10.0.0.3")}, owns)
    assert [e.label for e in h.endpoints] == ["10.0.0.1:80", "10.0.0.3:80"]
    assert h.endpoints[0] is first and first.failures == 1
    assert second.removed and not second.ejected and second.in_flight == 1  # drained, not ejected
    assert value("10.0.0.2:80") is None  # its series is gone
    second.failed("late answer")  # what it reports now changes nothing
    assert value("10.0.0.2:80") is None and h.up is not False
    assert not reconcile(h, {"10.0.0.1:80": HttpTarget(url, "10.0.0.1"), "10.0.0.3:80": HttpTarget(url, "10.0.0.3")},
                         owns)
