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
