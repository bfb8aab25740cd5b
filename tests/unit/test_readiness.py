"""gateway/readiness.py: what "ready" requires, read from the backends' remembered health
(backends/health.py), driven here the way the checks and the calls drive it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from gateway.backends.health import BackendHealth
from gateway.readiness import BackendState, BackendStates
from gateway.settings import HealthSettings

OK, FAILING, UNKNOWN = BackendState.OK, BackendState.FAILING, BackendState.UNKNOWN


def backend(name: str, state: BackendState = UNKNOWN, endpoints: tuple[str, ...] = ("default",)) -> SimpleNamespace:
    """A name and a real BackendHealth brought to `state` by a check of each endpoint."""
    health = BackendHealth(name, HealthSettings(), endpoints)
    for endpoint in health.endpoints:
        if state is OK:
            endpoint.check_passed()
        elif state is FAILING:
            endpoint.check_failed("connect to 10.0.0.7:8000 refused")
    return SimpleNamespace(name=name, health=health)


def states(requirement, *recorded: BackendState) -> BackendStates:
    return BackendStates([backend(f"b{i}", state) for i, state in enumerate(recorded)], requirement)


@pytest.mark.parametrize(("requirement", "recorded", "ready"), [
    ("any", (OK, FAILING, FAILING), True),
    ("any", (FAILING, UNKNOWN), False),
    ("all", (OK, OK), True),
    ("all", (OK, FAILING), False),
    ("all", (OK, UNKNOWN), False),
    ("none", (FAILING, FAILING), True),
    (2, (OK, FAILING, OK), True),
    (2, (OK, FAILING, FAILING), False),
    (5, (OK, OK), True),  # more than there are: all of them
    ("any", (), True),
])
def test_requirement(requirement, recorded, ready):
    assert states(requirement, *recorded).ready is ready


def test_draining_is_never_ready_and_says_so():
    s = states("none", OK)
    s.begin_drain()
    assert not s.ready
    assert s.report() == {"status": "draining", "backends": {"b0": "ok"}}


def test_the_report_holds_names_and_states_only():
    s = states("any", OK, FAILING)
    assert s.report() == {"status": "ready", "backends": {"b0": "ok", "b1": "failing"}}


def test_readiness_follows_the_health_as_checks_and_calls_change_it():
    """No record of its own: an ejection is "failing" at once, a check that passes is "ok"
    again, and the mcp_gateway_backend_up gauge (set by the health) says the same."""
    one = backend("readiness-follows")
    s = BackendStates([one], "any")
    assert s.state("readiness-follows") is UNKNOWN and not s.ready
    (endpoint,) = one.health.endpoints
    endpoint.succeeded()  # a call answered
    assert s.state("readiness-follows") is OK and s.ready
    for _ in range(HealthSettings().consecutive_failures):
        endpoint.failed("timeout")
    assert endpoint.ejected and s.state("readiness-follows") is FAILING and not s.ready
    assert REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": "readiness-follows"}) == 0
    endpoint.check_passed()
    assert s.state("readiness-follows") is OK and s.ready
    assert REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": "readiness-follows"}) == 1


def test_a_backend_of_several_endpoints_is_ok_while_one_is_in_rotation():
    pair = backend("readiness-pair", endpoints=("a", "b"))
    s = BackendStates([pair], "all")
    a, b = pair.health.endpoints
    a.check_passed()
    b.check_failed("refused")
    assert s.state("readiness-pair") is OK and s.ready
    b.check_failed("refused")  # b ejected: a still serves
    assert b.ejected and s.ready


def test_a_reload_reads_the_new_fleet_and_a_replaced_name_keeps_its_state_until_the_new_one_knows():
    a, b = backend("a", OK), backend("b", OK)
    s = BackendStates([a, b], "all")
    assert s.ready
    replaced, c = backend("a"), backend("c")
    s.follow([replaced, c])
    # "a" was replaced by a backend nothing has said of yet: it reads as before; "c" is new.
    assert s.report()["backends"] == {"a": "ok", "c": "unknown"} and not s.ready
    replaced.health.endpoints[0].check_failed("refused")
    assert s.state("a") is FAILING
    # The replaced object's late reports (its drain) no longer count.
    a.health.endpoints[0].check_passed()
    assert s.state("a") is FAILING


def test_a_backend_a_reload_removed_leaves_the_backend_up_gauge():
    kept, gone = backend("reload-kept", OK), backend("reload-gone", OK)
    s = BackendStates([kept, gone], "any")
    s.follow([kept])
    assert REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": "reload-gone"}) is None
    assert REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": "reload-kept"}) == 1
    assert "reload-gone" not in s.report()["backends"]
