"""What a new configuration changes (gateway/reload/plan.py), from settings alone."""

from __future__ import annotations

from gateway.reload.plan import plan
from gateway.settings import load_settings


def fleet(*backends: dict, **sections: object):
    return load_settings(None, backends=list(backends), **sections)


A = {"name": "a", "url": "http://127.0.0.1:1/mcp"}
B = {"name": "b", "url": "http://127.0.0.1:2/mcp"}
C = {"name": "c", "url": "http://127.0.0.1:3/mcp"}


def test_kept_replaced_added_removed_by_value():
    change = plan(fleet(A, B), fleet(A, {**B, "timeout_seconds": 9}, C))
    assert change.kept == {"a"} and change.replaced == {"b"} and change.added == {"c"} and not change.removed
    assert change.changes_fleet and not change.needs_restart
    gone = plan(fleet(A, B), fleet(A, C))
    assert gone.removed == {"b"} and gone.added == {"c"} and gone.kept == {"a"}


def test_the_same_file_changes_nothing():
    change = plan(fleet(A, B), fleet(A, B))
    assert not change.changes_fleet and change.kept == {"a", "b"}
    assert change.summary() == "2 kept"


def test_a_lone_backend_gaining_a_neighbour_is_renamed_not_rebuilt():
    # Alone it has no prefix; beside another it gets "a__": kept (same Backend), renamed.
    change = plan(fleet(A), fleet(A, B))
    assert change.kept == {"a"} and change.renamed == {"a"} and change.added == {"b"}
    assert change.settings.prefix_of(change.settings.backends[0]) == "a__"


def test_settings_outside_backends_need_a_restart_and_keep_their_running_value():
    current = fleet(A, server={"port": 8080, "max_body_bytes": 1000}, auth={"mode": "none"})
    new = fleet(A, B, server={"port": 9090, "max_body_bytes": 1000}, cache={"store": "none"})
    change = plan(current, new)
    assert change.needs_restart == ("server.port", "cache.store")
    # What is swapped in: the new backends over the running server and cache.
    assert change.settings.server.port == 8080 and change.settings.cache.store == current.cache.store
    assert [b.name for b in change.settings.backends] == ["a", "b"]


def test_secret_values_are_never_in_the_plan():
    change = plan(fleet(A, security={"secret": "s3cret-one-that-is-long-enough-0123456789"}),
                  fleet(A, security={"secret": "s3cret-two-that-is-long-enough-0123456789"}))
    assert change.needs_restart == ("security.secret",)
    assert "s3cret" not in repr(change.needs_restart) + change.summary()
