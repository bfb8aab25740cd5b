"""gateway/readiness.py: what "ready" requires, from recorded backend states."""

from __future__ import annotations

import pytest

from gateway.readiness import BackendState, BackendStates

OK, FAILING, UNKNOWN = BackendState.OK, BackendState.FAILING, BackendState.UNKNOWN


def states(requirement, *recorded: BackendState) -> BackendStates:
    s = BackendStates([f"b{i}" for i in range(len(recorded))], requirement)
    for i, state in enumerate(recorded):
        s.record(f"b{i}", state, "detail")
    return s


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
    s.record("b1", FAILING, "connect to 10.0.0.7:8000 refused")
    assert s.report() == {"status": "ready", "backends": {"b0": "ok", "b1": "failing"}}


def test_each_recorded_state_is_the_backend_up_gauge():
    """/readyz and mcp_gateway_backend_up read one record: they cannot disagree."""
    from prometheus_client import REGISTRY

    def up(name: str) -> float | None:
        return REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": name})

    s = BackendStates(["readiness-gauge"], "any")
    s.record("readiness-gauge", OK)
    assert up("readiness-gauge") == 1
    s.record("readiness-gauge", FAILING, "connect refused")
    assert up("readiness-gauge") == 0 and not s.ready
    s.record("readiness-gauge", OK)
    assert up("readiness-gauge") == 1 and s.ready


def test_a_reload_keeps_known_names_states_and_forgets_removed_ones():
    from gateway.readiness import BackendState, BackendStates

    states = BackendStates(["a", "b"], "all")
    states.record("a", BackendState.OK)
    states.record("b", BackendState.OK)
    assert states.ready
    states.follow(kept=["a"], fresh=["c"])
    assert states.report()["backends"] == {"a": "ok", "c": "unknown"} and not states.ready


def test_a_backend_a_reload_removed_leaves_the_backend_up_gauge():
    from prometheus_client import REGISTRY

    s = BackendStates(["reload-kept", "reload-gone"], "any")
    s.record("reload-kept", OK)
    s.record("reload-gone", OK)
    s.follow(kept=["reload-kept"], fresh=[])
    assert REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": "reload-gone"}) is None
    assert REGISTRY.get_sample_value("mcp_gateway_backend_up", {"backend": "reload-kept"}) == 1
